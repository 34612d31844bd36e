"""Fixtures for the data tests: tiny corpora in temporary directories and data configs that point at them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf

from minilm.config import DataConfig
from tests.conftest import python_doc


def make_data_cfg(tmp_path: Path, sources: dict, **overrides) -> DictConfig:
    """A read-only ``data`` section with exactly ``sources`` (assigned, not merged: the default embedded source
    is not carried along) and the cache under ``tmp_path``."""
    cfg = OmegaConf.structured(DataConfig)
    cfg.sources = sources
    cfg.cache_dir = str(tmp_path / "cache")
    cfg.tokenizer.vocab_size = 320
    cfg.tokenizer.sample_chars = 200_000
    cfg.num_proc = 1
    cfg.val_fraction = 0.1
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    OmegaConf.set_readonly(cfg, True)
    return cfg


@pytest.fixture
def mixed_dir(tmp_path: Path) -> Path:
    """30 short documents (under 100 tokens) and 8 long ones (well over 512 tokens)."""
    root = tmp_path / "mixed"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        (root / f"short_{i:02d}.py").write_text(python_doc(rng, 1, f"s{i}"))
    for i in range(8):
        (root / f"long_{i:02d}.py").write_text(python_doc(rng, 40 + 10 * i, f"l{i}"))
    return root


@pytest.fixture
def files_cfg(tmp_path: Path, tiny_text_dir: Path):
    """A factory: data config over the tiny_text_dir corpus (files kind) with extra overrides."""

    def make(**overrides) -> DictConfig:
        return make_data_cfg(tmp_path, {"tiny": {"kind": "files", "paths": [f"{tiny_text_dir}/*.py"]}}, **overrides)

    return make
