"""Checkpoint files: atomic, corrupt ones skipped, shape mismatches named; the LR schedule."""

import pytest
import torch

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.training.checkpoint import (
    checkpoint_path,
    latest_good_checkpoint,
    load_weights,
    prune_checkpoints,
    save_weights,
)
from minilm.training.lit_module import AtomicCheckpointIO, lr_lambda


def tiny_model(**kw):
    over = [f"model.{k}={v}" for k, v in {"n_layers": 2, "d_model": 32, "n_heads": 2, **kw}.items()]
    return GPT(load_config(overrides=over).model, 50)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    io = AtomicCheckpointIO()
    for step in (10, 20):
        io.save_checkpoint({"state_dict": {"w": torch.ones(3) * step}}, checkpoint_path(tmp_path, step))
    newest = checkpoint_path(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[:50])  # truncated, as by a crash mid-copy
    messages = []
    assert latest_good_checkpoint(tmp_path, messages.append) == checkpoint_path(tmp_path, 10)
    assert "unreadable" in messages[0] and "falling back to the previous one, step-00000010.ckpt" in messages[0]
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_a_corrupt_only_checkpoint_says_the_phase_starts_over(tmp_path):
    """With no earlier checkpoint the warning promised "the previous checkpoint" all the same, and the phase then
    started from its first step without a word of it."""
    io = AtomicCheckpointIO()
    io.save_checkpoint({"optimizer_states": []}, checkpoint_path(tmp_path, 10))  # no model state
    io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, 20))
    newest = checkpoint_path(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[:50])
    messages = []
    assert latest_good_checkpoint(tmp_path, messages.append) is None
    assert len(messages) == 2 and "previous one, step-00000010.ckpt" in messages[0]
    assert "no model state" in messages[1] and "previous" not in messages[1]
    assert "no earlier checkpoint, so the phase starts from its first step" in messages[1]


def test_prune_keeps_the_last_k(tmp_path):
    io = AtomicCheckpointIO()
    for step in (1, 2, 3, 4):
        io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, step))
    prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003.ckpt", "step-00000004.ckpt"]


def test_prune_deletes_the_temporary_file_of_a_write_killed_midway(tmp_path):
    """A kill during a checkpoint write left `.step-N.ckpt.<pid>.tmp`, as large as a checkpoint, that nothing read
    or deleted: every interruption of a long run during a write cost a checkpoint's size of disk."""
    import os

    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, 1))
    stale = tmp_path / f".step-00000002.ckpt.{os.getpid() + 1}.tmp"
    mine = tmp_path / f".step-00000003.ckpt.{os.getpid()}.tmp"  # this process's write in progress: kept
    stale.write_bytes(b"half a checkpoint")
    mine.write_bytes(b"being written")
    prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name, "step-00000001.ckpt"]


def test_checkpoints_refuse_arbitrary_pickle(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = checkpoint_path(tmp_path, 1)
    torch.save({"state_dict": {}, "x": Evil()}, path)
    assert latest_good_checkpoint(tmp_path, lambda m: None) is None


def test_weights_round_trip_and_shape_mismatch_is_named(tmp_path):
    a, b = tiny_model(), tiny_model()
    save_weights(a, tmp_path / "m.safetensors")
    load_weights(b, tmp_path / "m.safetensors")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    wide = tiny_model(d_model=64)
    with pytest.raises(MinilmError, match=r"blocks\.0\.attn\.wq\.weight.*\(32, 32\).*\(64, 64\)"):
        load_weights(wide, tmp_path / "m.safetensors")


def test_schedule_warmup_then_decay_to_the_floor():
    f = [lr_lambda(s, 10, 100, "cosine", 0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[-1] == pytest.approx(0.1, abs=1e-3)
    assert lr_lambda(50, 0, 100, "linear", 0.0) == pytest.approx(0.5)


def test_schedule_decay_shapes_and_constant():
    """After warmup: cosine follows half a cosine, linear a straight line, both to the floor at ``total``;
    constant stays at the peak; a phase no longer than its warmup never decays."""
    import math

    quarter = 10 + 90 // 4  # a quarter of the way from the end of warmup (10) to total (100)
    progress = (quarter - 10) / 90
    assert lr_lambda(quarter, 10, 100, "cosine", 0.2) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi
                                                                                                       * progress)))
    assert lr_lambda(quarter, 10, 100, "linear", 0.2) == pytest.approx(0.2 + 0.8 * (1 - progress))
    assert lr_lambda(100, 10, 100, "linear", 0.2) == pytest.approx(0.2)
    assert [lr_lambda(s, 10, 100, "constant", 0.2) for s in (10, 50, 99)] == [1.0, 1.0, 1.0]
    assert lr_lambda(4, 10, 100, "constant", 0.2) == pytest.approx(0.5)  # constant still warms up
    assert lr_lambda(10, 10, 10, "cosine", 0.2) == 1.0


def test_prune_with_keep_0_keeps_every_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    for step in (1, 2, 3):
        io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, step))
    prune_checkpoints(tmp_path, 0)
    assert len(list(tmp_path.glob("step-*.ckpt"))) == 3


def test_a_checkpoint_without_model_state_is_skipped(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {}}, checkpoint_path(tmp_path, 1))
    io.save_checkpoint({"optimizer_states": []}, checkpoint_path(tmp_path, 2))
    messages = []
    assert latest_good_checkpoint(tmp_path, messages.append) == checkpoint_path(tmp_path, 1)
    assert "no model state" in messages[0]


def test_weights_load_from_a_lightning_checkpoint_and_from_a_directory(tmp_path):
    """A step checkpoint holds Lightning's state_dict (names prefixed ``model.``); a directory means its
    model.safetensors."""
    a = tiny_model()
    AtomicCheckpointIO().save_checkpoint({"state_dict": {f"model.{k}": v for k, v in a.state_dict().items()}},
                                         checkpoint_path(tmp_path, 5))  # fmt: skip
    save_weights(a, tmp_path / "model.safetensors")
    for source in (checkpoint_path(tmp_path, 5), tmp_path):
        b = tiny_model()
        load_weights(b, source)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values())), source


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    model = tiny_model()
    state = dict(model.state_dict())
    dropped = "blocks.1.attn.wq.weight"
    del state[dropped]
    with pytest.raises(MinilmError, match=rf"{dropped}: missing"):
        load_weights(tiny_model(), dict(state))
    with pytest.raises(MinilmError, match=r"extra\.weight: not in the model"):
        load_weights(tiny_model(), {**model.state_dict(), "extra.weight": torch.zeros(2)})
