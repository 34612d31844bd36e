"""scripts/extension_eval_demo.py: a model its methods cannot apply to is refused before it trains."""

import pytest

from minilm.cli import run_cli
from tests.conftest import load_script, local_data_yaml


def _config(tmp_path, corpus, position: str):
    path = tmp_path / "demo.yaml"
    path.write_text(f"model: {{n_layers: 1, d_model: 32, n_heads: 2, position: {position}}}\n"
                    + local_data_yaml(corpus, tmp_path / "cache"))  # fmt: skip
    return path


@pytest.mark.usefixtures("one_thread")
def test_a_model_without_rope_is_refused_before_training(tiny_text_dir, tmp_path, capsys):
    """Every method of the demo remaps RoPE: on an ALiBi config it trained for minutes, printed the plain row, and
    only then stopped at the first method."""
    demo = load_script("scripts/extension_eval_demo.py")
    argv = ["--config", str(_config(tmp_path, tiny_text_dir, "{name: alibi}")), "--seq-len", "16", "--steps", "2",
            "--batch-size", "2", "--eval-batches", "1"]  # fmt: skip
    assert run_cli(demo.main, demo.parser(), argv) == 2
    out, err = capsys.readouterr()
    assert "needs a RoPE model" in err and "Traceback" not in err
    assert "step " not in out and "held-out loss" not in out  # refused before the first training step


def test_a_factor_that_leaves_nothing_past_the_training_length_is_refused(capsys):
    """--factor 1 trained, then stopped with a ZeroDivisionError traceback: no position past L to score."""
    demo = load_script("scripts/extension_eval_demo.py")
    assert run_cli(demo.main, demo.parser(), ["--factor", "1"]) == 2
    assert "--factor: must be >= 2, got 1" in capsys.readouterr().err


@pytest.mark.usefixtures("one_thread")
def test_a_rope_model_trains_and_reports_every_method(tiny_text_dir, tmp_path, capsys):
    demo = load_script("scripts/extension_eval_demo.py")
    argv = ["--config", str(_config(tmp_path, tiny_text_dir, "{name: rope}")), "--seq-len", "16", "--steps", "2",
            "--batch-size", "2", "--eval-batches", "1"]  # fmt: skip
    assert run_cli(demo.main, demo.parser(), argv) == 0
    out = capsys.readouterr().out
    rows = out.split("positions >= L")[1].strip().splitlines()
    assert len(rows) == len(demo.methods(16, 4)) and rows[0].startswith("extrapolation")


@pytest.mark.parametrize("lr", ["nan", "-1", "inf", "0"])
def test_a_learning_rate_that_cannot_train_is_refused(lr, capsys):
    """--lr nan or -1 stopped with AdamW's ValueError traceback (exit 1); inf trained to NaN losses and 0 left the
    model untrained, each printed as the methods' numbers."""
    demo = load_script("scripts/extension_eval_demo.py")
    assert run_cli(demo.main, demo.parser(), ["--lr", lr]) == 2
    err = capsys.readouterr().err
    assert f"--lr: must be a finite number > 0, got {float(lr)}" in err and "Traceback" not in err
