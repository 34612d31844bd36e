"""How the trainer and the benchmark scripts compile (``train.compile``, ``train.compile_mode``). No Lightning
import, so scripts load it in milliseconds."""

from __future__ import annotations

from typing import Callable, Optional

import torch


def compiled(fn: Callable, train_cfg, dynamic: Optional[bool] = None) -> Callable:
    """``torch.compile(fn)`` in ``train_cfg.compile_mode`` (``"default"`` passes no mode: torch's own default)."""
    mode = train_cfg.compile_mode
    return torch.compile(fn, dynamic=dynamic, mode=None if mode == "default" else mode)
