"""Which step checkpoints a phase keeps when an unreadable one lies beyond the step it resumed from."""

import pytest

from minilm.config import load_config
from minilm.training.checkpoint import checkpoint_path, list_checkpoints, prune_checkpoints
from minilm.training.lit_module import AtomicCheckpointIO, LitGPT
from minilm.training.phases import run_phases
from tests.conftest import local_data_yaml

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 4, steps: 8, val_every: 0, val_batches: 1, log_every: 1, ckpt_every: 3,
        keep_checkpoints: 1}}
optim: {{lr: 0.003, warmup_steps: 1}}
trainer: {{accelerator: cpu}}
"""


def test_prune_deletes_checkpoints_beyond_the_one_written_and_keeps_it(tmp_path):
    """A checkpoint of a later step than the one just written is one the resumed phase skipped as unreadable; as
    the newest by its name it was kept in place of the one just written (keep 1)."""
    io = AtomicCheckpointIO()
    for step in (2, 4):
        io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, step))
    checkpoint_path(tmp_path, 6).write_bytes(b"half a checkpoint")
    prune_checkpoints(tmp_path, 1, written=4)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]
    for step in (1, 2):
        io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, step))
    prune_checkpoints(tmp_path, 0, written=2)  # keep 0 keeps every checkpoint up to the one written
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]


def test_a_resume_past_an_unreadable_checkpoint_keeps_the_checkpoints_it_writes(config_path, tmp_path, monkeypatch):
    """keep_checkpoints 1, the newest checkpoint unreadable: the resumed phase started over (no good one left), and
    each checkpoint it wrote was deleted in favour of the unreadable one; interrupted again, it started over again."""
    run = tmp_path / "run"
    ckpts = run / "train" / "checkpoints"
    end = LitGPT.on_train_batch_end

    def killed_at(step):
        def hook(self, outputs, batch, batch_idx):
            end(self, outputs, batch, batch_idx)
            if self.global_step == step:
                raise KeyboardInterrupt  # as a kill: nothing after it runs
        return hook

    monkeypatch.setattr(LitGPT, "on_train_batch_end", killed_at(7))
    with pytest.raises(KeyboardInterrupt):
        run_phases(load_config(config_path, [f"run.dir={run}"]), log=lambda m: None)
    assert [s for s, _ in list_checkpoints(ckpts)] == [6]
    six = checkpoint_path(ckpts, 6)
    six.write_bytes(six.read_bytes()[:100])  # cut short (a disk that filled up, a copy interrupted)
    monkeypatch.setattr(LitGPT, "on_train_batch_end", killed_at(4))
    with pytest.raises(KeyboardInterrupt):  # starts over (the warning says so), interrupted after its checkpoint at 3
        run_phases(load_config(config_path, [f"run.dir={run}"]), resume=True, log=lambda m: None)
    assert [s for s, _ in list_checkpoints(ckpts)] == [3]
    monkeypatch.setattr(LitGPT, "on_train_batch_end", end)
    said = []
    run_phases(load_config(config_path, [f"run.dir={run}"]), resume=True, log=said.append)
    assert any("resumes at step 3 of " in line and "step-00000003.ckpt" in line for line in said), said


@pytest.fixture
def config_path(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(TINY.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    return path
