"""--resume of a phase interrupted after a checkpoint, with its carry_optimizer changed."""

import json

import pytest

from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.training.lit_module import LitGPT
from minilm.training.phases import run_phases
from tests.conftest import tiny_run_yaml

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture
def config(tmp_path, tiny_text_dir):
    path = tmp_path / "exp.yaml"
    path.write_text(tiny_run_yaml(tiny_text_dir, tmp_path / "cache", ckpt_every=1,
                                phases="short: {}\nlong: {seq_len: 64, steps: 4}\n"))
    return path


@pytest.mark.parametrize("was", [True, False])
def test_resume_refuses_an_interrupted_phase_whose_carry_optimizer_changed(config, tmp_path, monkeypatch, was):
    """The checkpoint's optimizer state continues the moments the phase started with (the previous phase's, or
    fresh ones), whatever the config says now: a carry_optimizer flipped on --resume was ignored, the phase
    finished as it began, and complete.json recorded the new value. It is refused, naming the key and the value
    the phase trained with; with that value the phase continues."""
    run = tmp_path / "run"
    over = [f"run.dir={run}", f"phases.long.carry_optimizer={str(was).lower()}"]
    end = LitGPT.on_train_batch_end

    def killed_at_long_step_2(self, outputs, batch, batch_idx):
        end(self, outputs, batch, batch_idx)
        if self.phase == "long" and self.global_step == 2:
            raise KeyboardInterrupt  # as a kill: nothing after it runs

    monkeypatch.setattr(LitGPT, "on_train_batch_end", killed_at_long_step_2)
    with pytest.raises(KeyboardInterrupt):
        run_phases(load_config(config, over), log=lambda m: None)
    monkeypatch.setattr(LitGPT, "on_train_batch_end", end)
    saved = (run / "config.yaml").read_text()
    flipped = [f"run.dir={run}", f"phases.long.carry_optimizer={str(not was).lower()}"]
    with pytest.raises(MinilmError, match=rf"phase 'long' was interrupted training with phases\.long\.carry_optimizer "
                                          rf"= {str(was).lower()} \(.*step-00000002\.ckpt\), the config now says "
                                          rf"{str(not was).lower()}.*--phase long"):
        run_phases(load_config(config, flipped), resume=True, log=lambda m: None)
    assert (run / "config.yaml").read_text() == saved and not (run / "long" / "complete.json").exists()
    run_phases(load_config(config, over), resume=True, log=lambda m: None)
    assert json.loads((run / "long" / "complete.json").read_text())["carried_optimizer"] is was
