"""The time a phase took, as its last line and complete.json say it, across an interruption."""

import json
import time

import pytest

from minilm.config import load_config
from minilm.training.lit_module import LitGPT
from minilm.training.phases import run_phases
from tests.conftest import tiny_run_yaml

pytestmark = pytest.mark.usefixtures("one_thread")

SLOW = 1.5  # seconds each of the first two steps takes before the interruption


def test_a_resumed_phase_counts_the_seconds_it_trained_before_the_interruption(tmp_path, tiny_text_dir, monkeypatch):
    """complete.json's seconds and the "finished in" line counted the resumed process's time alone: a phase that
    trained an hour, interrupted near its end, 'finished in 2s'."""
    config = tmp_path / "exp.yaml"
    config.write_text(tiny_run_yaml(tiny_text_dir, tmp_path / "cache", ckpt_every=1))
    run = tmp_path / "run"
    start, end = LitGPT.on_train_batch_start, LitGPT.on_train_batch_end

    def slow(self, batch, batch_idx):
        time.sleep(SLOW)
        start(self, batch, batch_idx)

    def killed_at_step_2(self, outputs, batch, batch_idx):
        end(self, outputs, batch, batch_idx)
        if self.global_step == 2:
            raise KeyboardInterrupt  # as a kill after the checkpoint of step 2: nothing after it runs

    monkeypatch.setattr(LitGPT, "on_train_batch_start", slow)
    monkeypatch.setattr(LitGPT, "on_train_batch_end", killed_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        run_phases(load_config(config, [f"run.dir={run}"]), log=lambda m: None)
    monkeypatch.setattr(LitGPT, "on_train_batch_start", start)
    monkeypatch.setattr(LitGPT, "on_train_batch_end", end)
    said = []
    started = time.perf_counter()
    run_phases(load_config(config, [f"run.dir={run}"]), resume=True, log=said.append)
    resumed = time.perf_counter() - started
    seconds = json.loads((run / "train" / "complete.json").read_text())["seconds"]
    assert 2 * SLOW <= seconds <= 2 * SLOW + 60 + resumed  # the two slow steps before it, and the resumed step
    line = next(line for line in said if "finished in" in line)
    assert f"finished in {seconds:.0f}s (" in line and "since --resume" in line, line
