"""Shared fixtures. Tests are CPU-first; keep each one small (CI has 2 cores)."""

import os
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def tiny_text_dir(tmp_path: Path) -> Path:
    """A few dozen small Python-like documents: enough to train a tokenizer and a few steps, in seconds."""
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(40):
        body = "\n".join(
            f"def function_{i}_{j}(x, y={j}):\n    '''Return x plus {j} times y.'''\n    return x + {j} * y\n"
            for j in range(8 + i % 5)
        )
        (root / f"doc_{i:03d}.py").write_text(textwrap.dedent(body))
    return root


@pytest.fixture
def repo() -> Path:
    return REPO
