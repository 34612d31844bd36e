"""Contextual positions: CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's
Important", arXiv:2405.18719).

A key's position is not its index but a count of the keys between it and the query that the query "counts":

    g_ij = σ(q_i·k_j / √Dh),   p_ij = Σ_{t=j..i} g_it   (summed from the query back to j),
    p_ij ← min(p_ij, npos_max − 1),   e[p_ij] interpolated between e[⌊p⌋] and e[⌈p⌉],
    logits_ij += q_i·e[p_ij]   (computed as the per-step table q·E of shape (B, H, T, npos_max), then gathered).

The gates read the *masked* logits (the reference path masks before calling ``score``), so keys a query may not
see get g = 0 and never count — as in the authors' code, where the causal mask is added before the gates.
Because positions are clamped at npos_max − 1, any length runs. The term depends on every key of the row
(a cumulative sum), so there is no per-(b, h, i, j) form: ``score_kind = "full"``, the fp32 reference path.
Convention: the embeddings E ∈ R^{Dh × npos_max} are shared by the heads and zero-initialized (authors' code).
The term q_i·e[p_ij] is added unscaled, as in the paper's listing; the authors' repository (facebookresearch/RAM)
by default adds it before dividing the logits by √Dh, which changes E's effective learning rate only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minilm.positions.base import PositionDims, PositionEncoding


@dataclass
class CopeParams:
    npos_max: int = 64  # number of position embeddings; contextual positions are clamped below it

    def __post_init__(self):
        if self.npos_max < 2:
            raise ValueError(f"npos_max: must be >= 2, got {self.npos_max}")


class Cope(PositionEncoding):
    score_kind = "full"
    no_weight_decay = ("pos_emb",)

    def __init__(self, params: CopeParams, dims: PositionDims):
        super().__init__()
        self.npos_max = params.npos_max
        self.pos_emb = nn.Parameter(torch.zeros(dims.head_dim, params.npos_max))  # (Dh, npos_max)

    def reset_position_parameters(self) -> None:
        nn.init.zeros_(self.pos_emb)

    def score(self, q, k, q_pos, k_pos, logits):
        gates = torch.sigmoid(logits)  # (B, H, T, S); 0 where masked (logits = −inf)
        pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)  # Σ_{t >= j} g_it
        floor = pos.floor()
        w = pos - floor
        table = q.float() @ self.pos_emb.float()  # (B, H, T, npos_max)
        lower = table.gather(-1, floor.long())
        upper = table.gather(-1, pos.ceil().long())
        return upper * w + lower * (1 - w)  # (B, H, T, S)
