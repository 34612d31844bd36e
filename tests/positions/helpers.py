"""Tiny builders shared by the position tests (d_model 32, 2 layers, T <= 64: milliseconds each)."""

import torch

from minilm.config import load_config
from minilm.model import GPT
from minilm.positions import REGISTRY, PositionDims, build_position

V = 61
TRAIN_LEN = 32  # the length the tiny models are "built for"; extrapolation tests run at 2x
# Parameters that make an encoding's bounds bite inside the tiny lengths used here.
SMALL = {
    "learned": ["model.position.max_positions=32"],
    "shaw": ["model.position.max_distance=4"],
    "deberta": ["model.position.max_distance=4"],
    "t5": ["model.position.num_buckets=8", "model.position.max_distance=16"],
    "cope": ["model.position.npos_max=8"],
    "fire": ["model.position.init_L=16.0"],
}
ATTENTION_SIDE = [n for n, e in REGISTRY.items() if e.attention is not None]


def tiny_model(name, *overrides, seed=0, gqa=True):
    cfg = load_config(
        overrides=[
            "model.n_layers=2",
            "model.d_model=32",
            "model.n_heads=4",
            f"model.n_kv_heads={2 if gqa else 4}",
            f"model.position.name={name}",
            *SMALL.get(name, []),
            *overrides,
        ]
    )
    torch.manual_seed(seed)
    model = GPT(cfg.model, V)
    perturb(model, seed)
    return model.eval()


def perturb(module, seed=0, std=0.1):
    """Move every parameter off its initialization (zero-initialized tables such as CoPE's would otherwise make
    a property hold vacuously)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(std * torch.randn(p.shape, generator=g))
    return module


def hook(name, seed=0, n_heads=4, n_kv_heads=2, head_dim=8, **params):
    dims = PositionDims(d_model=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                        n_layers=2, layer=0)  # fmt: skip
    torch.manual_seed(seed)
    return perturb(build_position({"name": name, **params}, dims, "attention"), seed).eval()
