"""Position tests use one intra-op thread: their tensors are tiny, and on a shared 2-core machine a second
thread spends its time waiting (measured: 30 training steps took 1.3 s with one thread, 28 s with two)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
