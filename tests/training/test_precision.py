"""``train.precision: auto`` (minilm/training/precision.py): bf16-mixed on CUDA and on a CPU with AMX, fp32 on other
CPUs; the trainer trains in what it resolves to and the training log says which."""

import pytest
import torch

import minilm.training.precision as precision_module
from minilm.config import load_config
from minilm.model import GPT
from minilm.training import phases
from minilm.training.precision import cpu_has_amx, cpu_precision_note, resolve_precision
from tests.conftest import local_data_yaml

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("amx", [True, False])
def test_auto_is_bf16_on_cuda_and_on_a_cpu_with_amx_and_fp32_elsewhere(amx, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_amx", lambda: amx)
    assert resolve_precision("auto", "cuda") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == ("bf16-mixed" if amx else "32")
    assert resolve_precision("auto", "mps") == "32"
    for given in ("32", "bf16-mixed", "16-mixed"):  # a precision the config names is used as named
        assert resolve_precision(given, "cpu") == resolve_precision(given, "cuda") == given


def test_a_missing_or_failing_amx_probe_means_no_amx(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert cpu_has_amx() is False

    def broken():
        raise RuntimeError("probe changed")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", broken, raising=False)
    assert cpu_has_amx() is False


def test_the_phase_resolves_auto_for_the_device_lightning_trains_on(monkeypatch):
    """trainer.accelerator=cpu on a machine with a GPU trains on the CPU: the CPU's rule, not the GPU's."""
    monkeypatch.setattr(precision_module, "cpu_has_amx", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert phases.precision(load_config(overrides=["trainer.accelerator=cpu"])) == "32-true"
    assert phases.precision(load_config(overrides=["trainer.accelerator=auto"])) == "bf16-mixed"
    assert phases.precision(load_config(overrides=["trainer.accelerator=cpu", "train.precision=bf16-mixed"])) == \
        "bf16-mixed"  # fmt: skip


@pytest.mark.parametrize("amx", [True, False])
def test_bf16_named_for_a_cpu_without_amx_is_kept_with_a_note(amx, monkeypatch):
    """A config may name bf16 on any CPU; without AMX (where it ran 14x slower) the log says so, and only there."""
    monkeypatch.setattr(precision_module, "cpu_has_amx", lambda: amx)
    note = cpu_precision_note("bf16-mixed", "cpu")
    assert ("no AMX" in note and "train.precision auto" in note) if not amx else note == ""
    assert cpu_precision_note("bf16-true", "cpu") == note
    assert cpu_precision_note("32-true", "cpu") == cpu_precision_note("bf16-mixed", "cuda") == ""


CONFIG = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 4, steps: 2, val_every: 0, val_batches: 1, ckpt_every: 0, log_every: 1}}
optim: {{lr: 0.003, warmup_steps: 1}}
trainer: {{accelerator: cpu}}
"""


@pytest.mark.parametrize("amx", [True, False])
def test_training_runs_in_the_precision_auto_resolves_to_and_says_so(amx, tmp_path, tiny_text_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_amx", lambda: amx)
    seen, loss = [], GPT.loss

    def recording_loss(self, *args, **kwargs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return loss(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "loss", recording_loss)
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    lines = []
    phases.run_phases(load_config(path, [f"run.dir={tmp_path / 'run'}"]), log=lines.append)
    expected = torch.bfloat16 if amx else torch.float32
    assert seen and set(seen) == {expected}  # every training and validation step
    model_line = next(line for line in lines if line.startswith("model: "))
    assert model_line.endswith(f"precision {'bf16-mixed' if amx else '32-true'} (train.precision auto)")


def test_the_training_log_notes_bf16_named_for_a_cpu_without_amx(tmp_path, tiny_text_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_amx", lambda: False)
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    lines = []
    cfg = load_config(path, [f"run.dir={tmp_path / 'run'}", "train.precision=bf16-mixed", "train.steps=1"])
    phases.run_phases(cfg, log=lines.append)
    model_line = next(line for line in lines if line.startswith("model: "))
    assert "precision bf16-mixed; this CPU has no AMX" in model_line
