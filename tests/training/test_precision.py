"""``train.precision: auto`` (minilm/training/precision.py): bf16-mixed on CUDA and on a CPU with a bf16 unit (AMX or
AVX512-BF16), fp32 on other CPUs; the trainer trains in what it resolves to and the training log says which, and
why."""

import pytest
import torch

import minilm.training.precision as precision_module
from minilm.config import load_config
from minilm.errors import MinilmError
from minilm.model import GPT
from minilm.training import phases, run_checks
from minilm.training.precision import cpu_bf16_unit, cpu_precision_note, resolve_precision
from tests.conftest import local_data_yaml

pytestmark = pytest.mark.usefixtures("one_thread")


UNITS = ["AMX", "AVX512-BF16", ""]


@pytest.mark.parametrize("unit", UNITS)
def test_auto_is_bf16_on_cuda_and_on_a_cpu_with_a_bf16_unit_and_fp32_elsewhere(unit, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_bf16_unit", lambda: unit)
    assert resolve_precision("auto", "cuda") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == ("bf16-mixed" if unit else "32")
    assert resolve_precision("auto", "mps") == "32"
    for given in ("32", "bf16-mixed", "16-mixed"):  # a precision the config names is used as named
        assert resolve_precision(given, "cpu") == resolve_precision(given, "cuda") == given


@pytest.mark.parametrize("amx, avx512_bf16, unit", [(True, True, "AMX"), (False, True, "AVX512-BF16"),
                                                     (True, False, "AMX"), (False, False, "")])
def test_the_bf16_unit_is_what_torchs_probes_report(amx, avx512_bf16, unit, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    assert cpu_bf16_unit() == unit


def test_missing_or_failing_probes_mean_no_bf16_unit(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert cpu_bf16_unit() == ""

    def broken():
        raise RuntimeError("probe changed")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", broken, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", broken, raising=False)
    assert cpu_bf16_unit() == ""


def test_the_phase_resolves_auto_for_the_device_lightning_trains_on(monkeypatch):
    """trainer.accelerator=cpu on a machine with a GPU trains on the CPU: the CPU's rule, not the GPU's."""
    monkeypatch.setattr(precision_module, "cpu_bf16_unit", lambda: "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert phases.precision(load_config(overrides=["trainer.accelerator=cpu"])) == "32-true"
    assert phases.precision(load_config(overrides=["trainer.accelerator=auto"])) == "bf16-mixed"
    assert phases.precision(load_config(overrides=["trainer.accelerator=cpu", "train.precision=bf16-mixed"])) == \
        "bf16-mixed"  # fmt: skip


@pytest.mark.parametrize("unit", UNITS)
def test_bf16_named_for_a_cpu_without_a_bf16_unit_is_kept_with_a_note(unit, monkeypatch):
    """A config may name bf16 on any CPU; without a bf16 unit (where it ran 14x slower) the log says so, and only
    there."""
    monkeypatch.setattr(precision_module, "cpu_bf16_unit", lambda: unit)
    note = cpu_precision_note("bf16-mixed", "cpu")
    assert note == "" if unit else ("neither AMX nor AVX512-BF16" in note and "train.precision auto" in note)
    assert cpu_precision_note("bf16-true", "cpu") == note
    assert cpu_precision_note("32-true", "cpu") == cpu_precision_note("bf16-mixed", "cuda") == ""


def test_a_precision_lightning_would_replace_on_the_device_is_refused_before_training(tmp_path):
    """16-mixed on a CPU: Lightning trained in bf16-mixed instead, with a warning, while the training log and the
    saved config said 16-mixed. Refused, naming train.precision and what runs, before run.dir is written."""
    cfg = load_config(overrides=["trainer.accelerator=cpu", "train.precision=16-mixed",
                                 f"run.dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(MinilmError, match=r"train\.precision: 16-mixed cannot train on the CPUAccelerator .*"
                                          r"bf16-mixed instead; set train\.precision to auto, 32 or bf16-mixed"):
        run_checks.check_run(cfg, resume=False, data=False)
    assert run_checks.check_trainer(load_config(overrides=["trainer.accelerator=cpu", "train.precision=32"])) == 1


CONFIG = """
model: {{n_layers: 1, d_model: 32, n_heads: 2}}
{data}train: {{seq_len: 32, batch_size: 4, steps: 2, val_every: 0, val_batches: 1, ckpt_every: 0, log_every: 1}}
optim: {{lr: 0.003, warmup_steps: 1}}
trainer: {{accelerator: cpu}}
"""


@pytest.mark.parametrize("unit", UNITS)
def test_training_runs_in_the_precision_auto_resolves_to_and_says_why(unit, tmp_path, tiny_text_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_bf16_unit", lambda: unit)
    seen, loss = [], GPT.loss

    def recording_loss(self, *args, **kwargs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return loss(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "loss", recording_loss)
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    lines = []
    phases.run_phases(load_config(path, [f"run.dir={tmp_path / 'run'}"]), log=lines.append)
    expected = torch.bfloat16 if unit else torch.float32
    assert seen and set(seen) == {expected}  # every training and validation step
    model_line = next(line for line in lines if line.startswith("model: "))
    why = f"this CPU has {unit}" if unit else "no bf16 unit on this CPU"
    assert model_line.endswith(f"precision {'bf16-mixed' if unit else '32-true'} (train.precision auto: {why})")


def test_the_training_log_notes_bf16_named_for_a_cpu_without_a_bf16_unit(tmp_path, tiny_text_dir, monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_bf16_unit", lambda: "")
    path = tmp_path / "exp.yaml"
    path.write_text(CONFIG.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    lines = []
    cfg = load_config(path, [f"run.dir={tmp_path / 'run'}", "train.precision=bf16-mixed", "train.steps=1"])
    phases.run_phases(cfg, log=lines.append)
    model_line = next(line for line in lines if line.startswith("model: "))
    assert "precision bf16-mixed; this CPU has neither AMX nor AVX512-BF16" in model_line
