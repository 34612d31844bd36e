"""Training-free context extension, installed on a trained RoPE model for evaluation and generation.

Each method is an object with ``attend(q, k, v, rotary, q_pos, k_pos, mask) -> (B, H, T, Dh)`` that the
attention block calls in place of rotate + kernel when ``attn.extension`` is set (minilm/model/attention.py):

- q (B, H, T, Dh), k and v (B, Hkv, S, Dh) arrive UNROTATED; ``rotary`` is the layer's ``Rope``;
- q_pos (1 or B, T) and k_pos (1 or B, S) are integer positions; ``mask`` is causal by index (and by document).

The methods that remap positions (ReRoPE, Self-Extend, DCA) use the fact that a RoPE logit depends only on the
difference of the two rotation positions: the logit of query i and key j is <R(a) q_i, R(b) k_j> for positions
(a, b) chosen per region of the (i, j) plane. They compute one logit matrix per region from a few rotated copies of
q and k, pick per (i, j) with the region masks, and take one masked softmax in fp32 (the "merged" form; the
paper implementations do the same with flash attention and a log-sum-exp merge). Regions are defined by position
values, not indices, so KV caches and per-document positions work unchanged.

Conventions (docs/extension.md repeats them):
- the rotary module's own frequencies and attention factor are used, read at the current length
  1 + max(k_pos) — so ``model.position.scaling`` (e.g. a fine-tuned YaRN) stays in effect under every method;
- the relative position of query position m and key position n is m − n;
- layers whose rotary module does not rotate (the NoPE layers of ``nope_every``) get plain attention (the
  remapping is the identity there); ``logn`` still scales their queries.

Registry: ``EXTENSIONS`` (name -> method class); ``install_extension(model, name, **params)`` /
``remove_extension(model)`` / ``extension(model, name, **params)`` (a context manager).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from minilm.errors import ConfigError
from minilm.model.attention import in_query_blocks
from minilm.positions.base import make_params
from minilm.positions.bias import INT64_MAX
from minilm.positions.rope_scaling import parse_scaling, scaled_frequencies, validate_scaling
from minilm.positions.rotary import Rope, apply_rotary, cos_sin_tables, current_length


# --------------------------------------------------------------------------------------------------------------
# shared pieces


def supports(rotary: Any) -> bool:
    """True for a RoPE module (or module class: a registry entry's) whose q/k transform is exactly Rope's (cos/sin
    from ``cos_sin``): subclasses that change ``rotate`` (xPos's decay) are not plain rotations, so the remapping
    would be wrong for them."""
    cls = rotary if isinstance(rotary, type) else type(rotary)
    return issubclass(cls, Rope) and cls.rotate is Rope.rotate


def _rot(x: Tensor, rotary: Rope, positions: Tensor, seq_len: Tensor) -> Tensor:
    """x (B, H, N, Dh) rotated at ``positions`` (1 or B, N) by the layer's own rotary module."""
    if not rotary.rotates:
        return x
    cos, sin = rotary.cos_sin(positions, seq_len)  # (B|1, 1, N, Dr/2), attention factor included
    return apply_rotary(x, cos, sin, rotary.layout)


def _logits(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """fp32 q·kᵀ·scale: q (B, H, T, Dh), k (B, Hkv, S, Dh) -> (B, H, T, S); grouped-query heads shared. fp32 under
    autocast too: autocast would run the matmul in bf16 and round every logit (by ~0.1 at logits of ~30, more than
    the regions' logits differ), where the plain path's flash kernel keeps its scores in fp32."""
    B, H, T, Dh = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qg = q.float().view(B, Hkv, H // Hkv, T, Dh)  # query heads h = g·(H/Hkv) + r share kv head g (repeat_kv)
    with torch.autocast(q.device.type, enabled=False):
        return (qg @ k.float().unsqueeze(2).transpose(-1, -2)).view(B, H, T, S) * scale


def _softmax_attend(logits: Tensor, v: Tensor, mask, dtype: torch.dtype) -> Tensor:
    """Masked softmax over fp32 logits (B, H, T, S), then @ v (B, Hkv, S, Dh) -> (B, H, T, Dh)."""
    B, H, T, S = logits.shape
    Hkv, Dh = v.shape[1], v.shape[-1]
    logits = logits.masked_fill(~mask.dense(T, S, logits.device), float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a fully masked row gives zeros
    with torch.autocast(logits.device.type, enabled=False):  # fp32 probabilities @ v, as the reference attention
        out = probs.view(B, Hkv, H // Hkv, T, S) @ v.float().unsqueeze(2)  # (B, Hkv, H/Hkv, T, Dh)
    return out.view(B, H, T, Dh).to(dtype)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, mask) -> Tensor:
    T, S = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if mask.is_plain_causal and mask.offset == 0 and T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense(T, S, q.device), scale=scale, enable_gqa=gqa)


def _relative(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    return (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).unsqueeze(1)  # (B|1, 1, T, S): m − n


def _required(key: str, value: Optional[int], minimum: int) -> None:
    if value is None:
        raise ValueError(f"{key}: required")
    if value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value}")
    if value > INT64_MAX:  # (rerope's window and dca's chunk_size become positions: a torch RuntimeError traceback)
        raise ValueError(f"{key}: must be at most {INT64_MAX} (2^63 − 1: positions are int64, and these parameters "
                         f"are positions and lengths), got {value}")


class Extension:
    """Base: a method built from its typed parameters; stateless, so one instance serves every layer."""

    name: str = ""
    Params: type = type(None)

    def __init__(self, params: Any):
        self.params = params

    @classmethod
    def from_params(cls, values: Mapping[str, Any], where: str) -> "Extension":
        allowed = [f.name for f in fields(cls.Params)]
        for key in values:
            if key not in allowed:
                raise ConfigError(f"{where}.{key}: unknown parameter; {cls.name} takes: {', '.join(allowed)}")
        return cls(make_params(cls.Params, dict(values), where))

    def check(self, rotary: Any, where: str, encoding: Optional[str] = None) -> None:
        """Raise ConfigError if this method cannot apply to a layer with this position module. ``encoding``: the
        model's model.position.name, which the error names (an absolute encoding's layers hold ``Identity``: the
        message said "this layer's position encoding is Identity" of a learned model)."""
        if not supports(rotary):
            what = f"this model's encoding is {encoding!r}" if encoding else f"this layer's is {type(rotary).__name__}"
            raise ConfigError(f"{where}: {self.name!r} needs a RoPE model (model.position.name: rope); {what}, which "
                              "it cannot remap")  # fmt: skip

    def attend(self, q, k, v, rotary, q_pos, k_pos, mask) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params})"


class _Merged(Extension):
    """A method that picks each logit from one of a few region matrices (``logits``), then takes one masked softmax:
    in blocks of queries, each against the keys up to its last query (``in_query_blocks``: 128 on CPU, elsewhere as
    many as keep a block's fp32 logits within 1 GiB), so no large (B, H, T, S) matrix is whole at once (four of them
    at 8K tokens and 4 heads would be 4 GB). Each row is a function of its own query, and the current length is read
    from all the keys before the blocks."""

    def attend(self, q, k, v, rotary, q_pos, k_pos, mask) -> Tensor:
        n = current_length(k_pos)

        def block(q, k, v, rotary, q_pos, k_pos, mask):
            return _softmax_attend(self.logits(q, k, rotary, q_pos, k_pos, n), v, mask, q.dtype)

        return in_query_blocks(block, q, k, v, rotary, q_pos, k_pos, mask)

    def logits(self, q, k, rotary, q_pos, k_pos, n: Tensor) -> Tensor:
        """fp32 (B, H, T, S) logits for q (B, H, T, Dh) and k (B, Hkv, S, Dh), unrotated, at the length ``n``."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------------------
# log-n scaling


@dataclass
class LognParams:
    train_len: Optional[int] = None  # L_train: the length the model was trained at

    def __post_init__(self):
        _required("train_len", self.train_len, 2)


class LogN(Extension):
    """Log-n attention scaling (Chiang & Cholak 2022, "Overcoming a theoretical limitation of self-attention";
    Su 2021, "从熵不变性看Attention的Scale操作"): the query at position m (the (m+1)-th token, n = m + 1) is scaled by
    max(1, log n / log L_train), so the logits — and the attention entropy — keep their training-time scale as the
    context grows. The temperature multiplies q once (the logits scale by it, not its square) and is 1 up to
    L_train, so at or below the training length this is plain RoPE attention."""

    name = "logn"
    Params = LognParams

    def attend(self, q, k, v, rotary, q_pos, k_pos, mask) -> Tensor:
        n = current_length(k_pos)
        q, k = _rot(logn_scaled(q, q_pos, self.params.train_len), rotary, q_pos, n), _rot(k, rotary, k_pos, n)
        return _sdpa(q, k, v, rotary.softmax_scale(q.shape[-1]), mask)


def logn_scaled(q: Tensor, q_pos: Tensor, train_len: int) -> Tensor:
    """q (B, H, T, Dh) at positions q_pos (B|1, T), each query times max(1, log(m + 1) / log train_len)."""
    scale = (torch.log(q_pos.float() + 1) / math.log(train_len)).clamp(min=1.0)  # (B|1, T)
    return q * scale[:, None, :, None].to(q.dtype)


# --------------------------------------------------------------------------------------------------------------
# ReRoPE


@dataclass
class ReRopeParams:
    window: Optional[int] = None  # w: relative positions below it are kept, the rest become w
    train_len: Optional[int] = None  # with it, every query also scaled as logn's (Su's reference patch); none: off

    def __post_init__(self):
        _required("window", self.window, 1)
        if self.train_len is not None:
            _required("train_len", self.train_len, 2)


class ReRope(_Merged):
    """ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", kexue.fm/archives/9708): relative position
    r = m − n if r < w, else w. Two logit matrices — q at m with k at n, and q at w with k at 0 — merged by the
    mask r < w (as Su's reference implementation does). Su's reference patch (bojone/rerope, rerope_patch.py) also
    multiplies every query by log-n's max(1, log(m+1)/log L_train): with ``train_len`` given, so does this (a model
    holds one method at a time, so ``logn`` cannot be added to it); without, this is ReRoPE alone, and with w >= the
    length plain RoPE."""

    name = "rerope"
    Params = ReRopeParams

    def logits(self, q, k, rotary, q_pos, k_pos, n: Tensor) -> Tensor:
        w, scale = self.params.window, rotary.softmax_scale(q.shape[-1])
        if self.params.train_len is not None:
            q = logn_scaled(q, q_pos, self.params.train_len)
        near = _logits(_rot(q, rotary, q_pos, n), _rot(k, rotary, k_pos, n), scale)  # relative m − n
        far = _logits(
            _rot(q, rotary, torch.full_like(q_pos, w), n), _rot(k, rotary, torch.zeros_like(k_pos), n), scale
        )  # relative w
        return torch.where(_relative(q_pos, k_pos) < w, near, far)  # (B, H, T, S)


# --------------------------------------------------------------------------------------------------------------
# Self-Extend


@dataclass
class SelfExtendParams:
    group_size: Optional[int] = None  # G: positions beyond the window are grouped by floor(p / G)
    window: Optional[int] = None  # w_n: the neighbour window, where relative positions are exact

    def __post_init__(self):
        _required("group_size", self.group_size, 1)
        _required("window", self.window, 1)


class SelfExtend(_Merged):
    """Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning"):
    neighbour attention with exact relative positions r = m − n where r < w_n, grouped attention beyond it with
    query position ⌊m/G⌋ + (w_n − ⌊w_n/G⌋) and key position ⌊n/G⌋, so the grouped relative position
    ⌊m/G⌋ − ⌊n/G⌋ + w_n − ⌊w_n/G⌋ continues from about w_n. (The paper writes the shift as w_n − w_n/G; the
    reference code (datamllab/LongLM, self_extend_patch/Llama.py) uses a true division in its prefill paths and a
    floor division in its flash decoding path, as we do; the two agree whenever G divides w_n — we keep positions
    integral.)
    With G = 1, or w_n >= the length, this is plain RoPE."""

    name = "self_extend"
    Params = SelfExtendParams

    def logits(self, q, k, rotary, q_pos, k_pos, n: Tensor) -> Tensor:
        G, w = self.params.group_size, self.params.window
        scale = rotary.softmax_scale(q.shape[-1])
        neighbour = _logits(_rot(q, rotary, q_pos, n), _rot(k, rotary, k_pos, n), scale)
        gq = torch.div(q_pos, G, rounding_mode="floor") + (w - w // G)
        gk = torch.div(k_pos, G, rounding_mode="floor")
        grouped = _logits(_rot(q, rotary, gq, n), _rot(k, rotary, gk, n), scale)
        return torch.where(_relative(q_pos, k_pos) < w, neighbour, grouped)


# --------------------------------------------------------------------------------------------------------------
# Dual Chunk Attention


@dataclass
class DcaParams:
    chunk_size: Optional[int] = None  # the largest query position used (the reference's chunk_size; ≈ 3/4 L_train)
    local_window: Optional[int] = None  # w: exact relative positions kept across a chunk boundary (≈ L_train/16)

    def __post_init__(self):
        _required("local_window", self.local_window, 0)
        _required("chunk_size", self.chunk_size, 1)
        if self.chunk_size <= self.local_window:
            raise ValueError(f"chunk_size: must be > local_window ({self.local_window}), got {self.chunk_size}")


class DualChunk(_Merged):
    """Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models";
    ChunkLlama's reference code). Positions are cut into chunks of length s = chunk_size − local_window; every key
    sits at n mod s. The query's position depends on how far back the key's chunk is:

    - intra-chunk (same chunk):            m mod s                          -> relative m − n, exact;
    - successive chunk (the one before):   min(s + m mod s, chunk_size)     -> exact while m mod s <= w;
    - inter-chunk (any earlier chunk):     min(2s − 1, chunk_size)          -> a constant query position.

    So no relative position exceeds chunk_size. In the paper's notation s is the chunk size, w the local window and
    c − 1 = s + w the largest query position. With s >= the length (one chunk) this is plain RoPE."""

    name = "dca"
    Params = DcaParams

    def logits(self, q, k, rotary, q_pos, k_pos, n: Tensor) -> Tensor:
        c = self.params.chunk_size
        s = c - self.params.local_window
        scale = rotary.softmax_scale(q.shape[-1])
        inner_q = torch.remainder(q_pos, s)  # (B|1, T)
        k_rot = _rot(k, rotary, torch.remainder(k_pos, s), n)  # keys: one rotation for every region
        intra = _logits(_rot(q, rotary, inner_q, n), k_rot, scale)
        successive = _logits(_rot(q, rotary, (inner_q + s).clamp(max=c), n), k_rot, scale)
        inter = _logits(_rot(q, rotary, torch.full_like(q_pos, min(2 * s - 1, c)), n), k_rot, scale)
        q_chunk, k_chunk = torch.div(q_pos, s, rounding_mode="floor"), torch.div(k_pos, s, rounding_mode="floor")
        back = (q_chunk.unsqueeze(-1) - k_chunk.unsqueeze(-2)).unsqueeze(1)  # (B|1, 1, T, S): chunks back
        return torch.where(back == 0, intra, torch.where(back == 1, successive, inter))


# --------------------------------------------------------------------------------------------------------------
# RoPE scaling at evaluation time (dynamic NTK, dynamic YaRN, or any rope_type) without changing the model


class RopeScaling(Extension):
    """Evaluate with another RoPE scaling block (part 1's ``compute_rope``; e.g. ``rope_type: dynamic`` — dynamic
    NTK — or ``dynamic_yarn``) in place of the model's own, without touching the model: frequencies and attention
    factor come from ``compute_rope(rot_dim, model base, block, seq_len = 1 + max key position)``. The parameters
    are the scaling block itself (transformers' ``rope_parameters`` names)."""

    name = "rope_scaling"

    def __init__(self, scaling: Mapping[str, Any]):
        super().__init__(dict(scaling))
        self._parsed = parse_scaling(self.params)  # (rope_type, typed parameters): parsed once, read per layer

    @classmethod
    def from_params(cls, values: Mapping[str, Any], where: str) -> "RopeScaling":
        if "rope_type" not in values:  # a scaling block's own default (none) would silently drop the model's scaling
            raise ConfigError(f"{where}.rope_type: rope_scaling needs a rope_type (yarn, dynamic, linear, ...; "
                              "default for the plain frequencies)")  # fmt: skip
        try:
            return cls(values)
        except ConfigError as e:
            raise ConfigError(f"{where}.{e}") from None

    def check(self, rotary: Any, where: str, encoding: Optional[str] = None) -> None:
        super().check(rotary, where, encoding)
        validate_scaling(self.params, rotary.rot_dim, where)  # e.g. longrope lists must match the rotary dims
        # which dimensions rotate is fixed by the trained weights: a block whose partial_rotary_factor is not the
        # model's own rotated others (the whole head where the model's scaling rotates half: logits off by ~0.6 on a
        # tiny model, without a word). scripts/evaluate.py takes the model's when the block gives none
        # (minilm.eval.suite); here it must be given
        own, given = rotary.scaling_params.partial_rotary_factor, self._parsed[1].partial_rotary_factor
        if given != own:
            raise ConfigError(f"{where}.partial_rotary_factor: must be the model's own ({own:g}: its "
                              f"model.position.scaling.partial_rotary_factor), got {given:g}"
                              + ("" if "partial_rotary_factor" in self.params else " (the default)")
                              + f": the rotated dimensions are fixed by the weights; give partial_rotary_factor={own:g}")  # fmt: skip

    def _rot(self, x: Tensor, rotary: Rope, positions: Tensor, seq_len: Tensor) -> Tensor:
        if not rotary.rotates:
            return x
        inv_freq, factor = scaled_frequencies(*self._parsed, rotary.rot_dim, rotary.params.base, seq_len)
        cos, sin = cos_sin_tables(positions, inv_freq.to(x.device), factor)
        return apply_rotary(x, cos, sin, rotary.layout)

    def attend(self, q, k, v, rotary, q_pos, k_pos, mask) -> Tensor:
        n = current_length(k_pos)
        q, k = self._rot(q, rotary, q_pos, n), self._rot(k, rotary, k_pos, n)
        return _sdpa(q, k, v, rotary.softmax_scale(q.shape[-1]), mask)


# THE registry of training-free methods: name -> method class (each owns its typed parameter dataclass).
EXTENSIONS: dict[str, type[Extension]] = {
    "logn": LogN,
    "rerope": ReRope,
    "self_extend": SelfExtend,
    "dca": DualChunk,
    "rope_scaling": RopeScaling,
}


def build_extension(name: str, params: Optional[Mapping[str, Any]] = None, where: str = "extension") -> Extension:
    """The method object for ``name`` with ``params``; ConfigError names ``where.name`` / ``where.<key>``."""
    if name not in EXTENSIONS:
        raise ConfigError(f"{where}.name: unknown training-free method {name!r}; available: {', '.join(EXTENSIONS)}")
    return EXTENSIONS[name].from_params(dict(params or {}), f"{where}.{name}")


def _encoding_name(model) -> Optional[str]:
    """The model's model.position.name, where it carries its config (``minilm.model.GPT``)."""
    cfg = getattr(model, "cfg", None)
    position = getattr(cfg, "position", None)
    return position.get("name") if position is not None and hasattr(position, "get") else None


def install_extension(model, name: str, **params) -> Extension:
    """Set ``block.attn.extension`` on every layer of a ``minilm.model.GPT`` to the method ``name`` with
    ``params`` (checked first, so a model is never left half-installed); returns the method object. A model holds
    one method at a time: with one installed, this is refused until ``remove_extension``."""
    # the methods do not combine (each replaces the layer's attention), and a silent swap lost the first one for
    # good: nested `with extension(...)` blocks left the outer block's rest without its method once the inner removed
    installed = sorted({b.attn.extension.name for b in model.blocks if b.attn.extension is not None})
    if installed:
        raise ConfigError(f"extension.{name}: the model already has {', '.join(map(repr, installed))} installed; "
                          "call remove_extension(model) first (one method at a time: each replaces the attention)")
    method = build_extension(name, params)
    encoding = _encoding_name(model)
    for i, block in enumerate(model.blocks):
        method.check(block.attn.pos, f"extension.{name} (layer {i})", encoding)
    for block in model.blocks:
        block.attn.extension = method
    return method


def remove_extension(model) -> None:
    """Back to the model's own attention on every layer."""
    for block in model.blocks:
        block.attn.extension = None


@contextmanager
def extension(model, name: str, **params):
    """``with extension(model, "rerope", window=512): ...`` — installed inside the block, removed after."""
    method = install_extension(model, name, **params)
    try:
        yield method
    finally:
        remove_extension(model)
