"""Fixtures for the evaluation tests: one small prepared corpus (shared by the module), tiny models, a fake
run directory — no training, so the suite's tests run in seconds on CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from minilm.config import Config, save_config
from tests.conftest import python_doc


def make_cfg(cache: Path, corpus_dir: Path, **overrides):
    """A full config over ``corpus_dir`` (files source), tiny model, cache under ``cache``."""
    cfg = OmegaConf.structured(Config)
    cfg.data.sources = {"tiny": {"kind": "files", "paths": [f"{corpus_dir}/*.py"]}}
    cfg.data.cache_dir = str(cache)
    cfg.data.tokenizer.vocab_size = 320
    cfg.data.tokenizer.sample_chars = 200_000
    cfg.data.num_proc = 1
    cfg.data.val_fraction = 0.3
    cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads = 2, 32, 2
    cfg.train.seq_len = 64
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    OmegaConf.set_readonly(cfg, True)
    return cfg


@pytest.fixture(scope="session")
def corpus_setup(tmp_path_factory):
    """(cfg, corpus): 30 documents, a third of them several hundred tokens long; prepared once per session."""
    from minilm.data import load_corpus

    root = tmp_path_factory.mktemp("evalcorpus")
    docs = root / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        (docs / f"doc_{i:02d}.py").write_text(python_doc(rng, 3 if i % 3 else 40, f"f{i}"))
    cfg = make_cfg(root / "cache", docs)
    return cfg, load_corpus(cfg.data, progress=False)


@pytest.fixture
def eval_data(corpus_setup):
    from minilm.eval import EvalData

    _, corpus = corpus_setup
    return EvalData(corpus.tokenizer, corpus.val, "code")


def tiny_gpt(cfg, vocab_size: int, seed: int = 0, **position):
    from minilm.model import GPT

    torch.manual_seed(seed)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    if position:
        model_cfg["position"] = position
    return GPT(OmegaConf.create(model_cfg), vocab_size).eval()


@pytest.fixture
def fake_run(tmp_path, corpus_setup):
    """A run directory as training leaves it (config, tokenizer, final and phase weights), with random weights."""
    from minilm.training.checkpoint import save_weights

    cfg, corpus = corpus_setup
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    save_config(cfg, run / "config.yaml")
    shutil.copyfile(corpus.tokenizer.model_file, run / "tokenizer.model")
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size)
    save_weights(model, run / "train" / "model.safetensors")
    save_weights(model, run / "model.safetensors")
    save_config(cfg, run / "train" / "config.yaml")
    (run / "train" / "complete.json").write_text("{}")  # written last: the phase has finished
    return run


def configure_run(run: Path, **values) -> None:
    """Set dotted keys (``**{"eval.stride": 40}``) in a run's saved configs, its own and its phase's. The fake run's
    weights record no model section, so a changed encoding with the same tensors (rope -> alibi) still loads."""
    for path in (run / "config.yaml", run / "train" / "config.yaml"):
        cfg = OmegaConf.load(path)
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, merge=False)
        path.write_text(OmegaConf.to_yaml(cfg))
