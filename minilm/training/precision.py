"""``train.precision: auto`` resolved: one rule for the trainer (minilm/training/phases.py) and the benchmark
scripts. No Lightning import.

- CUDA: ``bf16-mixed``.
- A CPU with AMX (Intel Xeon from Sapphire Rapids on): ``bf16-mixed`` too. Its tile unit runs bf16 matmuls
  4–8× faster than fp32 ones, and minilm's attention takes its backward in fp32 at the lengths where torch's bf16
  one is slow (``CPU_FP32_BACKWARD_BELOW`` in minilm/model/attention.py). Measured on the 2-core development
  machine (docs/performance.md): the tiny config trains ~1.3–1.4× faster to the same validation loss.
- Any other CPU (AVX2 or AVX-512 without AMX, Arm): ``32``: bf16 there is converted in software around fp32
  arithmetic, and slower: the tiny config's step 14× slower on the 2-core AMD EPYC development machine (AVX2),
  619 against 8,800 tokens/s. A config that names bf16 there gets it, with a note in the training log
  (``cpu_precision_note``).
"""

from __future__ import annotations

import torch


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (the bf16 matrix unit). torch's probe is private: absent or failing, False."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # a probe that changed its signature must not stop training: fp32, the safe answer
        return False


def resolve_precision(precision: str, device_type: str) -> str:
    """``precision`` (``train.precision``, one of minilm.config.PRECISIONS) for a run on ``device_type`` ("cuda",
    "cpu", ...): "auto" resolved by the module docstring's rule, any other value as given."""
    if precision != "auto":
        return precision
    if device_type == "cuda" or (device_type == "cpu" and cpu_has_amx()):
        return "bf16-mixed"
    return "32"


def cpu_precision_note(precision: str, device_type: str) -> str:
    """What the training log adds to its precision where a config names bf16 for a CPU without AMX (the module
    docstring): the choice stands, but it should not cost an order of magnitude silently. Empty otherwise."""
    if device_type != "cpu" or not precision.startswith("bf16") or cpu_has_amx():
        return ""
    return ("; this CPU has no AMX, so bf16 runs in software, ~14x slower than fp32 for the tiny config on an AVX2 "
            "CPU: train.precision auto (fp32 here) trains faster")
