"""Relative encodings whose score term depends on the queries or keys too — Shaw, Transformer-XL, DeBERTa.

The term is a product of q (or k) with an embedding of the relative distance d = i − j = q_pos − k_pos. Both
paths compute it from small per-step tables — q·R for every distance a head can see, shape (B, H, T, N) —
and gather: ``score`` gathers the full (B, H, T, S) term for the fp32 reference path; ``score_mod`` gathers the
same table inside FlexAttention, so no T×S term is built there (``score_kind = "bias"``). Shaw's value term
needs the probabilities, so Shaw with ``values: true`` runs on the reference path (``has_value_term``).

Shapes: q (B, H, T, Dh); k (B, Hkv, S, Dh) — grouped-query keys are repeated to H heads here, as the
attention block repeats them (consecutive query heads share a key head); q_pos (B, T), k_pos (B, S).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minilm.positions.absolute import sinusoid
from minilm.positions.base import PositionDims, PositionEncoding
from minilm.positions.bias import assert_distances_within, relative_distance


def expand_heads(k: Tensor, n_heads: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, H, S, Dh), as ``repeat_kv`` in the attention block."""
    return k if k.shape[1] == n_heads else k.repeat_interleave(n_heads // k.shape[1], dim=1)


def gather_rows(table: Tensor, index: Tensor) -> Tensor:
    """table (B, H, T, N), index (B, 1, T, S) into N -> (B, H, T, S)."""
    return table.gather(-1, index.expand(-1, table.shape[1], -1, -1))


# ---------------------------------------------------------------------------------------------------- Shaw


@dataclass
class ShawParams:
    max_distance: int = 16  # k: distances are clipped to [−k, k]
    values: bool = True  # R^V on the values as in the paper (false: the key term only, which runs on Flex)

    def __post_init__(self):
        if self.max_distance < 1:
            raise ValueError(f"max_distance: must be >= 1, got {self.max_distance}")


class Shaw(PositionEncoding):
    """Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with Relative Position Representations"
    (arXiv:1803.02155): learned R^K, R^V ∈ R^{(2k+1) × Dh} indexed by clip(i − j, −k, k), shared by all heads;
    e_ij = q_i·(k_j + R^K_ij) / √Dh and z_i = Σ_j α_ij (v_j + R^V_ij)."""

    score_kind = "bias"
    no_weight_decay = ("rel_k", "rel_v")  # rel_v is None with values: false

    def __init__(self, params: ShawParams, dims: PositionDims):
        super().__init__()
        self.k = params.max_distance
        self.has_value_term = params.values
        self.rel_k = nn.Parameter(torch.randn(2 * self.k + 1, dims.head_dim) * 0.02)  # (2k+1, Dh)
        self.rel_v = nn.Parameter(torch.randn(2 * self.k + 1, dims.head_dim) * 0.02) if params.values else None

    def index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return relative_distance(q_pos, k_pos).clamp(-self.k, self.k) + self.k  # (B, 1, T, S) into 2k+1

    def table(self, q: Tensor) -> Tensor:
        return (q.float() @ self.rel_k.float().t()) * self.softmax_scale(q.shape[-1])  # (B, H, T, 2k+1)

    def score(self, q, k, q_pos, k_pos, logits):
        return gather_rows(self.table(q), self.index(q_pos, k_pos))  # (B, H, T, S)

    def score_mod(self, q, k, q_pos, k_pos):
        qr, c = self.table(q), self.k

        def shaw(score, b, h, i, j):
            return score + qr[b, h, i, (q_pos[b, i] - k_pos[b, j]).clamp(-c, c) + c]

        return shaw

    def value(self, probs, q_pos, k_pos):
        if self.rel_v is None:
            return None
        B, H, T, S = probs.shape
        index = self.index(q_pos, k_pos).expand(-1, H, -1, -1)
        per_distance = probs.new_zeros(B, H, T, 2 * self.k + 1).scatter_add_(-1, index, probs)  # Σ α per bucket
        return per_distance @ self.rel_v.float()  # (B, H, T, Dh)


# ------------------------------------------------------------------------------------------- Transformer-XL


@dataclass
class TransformerXLParams:
    base: float = 10000.0  # of the sinusoidal R_{i−j}

    def __post_init__(self):
        if self.base <= 1:
            raise ValueError(f"base: must be > 1, got {self.base}")


class TransformerXL(PositionEncoding):
    """Transformer-XL relative attention (Dai et al. 2019, arXiv:1901.02860, §3.3): with R_{i−j} the
    sinusoidal embedding (width d_model) of the distance and a separate W_{K,R},

        A_ij = q_i·k_j (a) + q_i·W_{K,R}R_{i−j} (b) + u·k_j (c) + v·W_{K,R}R_{i−j} (d),

    all scaled by 1/√Dh; u, v are trainable per head, and each layer owns its pair (``untie_r``; the authors'
    code shares one pair across layers by default). This hook adds (b) + (c) + (d); there is no value term.
    The (b)+(d) table covers every distance between the current queries and keys, (B, H, T, N) with
    N ≤ T + S − 1 (the paper's "relative shift" matrix)."""

    score_kind = "bias"
    no_weight_decay = ("u", "v")  # the content and position biases (W_{K,R} is a map, and decays)

    def __init__(self, params: TransformerXLParams, dims: PositionDims):
        super().__init__()
        self.base, self.d_model = params.base, dims.d_model
        self.n_heads, self.head_dim = dims.n_heads, dims.head_dim
        self.w_kr = nn.Linear(dims.d_model, dims.n_heads * dims.head_dim, bias=False)
        self.u = nn.Parameter(torch.randn(dims.n_heads, dims.head_dim) * 0.02)  # (H, Dh)
        self.v = nn.Parameter(torch.randn(dims.n_heads, dims.head_dim) * 0.02)

    def tables(self, q: Tensor, k: Tensor, lo, n: int) -> tuple[Tensor, Tensor]:
        """(b)+(d) for the ``n`` distances lo, lo + 1, …: (B, H, T, n); and (c): (B, H, S)."""
        distances = torch.arange(n, device=q.device) + lo  # (N,)
        r = self.w_kr(sinusoid(distances, self.d_model, self.base).to(self.w_kr.weight.dtype))
        r = r.view(-1, self.n_heads, self.head_dim).float()  # (N, H, Dh): W_{K,R} R_{d}
        scale = self.softmax_scale(q.shape[-1])
        bd = torch.einsum("bhtd,nhd->bhtn", q.float() + self.v.float()[:, None], r) * scale  # (B, H, T, N)
        c = torch.einsum("bhsd,hd->bhs", expand_heads(k, q.shape[1]).float(), self.u.float()) * scale  # (B, H, S)
        return bd, c

    def span(self, q_pos: Tensor, k_pos: Tensor) -> int:
        """n: the tables cover the distances −n … n, n = S − 1 (every distance of positions within [0, S): training,
        the KV cache, restarted documents), fixed by the shapes. Reading the distances present instead was a host
        sync in every layer and, under train.compile, a graph break in every layer (in torch 2.13 the frames it
        left crashed a compiled step after a compiled validation). Positions spread further apart fail an assert
        (``assert_distances_within``; device-side on the GPU) instead of reading a wrong entry."""
        n = max(k_pos.shape[-1] - 1, 0)
        if q_pos.numel() and k_pos.numel():  # (no query or no key: no distance; min() of no positions is an error)
            assert_distances_within(q_pos, k_pos, n, "Transformer-XL")
        return n

    def score(self, q, k, q_pos, k_pos, logits):
        n = self.span(q_pos, k_pos)
        bd, c = self.tables(q, k, -n, 2 * n + 1)
        return gather_rows(bd, relative_distance(q_pos, k_pos) + n) + c.unsqueeze(2)  # (B, H, T, S)

    def score_mod(self, q, k, q_pos, k_pos):
        """The tables of ``score`` (``span``), gathered inside FlexAttention."""
        n = self.span(q_pos, k_pos)
        bd, c = self.tables(q, k, -n, 2 * n + 1)

        def transformer_xl(score, b, h, i, j):
            return score + bd[b, h, i, (q_pos[b, i] - k_pos[b, j]).clamp(-n, n) + n] + c[b, h, j]

        return transformer_xl


# ------------------------------------------------------------------------------------------------- DeBERTa


@dataclass
class DebertaParams:
    max_distance: int = 16  # k: distances are clipped to (−k, k], 2k relative embeddings

    def __post_init__(self):
        if self.max_distance < 1:
            raise ValueError(f"max_distance: must be >= 1, got {self.max_distance}")


class Deberta(PositionEncoding):
    """DeBERTa's disentangled attention (He et al. 2021, arXiv:2006.03654, §3.1):

        A_ij = Q^c_i·K^c_j + Q^c_i·K^r_{δ(i,j)} (c2p) + K^c_j·Q^r_{δ(j,i)} (p2c),   logits = A / √(3·Dh),

    with K^r = P W_{K,r}, Q^r = P W_{Q,r} from relative embeddings P ∈ R^{2k × D}. Convention (the issue's):
    the distance i − j is clipped to (−k, k], δ = clip(i − j, 1 − k, k) + k − 1 ∈ [0, 2k) (the paper's δ clips
    to [−k, k); for a causal decoder the closed side is better spent on the keys before the query). p2c reads
    δ(j, i) as the paper's Algorithm 1 does; the released code and transformers in effect read δ(i, j) there (a
    gather with −r_pos, then a transpose). Each layer owns its P (DeBERTa shares one across layers). W_{Q,r} has
    no bias, as in the paper's equations (the released ``pos_q_proj`` has one: a position-free b·K^c_j term)."""

    score_kind = "bias"
    no_weight_decay = ("rel",)  # P (its projections W_{Q,r}, W_{K,r} are maps, and decay)

    def __init__(self, params: DebertaParams, dims: PositionDims):
        super().__init__()
        self.k = params.max_distance
        self.n_heads, self.head_dim = dims.n_heads, dims.head_dim
        self.rel = nn.Parameter(torch.randn(2 * self.k, dims.d_model) * 0.02)  # P: (2k, D)
        self.w_qr = nn.Linear(dims.d_model, dims.n_heads * dims.head_dim, bias=False)
        self.w_kr = nn.Linear(dims.d_model, dims.n_heads * dims.head_dim, bias=False)

    def softmax_scale(self, head_dim: int) -> float:
        return (3 * head_dim) ** -0.5  # three terms of similar size: keep the logits' variance

    def bucket(self, distance: Tensor) -> Tensor:
        return distance.clamp(1 - self.k, self.k) + self.k - 1

    def tables(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        kr = self.w_kr(self.rel).view(-1, self.n_heads, self.head_dim).float()  # (2k, H, Dh)
        qr = self.w_qr(self.rel).view(-1, self.n_heads, self.head_dim).float()
        scale = self.softmax_scale(q.shape[-1])
        c2p = torch.einsum("bhtd,nhd->bhtn", q.float(), kr) * scale  # (B, H, T, 2k)
        p2c = torch.einsum("bhsd,nhd->bhsn", expand_heads(k, q.shape[1]).float(), qr) * scale  # (B, H, S, 2k)
        return c2p, p2c

    def score(self, q, k, q_pos, k_pos, logits):
        c2p, p2c = self.tables(q, k)
        d = relative_distance(q_pos, k_pos)  # (B, 1, T, S)
        key_side = gather_rows(p2c, self.bucket(-d).transpose(-1, -2)).transpose(-1, -2)  # δ(j, i)
        return gather_rows(c2p, self.bucket(d)) + key_side  # (B, H, T, S)

    def score_mod(self, q, k, q_pos, k_pos):
        c2p, p2c = self.tables(q, k)
        lo, hi, shift = 1 - self.k, self.k, self.k - 1

        def deberta(score, b, h, i, j):
            d = q_pos[b, i] - k_pos[b, j]
            c2p_ij = c2p[b, h, i, d.clamp(lo, hi) + shift]
            p2c_ji = p2c[b, h, j, (-d).clamp(lo, hi) + shift]
            return score + c2p_ij + p2c_ji

        return deberta
