"""What the ranks of a DDP run other than rank 0 decide, in process (no second process): from the one checkpoint
rank 0 writes, and from a run directory rank 0 may be changing while they look."""

import logging
from types import SimpleNamespace

import pytest

from minilm.config import load_config, phase_config
from minilm.data import load_corpus
from minilm.training import phases
from minilm.training.datamodule import PhaseData
from tests.conftest import local_data_yaml

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 2, steps: 4, val_every: 0, val_batches: 1, log_every: 1, ckpt_every: 1}}
optim: {{lr: 0.003, warmup_steps: 1}}
trainer: {{accelerator: cpu}}
"""
TWO_PHASES = ["phases.short.steps=2", "phases.long.steps=2", "phases.long.seq_len=64"]


@pytest.fixture
def config(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    return path


@pytest.fixture
def phase(config):
    cfg = load_config(config, [])
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


def test_a_restarted_phase_is_retrained_by_every_rank_whatever_run_dir_still_holds(config, tmp_path, monkeypatch):
    """--phase long under torchrun / SLURM: every rank starts at once and only rank 0 deletes the old outputs of
    the phases it retrains. Another rank that looked first found 'long' complete (or its old checkpoints) and
    skipped it, while rank 0 waited for it in the DDP setup forever. Here the other rank looks at a run directory
    nobody has cleared: it must train 'long' from its start all the same."""
    run_dir = tmp_path / "run"
    cfg = load_config(config, [*TWO_PHASES, f"run.dir={run_dir}"])
    phases.run_phases(cfg, log=lambda msg: None)
    assert (run_dir / "long" / "checkpoints" / "step-00000001.ckpt").is_file()  # an old checkpoint to ignore too
    monkeypatch.setattr(phases, "is_primary_process", lambda: False)
    said = []
    phases.run_phases(cfg, start_phase="long", log=said.append)
    assert not any("is complete; skipping" in m or "resuming from" in m for m in said), said
    assert any(m.startswith("phase 'long': seq_len 64") for m in said), said


@pytest.mark.parametrize("var", ["NODE_RANK", "GROUP_RANK"])
def test_the_first_process_of_a_second_node_is_not_the_primary_one(monkeypatch, var):
    """Several nodes started by hand (Lightning's MASTER_ADDR / NODE_RANK, no global RANK): the first process of
    node 1 has local rank 0, and took the run lock and wrote run.dir's files as if it were rank 0."""
    for key in ("NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert phases.is_primary_process()
    monkeypatch.setenv(var, "1")
    assert not phases.is_primary_process()
    monkeypatch.setenv(var, "0")
    assert phases.is_primary_process()
