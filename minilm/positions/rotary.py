"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer", arXiv:2104.09864).

Conventions chosen here (implementations differ; docs/positions.md repeats them):

- ``layout: half`` pairs dimension i with i + d/2 (``rotate_half``; GPT-NeoX, LLaMA, Hugging Face transformers);
  ``layout: interleaved`` pairs 2i with 2i + 1 (GPT-J, RoFormer). They are the same rotation up to a fixed
  permutation of the head dimensions.
- ``fraction`` (partial rotary, GPT-NeoX / ChatGLM; transformers' ``partial_rotary_factor``) rotates the first
  ``fraction · head_dim`` dimensions (rounded down to even) and passes the rest through unchanged.
- Frequencies come only from ``compute_rope`` (rope_scaling.py; ``scaled_frequencies`` is its core, for a block
  parsed once). Its attention factor multiplies cos and sin, so
  queries and keys each carry it and the logits scale by its square, as transformers' YaRN does.
- Methods that read the current length (dynamic NTK, dynamic YaRN, LongRoPE) take it as 1 + the largest key
  position, as a 0-d tensor: no host sync, so ``torch.compile`` traces them as one graph for every length.
- ``nope_every: n`` (n > 0) leaves every n-th layer (layers n-1, 2n-1, ...) unrotated: NoPE interleaved with
  RoPE (Yang et al. 2025, "RoPE to NoPE and Back Again", arXiv:2501.18795; Llama 4). 0 rotates every layer.
- xPos (``Xpos``) decays the rotated dimensions only; positions are centered on the middle key position before
  the exponent (as torchscale centers them), so each scale ζ^(±(n − center)/scale_base) stays within half the
  range — the product q·k depends on n − m only, whatever the center. The logit of a *masked* pair (key m after
  query n) carries ζ^(−(m − n)/scale_base) whatever the center, and a kernel that adds its mask to the logits
  (SDPA with a document or KV-cache mask) turns an overflowing one into inf − inf = NaN: so positions may span at
  most about 80·scale_base/ln(1/ζ_0) tokens (32K at the defaults), and ``rotate`` refuses a wider span; a
  scale_base and gamma that leave no room for two positions are refused when the config loads. ζ^(x/scale_base) is
  computed as e^(x·rate), the rate ln ζ/scale_base formed in float64 (``xpos_log_zeta``): ζ itself rounds to 1 or to
  0 at an extreme γ, and ln ζ or x/scale_base leave fp32 at an extreme γ or scale_base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from minilm.errors import ConfigError
from minilm.positions.base import PositionDims, PositionEncoding
from minilm.positions.rope_scaling import (
    LENGTH_DEPENDENT,
    parse_scaling,
    scaled_frequencies,
    validate_scaling,
)

LAYOUTS = ("half", "interleaved")


@dataclass
class RopeParams:
    encoding: ClassVar[str] = "rope"  # the registry name, for messages (not a parameter)
    base: float = 10000.0
    fraction: float = 1.0  # share of each head's dimensions that rotate
    layout: str = "half"  # half | interleaved
    scaling: Optional[Dict[str, Any]] = None  # {rope_type: ..., factor: ..., ...} (transformers' key names)
    nope_every: int = 0  # > 0: every n-th layer is NoPE (no rotation); 0: all layers rotate

    def __post_init__(self):
        if not self.base > 1:  # θ_i = base^(−2i/d): base 1 gives every pair one frequency (and the YaRN ramp
            # divides by ln base); below 1 the "low" frequencies exceed 1 rad per token
            raise ValueError(f"base: must be > 1, got {self.base}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction: must be in (0, 1], got {self.fraction}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")
        if self.nope_every < 0:
            raise ValueError(f"nope_every: must be >= 0, got {self.nope_every}")
        if self.nope_every == 1:  # NoPE under RoPE's name: its base, scaling and phase changes would do nothing
            raise ValueError("nope_every: 1 leaves every layer unrotated; use name: none for that, or 0 (every layer "
                             "rotates) or n >= 2 (layers n-1, 2n-1, ... unrotated)")
        if self.scaling is not None:
            if not isinstance(self.scaling, Mapping):
                raise ValueError(
                    f"scaling: must be a mapping such as {{rope_type: yarn, factor: 4.0, "
                    f"original_max_position_embeddings: 256}}, got {self.scaling!r}"
                )
            self.scaling = dict(self.scaling)

    def check_dims(self, head_dim: int, where: str, n_layers: Optional[int] = None) -> int:
        """The checks that need the model's size (the config validates every phase's block with it; the module
        again when built, with the head size): an even head width where every dimension rotates (fraction 1; the
        pairs rotate together), at least 2 rotating dimensions, a scaling block that fits them
        (longrope's lists have one entry per frequency), and with ``n_layers`` a ``nope_every`` that unrotates a
        layer (past n_layers it unrotated none, a pattern that silently did nothing). Returns the number of rotary
        dimensions."""
        if n_layers is not None and self.nope_every > n_layers:
            n = self.nope_every
            raise ConfigError(f"{where}.nope_every: {n} leaves no layer of the {n_layers} (model.n_layers) unrotated "
                              f"(it unrotates layers {n - 1}, {2 * n - 1}, ... counting from 0); give 2 to "
                              f"{n_layers}, or 0 for none")  # fmt: skip
        if head_dim % 2 and self.fraction == 1:  # (fraction < 1 rotates ⌊fraction · head_dim⌋ rounded down to even)
            raise ConfigError(
                f"{where}.fraction: 1 rotates every dimension of a head, and '{self.encoding}' rotates them in pairs "
                f"(dimension i with i + head_dim/2 in layout half, 2i with 2i + 1 in interleaved), so the head width "
                f"model.d_model / model.n_heads must be even, got {head_dim}; give an even head width, or a "
                f"fraction below 1 (partial rotary: the first ⌊fraction · {head_dim}⌋ dimensions, rounded down to "
                f"even, rotate), or an encoding without rotation"
            )
        rot_dim = rotary_dim(head_dim, self.fraction)
        if rot_dim < 2:  # checked before the scaling block: else its check names the wrong key
            raise ConfigError(
                f"{where}.fraction: {self.fraction} of head_dim {head_dim} rotates {rot_dim} dimensions; it must "
                f"rotate at least 2 (fraction >= {2 / head_dim:.3g}), or use name: none"
            )
        validate_scaling(self.scaling, rot_dim, f"{where}.scaling")
        return rot_dim

    def check(self) -> None:
        """The scaling block's keys and values, when the config is validated (``make_params``), not first when a
        model is built: a bad block in a later phase must stop the run before its first phase trains. (Its checks
        that need head_dim, such as longrope's list lengths, are ``check_dims``.)"""
        try:
            parse_scaling(self.scaling)
        except ConfigError as e:
            raise ValueError(f"scaling.{e}") from None


def rotary_dim(head_dim: int, fraction: float) -> int:
    return int(head_dim * fraction) // 2 * 2


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: Tensor) -> Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Rotate the first cos.shape[-1]·2 dims of x (..., T, Dh); cos/sin (B or 1, 1, T, Dr/2) broadcast over heads
    (and over the batch when the positions are shared: pass (1, T) positions, not batch-expanded ones, so the
    tables are computed once, not B times). In x's dtype, computed in the dtype x and the tables promote to (fp32
    for bf16 q, k and the fp32 tables). On CPU in eager mode one autograd Function (``_Rotary``), where the tables
    need no gradient; elsewhere the composition of torch ops (``rotary_by_ops``), which inductor fuses."""
    if x.device.type == "cpu" and not torch.compiler.is_compiling() and not (cos.requires_grad or sin.requires_grad):
        return _Rotary.apply(x, cos, sin, layout)
    return rotary_by_ops(x, cos, sin, layout)


def rotary_by_ops(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """``apply_rotary`` as a composition of torch ops: what torch.compile traces and CUDA runs, and the path of
    tables with a gradient (the reference of ``_Rotary``)."""
    dr = cos.shape[-1] * 2
    xr = x[..., :dr]
    if layout == "half":
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        xr = xr * cos + rotate_half(xr) * sin
    else:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        xr = xr * cos + rotate_interleaved(xr) * sin
    if dr == x.shape[-1]:
        return xr.to(x.dtype)  # every dimension rotates: no pass-through part to concatenate
    return torch.cat((xr.to(x.dtype), x[..., dr:]), dim=-1)


# In eager mode on CPU each op of the composition is a pass over q or k and a node of the autograd graph with its
# own backward (cat, chunk, neg, mul, add, cast: the rotation was ~8 ms of the tiny config's ~90 ms bf16 step).
# The Function writes the rotation into one buffer and casts once; its backward is the inverse rotation (−sin) of
# the incoming gradient, a rotation being orthogonal (its transpose is its inverse): ~1.6 ms faster per step
# (docs/performance.md). Not compiled (inductor fuses the composition into one kernel) and not on CUDA (measured
# with the composition): there ``rotary_by_ops`` runs.
class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, layout: str):
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        return _rotate_pairs(x, cos, sin, layout, 1.0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate_pairs(grad, cos, sin, ctx.layout, -1.0), None, None, None  # the pass-through part as it came


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str, sign: float) -> Tensor:
    """x with each rotated pair (a, b) turned to (a·cos − b·sin, b·cos + a·sin), or by the inverse rotation (−sin)
    for ``sign`` −1, and its pass-through dims copied; computed in the dtype x and the tables promote to, x first
    converted to it once (an op on mixed dtypes, bf16 x times fp32 tables, runs unvectorized on CPU: ~3x slower),
    into one buffer cast once to x's dtype."""
    dr = cos.shape[-1] * 2
    dtype = torch.promote_types(x.dtype, cos.dtype)
    xc = x.to(dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    (a, b), (out_a, out_b) = _pairs(xc, dr, layout), _pairs(out, dr, layout)
    torch.mul(a, cos, out=out_a).addcmul_(b, sin, value=-sign)
    torch.mul(b, cos, out=out_b).addcmul_(a, sin, value=sign)
    out[..., dr:] = xc[..., dr:]
    return out.to(x.dtype)


def _pairs(t: Tensor, dr: int, layout: str) -> tuple[Tensor, Tensor]:
    """Views of the first and the second dimension of every rotated pair of t: (i, i + dr/2) for ``half``,
    (2i, 2i + 1) for ``interleaved``."""
    if layout == "half":
        return t[..., : dr // 2], t[..., dr // 2 : dr]
    return t[..., 0:dr:2], t[..., 1:dr:2]


def current_length(k_pos: Tensor) -> Tensor:
    """The current length the LENGTH_DEPENDENT types read: 1 + the largest key position, a 0-d tensor (no host sync).
    1 for no keys (an input of zero tokens, which has no score to act on): the largest of no positions is an error
    from torch, where every other encoding gives the empty result."""
    if k_pos.numel() == 0:
        return torch.ones((), dtype=k_pos.dtype, device=k_pos.device)
    return k_pos.amax() + 1


def cos_sin_tables(positions: Tensor, inv_freq: Tensor, factor: float | Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin of positions · θ, times the attention factor: (B|1, 1, T, Dr/2) each, for ``apply_rotary``."""
    angles = positions.unsqueeze(-1).float() * inv_freq  # (B|1, T, Dr/2)
    return (angles.cos() * factor).unsqueeze(1), (angles.sin() * factor).unsqueeze(1)


class Rope(PositionEncoding):
    """q, k rotated by angle position · θ_i; q·k then depends on the offset m − n only."""

    def __init__(self, params: RopeParams, dims: PositionDims):
        super().__init__()
        self.head_dim = dims.head_dim
        self.layer = dims.layer
        self.configure(params)

    def configure(self, params: RopeParams) -> None:
        """(Re)compute the frequencies for new parameters: the only place inv_freq is set (phases call this)."""
        # the rotary dimensions too: a phase may change ``fraction`` (set once in __init__, the phase's new fraction
        # was ignored while the log said it applied)
        self.rot_dim = params.check_dims(self.head_dim, "model.position")
        self.params = params
        self.layout = params.layout
        self.rope_type, self.scaling_params = parse_scaling(params.scaling)  # parsed once, read per forward
        inv_freq, factor = scaled_frequencies(self.rope_type, self.scaling_params, self.rot_dim, params.base)
        old = getattr(self, "inv_freq", None)  # a model already on a device keeps its tables there
        self.register_buffer("inv_freq", inv_freq if old is None else inv_freq.to(old.device), persistent=False)
        self.attention_factor = factor

    def frequencies(self, seq_len: int | Tensor) -> tuple[Tensor, float | Tensor]:
        """(inv_freq, attention factor) at the current length ``seq_len`` (an int, or a 0-d tensor as ``tables``
        passes it); only the LENGTH_DEPENDENT types read it, the others return the configured buffer."""
        if self.rope_type in LENGTH_DEPENDENT:
            inv_freq, factor = scaled_frequencies(
                self.rope_type, self.scaling_params, self.rot_dim, self.params.base, seq_len
            )
            return inv_freq.to(self.inv_freq.device), factor
        return self.inv_freq, self.attention_factor

    def cos_sin(self, positions: Tensor, seq_len: int | Tensor) -> tuple[Tensor, Tensor]:
        return cos_sin_tables(positions, *self.frequencies(seq_len))

    @property
    def rotates(self) -> bool:
        """False on the NoPE layers of a ``nope_every`` pattern."""
        n = self.params.nope_every
        return not (n > 0 and (self.layer + 1) % n == 0)

    def tables(self, q_pos: Tensor, k_pos: Tensor):
        """((cos, sin) of the queries, (cos, sin) of the keys) at the current length; the keys' tables are the
        queries' when ``k_pos is q_pos`` (training: one position tensor for both), so they are computed once."""
        seq_len = current_length(k_pos) if self.rope_type in LENGTH_DEPENDENT else k_pos.shape[-1]  # tensor: no sync
        q_tables = self.cos_sin(q_pos, seq_len)
        return q_tables, q_tables if k_pos is q_pos else self.cos_sin(k_pos, seq_len)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if not self.rotates:
            return q, k
        (cq, sq), (ck, sk) = self.tables(q_pos, k_pos)
        return apply_rotary(q, cq, sq, self.layout), apply_rotary(k, ck, sk, self.layout)


# How far a decay exponent may reach: a masked pair's logit factor ζ^(−span/scale_base) stays below e^80, which leaves
# fp32's e^88 room for the q and k values it multiplies (the module docstring)
XPOS_EXP_RANGE = 80.0


def xpos_log_zeta(d: int, gamma: float, device=None) -> Tensor:
    """ln ζ_i for the d rotated dimensions (d/2 values, float64), ζ_i = (2i/d + γ)/(1 + γ). From the logarithm, not
    ζ: ζ rounds to 1 for a large γ (fp32 from γ ≈ 3e7, float64 from 1e16: no decay, and a span limit divided by
    ln 1 = 0) and to 0 in fp32 for a tiny one (γ below 1e-45: 0^(−x) = inf, NaN scores); ln ζ is finite for every
    γ > 0. 1 − ζ_i = (1 − 2i/d)/(1 + γ) is computed as that, so ln ζ = log1p(−(1 − ζ)) keeps the digits ζ near 1
    would round away; the plain log where ζ is small (log1p(−1 + tiny) would lose them there instead)."""
    i = torch.arange(0, d, 2, dtype=torch.float64, device=device) / d
    gap = (1 - i) / (1 + gamma)  # 1 − ζ_i
    return torch.where(gap < 0.5, torch.log1p(-gap), torch.log((i + gamma) / (1 + gamma)))


def _round_up(x: float, digits: int = 3) -> float:
    """x rounded up to ``digits`` significant digits: a printed lower bound that is itself allowed."""
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / unit) * unit


@dataclass
class XposParams(RopeParams):
    encoding: ClassVar[str] = "xpos"
    gamma: float = 0.4  # ζ_i = (2i/d + γ) / (1 + γ): per-dimension decay base, in (0, 1)
    scale_base: float = 512.0  # the exponent is position / scale_base

    def __post_init__(self):
        super().__post_init__()
        if self.gamma <= 0:
            raise ValueError(f"gamma: must be > 0, got {self.gamma}")
        if self.scale_base <= 0:
            raise ValueError(f"scale_base: must be > 0, got {self.scale_base}")
        span = self.max_span()
        if span is not None and span < 1:  # not even two neighbouring tokens: the scores of any two are NaN
            raise ValueError(
                f"scale_base: {self.scale_base:g} with gamma {self.gamma:g} fits no two positions: xPos's decay "
                f"ζ_0^(distance/scale_base) leaves fp32's range within one token (ζ_0 = gamma/(1 + gamma)); give "
                f"scale_base >= {_round_up(self.min_scale_base()):g}, or a larger gamma"
            )

    def log_inv_zeta0(self) -> float:
        """ln(1/ζ_0) > 0: the decay exponent per scale_base of distance, the largest of the dimension pairs (ζ_0,
        of pair 0, is the smallest ζ whatever the head size: γ/(1 + γ))."""
        return -float(xpos_log_zeta(2, self.gamma, "cpu")[0])  # a number: on the CPU even where the model is built
        # on the meta device (minilm.training.memory counts its parameters so)

    def max_span(self) -> Optional[int]:
        """The widest span of positions whose decay stays within fp32 (``XPOS_EXP_RANGE``); None where no int64
        position span can reach it (a huge scale_base or gamma: the decay is ~1 at every distance)."""
        span = XPOS_EXP_RANGE * self.scale_base / self.log_inv_zeta0()  # (inf past float64: None too)
        return int(span) if span < torch.iinfo(torch.int64).max else None

    def min_scale_base(self) -> float:
        """The scale_base at which positions one token apart fit (``max_span`` 1), at this gamma."""
        return self.log_inv_zeta0() / XPOS_EXP_RANGE


class Xpos(Rope):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554): RoPE whose rotated
    dimension pair i is also scaled by ζ_i^(n/scale_base) on queries and ζ_i^(−m/scale_base) on keys, with
    ζ_i = (2i/d + γ)/(1 + γ) < 1, so q_n·k_m carries the decay ζ^((n−m)/scale_base) and depends on n − m only."""

    length_keys = ("scale_base", "gamma")  # max_length() grows with both (``XposParams.max_span``)

    def configure(self, params: XposParams) -> None:
        super().configure(params)
        # d: the dimensions that really rotate, one ζ per frequency — fewer than rot_dim when the scaling block
        # sets partial_rotary_factor (its rule is applied inside compute_rope)
        d = 2 * self.inv_freq.shape[0]
        # ζ^(n/scale_base) is computed as e^(n · rate), rate = ln ζ / scale_base formed in float64 (xpos_log_zeta):
        # in fp32, ln ζ rounds to 0 past γ ≈ 1e45, a scale_base below 1e-45 to 0, and n/scale_base overflows for a
        # tiny one (γ 1e37, scale_base 1.3e-38: NaN scores within max_length), while |n · rate| <= 80 within it
        rate = xpos_log_zeta(d, params.gamma) / params.scale_base  # (Dr/2,)
        self.register_buffer("decay_rate", rate.float().to(self.inv_freq.device), persistent=False)
        # A masked pair (key m after query n) has the logit factor ζ^(−(m − n)/scale_base) whatever the center: SDPA
        # with a dense mask computes it and adds −inf, so once it overflows fp32 (e^88, with room for the q and k
        # values it multiplies) that row is NaN. Positions may therefore span at most max_span, which also keeps
        # every single scale (centered) within e^±40; ``rotate`` refuses a wider span. None: no limit.
        self.max_span = params.max_span()

    def max_length(self) -> Optional[int]:
        """Positions 0..L−1 span L − 1 <= max_span: the evaluation suite, generation and the phases read this
        instead of meeting ``rotate``'s error."""
        return None if self.max_span is None else self.max_span + 1

    def decay(self, positions: Tensor, center: Tensor, sign: float) -> Tensor:
        offset = sign * (positions - center).unsqueeze(-1).float()  # (B, T, 1)
        return torch.exp(offset * self.decay_rate).unsqueeze(1)  # (B, 1, T, Dr/2): ζ^(offset/scale_base)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if not self.rotates or q_pos.shape[-1] == 0 or k_pos.shape[-1] == 0:
            return q, k  # (no query or no key: no score to act on, and the center and span have no positions to read)
        center = (k_pos.amin(-1, keepdim=True) + k_pos.amax(-1, keepdim=True)) // 2  # (B, 1)
        if self.max_span is not None:
            self._check_span(q_pos, k_pos)
        (cq, sq), (ck, sk) = self.tables(q_pos, k_pos)
        up, down = self.decay(q_pos, center, 1.0), self.decay(k_pos, center, -1.0)
        q = apply_rotary(q, cq * up, sq * up, self.layout)  # queries scaled up: ζ^(n/scale_base)
        return q, apply_rotary(k, ck * down, sk * down, self.layout)  # keys down: ζ^(−m/scale_base)

    def _check_span(self, q_pos: Tensor, k_pos: Tensor) -> None:
        # per row (rows may sit at different positions): (B|1,) each, broadcast
        span = (torch.maximum(q_pos.amax(-1), k_pos.amax(-1)) - torch.minimum(q_pos.amin(-1), k_pos.amin(-1))).amax()
        torch._assert_async(  # no host sync; a device-side assert on the GPU
            span <= self.max_span,
            f"xpos: positions span more than {self.max_span}, where the decay ζ^(distance/scale_base) of a masked "
            f"pair leaves fp32's range (the scores would be NaN); inputs up to {self.max_span + 1} tokens fit: raise "
            f"model.position.scale_base (now {self.params.scale_base:g}) or gamma (now {self.params.gamma:g})",
        )


@dataclass
class NoParams:
    pass


class NoPE(PositionEncoding):
    """No positional encoding (NoPE; Kazemnejad et al. 2023): causal masking alone carries order."""

    def __init__(self, params: NoParams, dims: PositionDims):
        super().__init__()
