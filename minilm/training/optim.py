"""The optimizer the trainer and the benchmark share: AdamW, weight decay on matrices only (not on position tables),
the fused kernel wherever torch has one for the parameters' device. No Lightning import, so scripts load it in
milliseconds."""

from __future__ import annotations

import torch
from torch import nn

from minilm.errors import MinilmError
from minilm.positions.base import PositionEncoding

FUSED_DEVICES = ("cuda", "cpu")  # torch.optim.AdamW(fused=True) kernels used here (measured: CPU 0.6 vs 2.1 ms/step)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (the token embeddings, which are also the LM head, and linear weights); none on
    norms, biases, scalars, nor on what a position encoding names in ``no_weight_decay``: its position tables and
    relative biases, which are embeddings and biases whatever their shape (docs/positions.md, "Weight decay")."""
    exempt = {
        id(getattr(m, name))
        for m in model.modules()
        if isinstance(m, PositionEncoding)
        for name in m.no_weight_decay
        if getattr(m, name) is not None  # Shaw's R^V with values: false
    }
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and id(p) not in exempt else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def param_names(model: nn.Module, groups: list[dict]) -> list[str]:
    """The names of the parameters of ``groups`` (``param_groups``' or an optimizer's), in the optimizer's order: its
    saved state is indexed by that order, so moments saved under one grouping belong to other parameters under
    another (``check_optimizer_params``)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in groups for p in g["params"]]


def check_optimizer_params(saved: dict, model: nn.Module, weight_decay: float, what: str, remedy: str = "") -> None:
    """Saved optimizer state (``what``) must be of this model's parameters in this order. ``saved``: the names it
    recorded (``names``), else what an older file shows of its order: its param groups' ``sizes`` (a Lightning
    checkpoint) or the ``shapes`` of its moments by index (optimizer.pt). Moments saved under another grouping (an
    older minilm decayed the position tables) would load onto other parameters. ``remedy``: what to do instead."""
    groups = param_groups(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    first = ""
    if saved.get("names") is not None:
        now = param_names(model, groups)
        same = saved["names"] == now
        i = next((i for i, (a, b) in enumerate(zip(saved["names"], now)) if a != b), min(len(now), len(saved["names"])))
        first = f" (its parameter {i} is {(saved['names'] + ['none'])[i]}, this model's {(now + ['none'])[i]})"
    elif saved.get("sizes") is not None:
        same = saved["sizes"] == [len(g["params"]) for g in groups]
    else:
        same = all(i < len(params) and tuple(params[i].shape) == tuple(shape) for i, shape in saved["shapes"].items())
    if not same:
        raise MinilmError(f"{what} holds the optimizer state of other parameters than this model's, or in another "
                          f"order{first} (written by an older minilm, which grouped them for weight decay otherwise?),"
                          " so its moments would belong to other parameters"
                          + (f"; {remedy}" if remedy else ""))  # fmt: skip


def make_adamw(model: nn.Module, optim_cfg) -> torch.optim.AdamW:
    """AdamW from the ``optim`` section (lr, betas, eps, weight_decay); fused when every parameter sits on one
    device type that has the fused kernel, torch's default (foreach) otherwise."""
    devices = {p.device.type for p in model.parameters()}
    fused = len(devices) == 1 and devices.pop() in FUSED_DEVICES
    o = optim_cfg
    return torch.optim.AdamW(
        param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused or None
    )
