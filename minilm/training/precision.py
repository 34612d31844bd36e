"""``train.precision: auto`` resolved: one rule for the trainer (minilm/training/phases.py) and the benchmark
scripts; ``precision``, a phase's as Lightning names it, for the trainer and its checks (run_checks.py). No Lightning
import.

- CUDA: ``bf16-mixed``.
- A CPU with bf16 matrix hardware: ``bf16-mixed`` too. Two kinds, as torch's probes report them:
  - AMX (Intel Xeon from Sapphire Rapids on): its tile unit runs bf16 matmuls 4–8× faster than fp32 ones;
  - AVX512-BF16 (AMD EPYC from Zen 4 on, Intel Cooper Lake): its dot-product instruction runs them ~2.4× faster.
  minilm's attention takes its backward in fp32 at the lengths where torch's bf16 one is slow
  (``CPU_FP32_BACKWARD_BELOW`` in minilm/model/attention.py). Measured on 2-core development machines
  (docs/performance.md), the tiny config trains 1.3–1.4× faster than in fp32 to the same validation loss on both
  kinds.
- Any other CPU (AVX2, AVX-512 without BF16, Arm): ``32``: bf16 there is converted in software around fp32
  arithmetic, and slower: the tiny config's step 14× slower on a 2-core AMD EPYC with AVX2 only, 619 against 8,800
  tokens/s. A config that names bf16 there gets it, with a note in the training log (``cpu_precision_note``).
"""

from __future__ import annotations

import torch

# (name in the training log, torch's private probe), the faster unit first
_BF16_UNITS = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))


def _probe(name: str) -> bool:
    """torch.cpu's private probe ``name``: absent or failing, False (fp32, the safe answer: a probe that changed must
    not stop training)."""
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:
        return False


def cpu_bf16_unit() -> str:
    """This CPU's bf16 matrix hardware: "AMX", "AVX512-BF16", or "" where it has none (the module docstring)."""
    return next((unit for unit, probe in _BF16_UNITS if _probe(probe)), "")


def resolve_precision(precision: str, device_type: str) -> str:
    """``precision`` (``train.precision``, one of minilm.config.PRECISIONS) for a run on ``device_type`` ("cuda",
    "cpu", ...): "auto" resolved by the module docstring's rule, any other value as given."""
    if precision != "auto":
        return precision
    if device_type == "cuda" or (device_type == "cpu" and cpu_bf16_unit()):
        return "bf16-mixed"
    return "32"


def precision(pcfg) -> str:
    """Lightning's name for the phase's ``train.precision``, "auto" resolved for the device Lightning will pick
    (``resolve_precision``)."""
    p = resolve_precision(pcfg.train.precision, trainer_device(pcfg))
    return "32-true" if p == "32" else p


def trainer_device(pcfg) -> str:
    """"cuda" or "cpu": the device Lightning will train on; "" for another accelerator (no rule of ours)."""
    accelerator = pcfg.trainer.accelerator
    gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    return "cuda" if gpu else "cpu" if accelerator in ("auto", "cpu") else ""


def auto_precision_note(device_type: str) -> str:
    """The training log's word on what ``auto`` resolved from: on a CPU, its bf16 unit or that it has none."""
    if device_type != "cpu":
        return " (train.precision auto)"
    unit = cpu_bf16_unit()
    return f" (train.precision auto: {f'this CPU has {unit}' if unit else 'no bf16 unit on this CPU'})"


def cpu_precision_note(precision: str, device_type: str) -> str:
    """What the training log adds to its precision where a config names bf16 for a CPU without a bf16 unit (the
    module docstring): the choice stands, but it should not cost an order of magnitude silently. Empty otherwise."""
    if device_type != "cpu" or not precision.startswith("bf16") or cpu_bf16_unit():
        return ""
    return ("; this CPU has neither AMX nor AVX512-BF16, so bf16 runs in software, ~14x slower than fp32 for the tiny "
            "config on an AVX2 CPU: train.precision auto (fp32 here) trains faster")
