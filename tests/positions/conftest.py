"""Position tests use one intra-op thread: their tensors are tiny, and on a shared 2-core machine a second
thread spends its time waiting (measured: 30 training steps took 1.3 s with one thread, 28 s with two)."""

import pytest


@pytest.fixture(autouse=True)
def _positions_use_one_thread(one_thread):
    """Every test of this package runs with ``one_thread`` (tests/conftest.py)."""
