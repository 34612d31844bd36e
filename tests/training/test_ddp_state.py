"""What the ranks of a DDP run read from the one checkpoint rank 0 writes, in process (no second process)."""

import logging
from types import SimpleNamespace

import pytest

from minilm.config import load_config, phase_config
from minilm.data import load_corpus
from minilm.training.datamodule import PhaseData
from tests.conftest import local_data_yaml

CONFIG = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 2, steps: 4}}
"""


@pytest.fixture
def phase(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    cfg = load_config(path, [])
    return load_corpus(cfg.data), phase_config(cfg, "train")


def data_on(corpus, pcfg, rank: int, world_size: int) -> PhaseData:
    data = PhaseData(corpus, pcfg, "train")
    data.trainer = SimpleNamespace(global_rank=rank, world_size=world_size)  # what PhaseData reads of its trainer
    return data


def test_every_rank_resumes_from_rank_zeros_checkpoint_without_a_warning(phase, caplog):
    """Rank 0 writes the checkpoint (its sampler state says rank 0); rank 1 warned on every exact DDP resume that
    its batches "differ from the original run from here on"."""
    corpus, pcfg = phase
    saved = data_on(corpus, pcfg, 0, 2).state_dict()
    with caplog.at_level(logging.WARNING):
        data_on(corpus, pcfg, 1, 2).load_state_dict(saved)
    assert "differ" not in caplog.text


def test_resuming_on_another_device_count_still_warns(phase, caplog):
    corpus, pcfg = phase
    saved = data_on(corpus, pcfg, 0, 2).state_dict()
    with caplog.at_level(logging.WARNING):
        data_on(corpus, pcfg, 0, 1).load_state_dict(saved)
    assert "batches differ from the original run" in caplog.text
