"""The position hooks every encoding implements, and the helpers that build their typed parameter objects.

An encoding acts at one or more of three places; the attention block and the model call all of them without
asking which encoding they have (docs/architecture.md, "Positions: three hooks"):

- ``embed(x, positions, doc_ids)``   token embeddings (absolute encodings); identity by default;
- ``rotate(q, k, q_pos, k_pos)``     queries and keys (the rotary family); identity by default;
- a score term                        ``score(...)`` added to the attention logits, ``value(...)`` added to the
                                      output (relative and contextual encodings); none by default.

``score_kind`` declares what the score term needs, and so which kernel the attention block may use:

- ``"none"``  no score term: ``scaled_dot_product_attention``;
- ``"bias"``  a term of (h, i, j) only, or gathered per (b, h, i, j) from small per-step tables; ``score`` must
              not read ``logits``: FlexAttention ``score_mod`` on CUDA (``score_mod()`` returns it), elsewhere
              SDPA with ``score(...)`` as its float mask;
- ``"full"``  needs the whole logit / probability matrix (CoPE, Shaw's value term): the fp32 reference path.

Shapes: x (B, T, D); q (B, H, T, Dh); k (B, Hkv, S, Dh); q_pos (B, T) and k_pos (B, S) integer positions, which
carry their own values so KV caches, per-document restarts and remapped positions fit the same hooks. ``rotate``
alone receives them as given — (1, T) when the batch shares them, and ``k_pos is q_pos`` when the keys are the
queries — so rotary tables are computed once per layer rather than once per row and once each for q and k.
``score`` receives them as given too when the encoding declares ``score_reads_qk = False`` (its term depends on
positions and parameters only, never on q or k) and the attention block runs SDPA with the bias as mask: a
batch sharing its positions then shares one (1, H, T, S) bias instead of building B equal ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Mapping, Optional

import torch
from torch import Tensor, nn

from minilm.errors import ConfigError


# fp32's range, where the encodings compute: the largest finite number, and −ln of the smallest normal one (a
# softmax weight e^−87.3 below the largest is no longer a normal number; GPU kernels flush it to 0). Parameter
# checks bound their values with these.
FP32_MAX = torch.finfo(torch.float32).max  # 3.4e38
FP32_TINY = torch.finfo(torch.float32).tiny  # 1.2e-38
FP32_LOG_TINY = -math.log(FP32_TINY)  # 87.3
FP32_POSITIONS = 2**24  # the positions fp32 counts exactly: the longest length the checks consider


def check_in_fp32(key: str, value: float, at_most: float = FP32_MAX, why: str = "fp32's largest number") -> None:
    """Refuse a parameter that must be > 0 and that the encoding uses in fp32 where fp32 cannot hold it: below fp32's
    smallest normal number ("> 0" passed 1e-50, which is 0 in fp32 — or a subnormal, which GPU kernels flush to 0 —
    and then divided by zero or switched the encoding off), or above ``at_most``: fp32's largest number, or a
    tighter bound, which ``why`` explains. Raises ValueError("key: why") for ``make_params``; a bound is printed
    rounded toward the allowed side, so the number printed is itself allowed."""
    if not value > 0:
        raise ValueError(f"{key}: must be > 0, got {value}")
    if value < FP32_TINY:
        raise ValueError(f"{key}: must be at least {FP32_TINY:.3g} (fp32's smallest normal number: the encoding uses "
                         f"it in fp32, where a smaller one is 0 or flushed to 0), got {value:g}")
    if value > at_most:
        raise ValueError(f"{key}: must be at most {_round_down(at_most):g} ({why}), got {value:g}")


def _round_down(x: float, digits: int = 3) -> float:
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.floor(x / unit) * unit


@dataclass(frozen=True)
class PositionDims:
    """What an encoding may need to know about the model it sits in."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    layer: int = 0  # which block this instance serves (-1 for the embedding-side instance)
    init_std: float = 0.02  # model.init_std, the token embeddings' size: an added table's default is of that size


# FlexAttention's kernel blocks for a score_mod too heavy for inductor's default ones. On an H100 (torch 2.11,
# bf16, head size 64) the forward kernel's default is 128 x 128 queries x keys, 3 stages, and with FIRE's score_mod
# it asked for 409,600 bytes of shared memory (T5's near part, ``T5Bias.flex_split``, 247,808) where the GPU has
# 232,448: "No valid triton configs. OutOfMemoryError: out of resource", at the first compiled call. Smaller blocks
# are the remedy PyTorch's maintainers give (pytorch/pytorch#133254): 64 x 64 forward, and the backward's blocks
# halved from the H100 default (64 x 128, 128 x 64). The prefixes (torch >= 2.6) keep each pass's keys apart. Passed
# on CUDA from 128 queries up (``minilm.model.flex.FLEX_DECODING_QUERIES``: fewer take inductor's decoding kernel).
SMALL_FLEX_BLOCKS = {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64,
                     "bwd_BLOCK_N2": 32}  # fmt: skip


@dataclass
class FlexPart:
    """One part of the keys a score term's FlexAttention may be split into (``PositionEncoding.flex_parts``;
    ``minilm.model.flex.flex_attention_in_parts`` runs and merges them): the keys ``keep(b, h, i, j)`` allows among
    those the mask allows, the ``score_mod`` there (None: the plain score), and ``shift``, None or (H,): a bias
    constant over the part, added to its log-sum-exp outside the kernel rather than to each score inside it (exact:
    a constant within a part does not change its softmax), so its gradient takes no atomic add."""

    keep: Callable
    score_mod: Optional[Callable] = None
    shift: Optional[Tensor] = None


@dataclass
class FlexCoefficients:
    """A bias with a few learned coefficients whose gradients come from extra FlexAttention forwards in backward,
    not from the kernel's atomic adds (``PositionEncoding.flex_coefficients``; run by
    ``minilm.model.flex.flex_attention_with_coefficient_grads``). ``score_mod`` adds the bias from the coefficients
    detached (the kernel's backward then adds into nothing); ``coefficients``, each (H,), receive the gradients;
    ``weight_mods[c]`` adds the bias and log w_c, where w_c = −∂bias/∂coefficients[c] >= 0 at that score.

    Why it is exact: with P the attention, dO the output's gradient and Δ_i = dO_i · O_i, the gradient of a
    coefficient c of head h is Σ_ij dS_ij ∂b_ij/∂c = −Σ_i E_i (dO_i · Ō_i − Δ_i), where E_i = Σ_j P_ij w_ij =
    exp(lse'_i − lse_i) and Ō_i = Σ_j P_ij w_ij v_j / E_i, the output and log-sum-exp of a forward with the scores
    + log w (minilm/model/flex.py)."""

    score_mod: Callable
    coefficients: tuple
    weight_mods: tuple


class PositionEncoding(nn.Module):
    """Base class: every hook is the identity / absent. Subclasses override what they need."""

    score_kind: str = "none"  # "none" | "bias" | "full"   (see the module docstring)
    score_reads_qk: bool = True  # False: score() reads positions and parameters only (see Shapes above)
    has_value_term: bool = False
    # False for an encoding whose output for the new tokens depends on more than their own positions and the
    # cached keys / values (e.g. a convolution over neighbouring embeddings): generation then decodes without a
    # KV cache (minilm/model/generate.py).
    supports_kv_cache: bool = True
    # Names of the parameters that hold a value or vector per position, distance or head, used as they are rather
    # than as a map of activations (position tables, relative biases): like biases, whatever their shape, they take
    # no weight decay (minilm/training/optim.py), which would pull them toward "no position" (timm exempts ViT's
    # pos_embed and Swin's relative position bias table alike).
    no_weight_decay: tuple[str, ...] = ()
    # The parameters that raise ``max_length()``, for the messages that refuse a longer input (the phases' check, the
    # evaluation suite): naming max_positions for every bounded encoding sent an xPos user to a key it does not take.
    length_keys: tuple[str, ...] = ()

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        """``doc_ids`` (B, T), when attention is masked per document: an encoding that mixes neighbouring tokens
        (``conv``) must not mix across a document boundary, whether or not the positions restart there."""
        return x  # (B, T, D)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def score(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, logits: Tensor) -> Optional[Tensor]:
        """Additive term on the scaled logits, broadcastable to (B, H, T, S), fp32. ``logits`` (for contextual
        encodings such as CoPE) arrive already masked: disallowed entries are -inf. Reference path only."""
        return None

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Optional[Callable]:
        """A FlexAttention ``score_mod(score, b, h, i, j)`` equal to ``score``. None here, the base: an encoding
        that has one overrides this and always returns it (``Attention.kernel`` routes by the override)."""
        return None

    def flex_parts(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Optional[list]:
        """The keys split into ``FlexPart``s whose ``keep`` rules partition them, for FlexAttention to attend to
        each and merge, equal to ``score_mod`` over all keys; None (here, the base): one call with ``score_mod``."""
        return None

    def flex_kernel_options(self) -> Optional[dict]:
        """FlexAttention's ``kernel_options`` for this encoding's calls on CUDA (``SMALL_FLEX_BLOCKS``), or None
        (here, the base): inductor's default blocks for the head size."""
        return None

    def flex_coefficients(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Optional[FlexCoefficients]:
        """The bias as ``FlexCoefficients``, its coefficients' gradients from extra forwards; None (here, the base):
        ``score_mod`` with the kernel's own gradients."""
        return None

    def value(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Optional[Tensor]:
        """Additive term on the attention output (B, H, T, Dh) from the probabilities (B, H, T, S)."""
        return None

    def softmax_scale(self, head_dim: int) -> float:
        return head_dim**-0.5

    def max_length(self) -> Optional[int]:
        """Longest sequence this encoding supports (None: unbounded)."""
        return None


def tightest_limit(modules) -> Optional[tuple[int, tuple[str, ...]]]:
    """(the least ``max_length()`` of position ``modules``, the ``length_keys`` of the module that sets it); None where
    none is bounded: a model's limit, as the phases' check, the evaluation suite and generation read it."""
    bounded = [(limit, getattr(m, "length_keys", ())) for m in modules if (limit := m.max_length()) is not None]
    return min(bounded, key=lambda b: b[0]) if bounded else None


class Identity(PositionEncoding):
    """The hook object used where an encoding does not act (for example the embedding side of RoPE)."""


def make_params(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Build the typed parameter dataclass ``cls`` from ``values``; unknown keys, wrong types and bad values
    raise ConfigError naming ``where.key``. Dataclasses signal bad values by raising ValueError("key: why") from
    ``__post_init__``, or from an optional ``check()`` for checks that call into other modules (RoPE's scaling
    block), which run here, when a config is validated."""
    assert is_dataclass(cls)
    allowed = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        listing = ", ".join(allowed) or "(none)"
        raise ConfigError(f"{where}.{unknown[0]}: unknown parameter; this encoding takes: {listing}")
    kwargs = {}
    for name, value in values.items():
        kwargs[name] = _coerce(value, allowed[name].type, f"{where}.{name}")
    try:
        params = cls(**kwargs)
        if hasattr(params, "check"):
            params.check()
        return params
    except ValueError as e:
        raise ConfigError(f"{where}.{e}") from None


_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check scalar types by their annotation's name (annotations are strings under ``from __future__``)."""
    ann = str(annotation).replace("typing.", "").replace("Optional[", "").rstrip("]")
    if value is None:
        if "None" in str(annotation) or "Optional" in str(annotation):
            return None
        raise ConfigError(f"{key}: must not be null")
    target = _SCALARS.get(ann)
    if target is None:
        return value  # containers (scaling blocks, lists) are checked by their owners
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is float and isinstance(value, str):
        value = _yaml_float(value)
    if not isinstance(value, target) or (target is int and isinstance(value, bool)):
        quoted = isinstance(value, str) and target in (int, float) and _is_number(value)
        # (a quoted number: said as the scaling block says it, minilm.positions.rope_scaling)
        raise ConfigError(f"{key}: must be {ann}, got " + (f"the string {value!r}; write it without quotes" if quoted
                                                             else repr(value)))  # fmt: skip
    if target is float and not math.isfinite(value):  # nan passes every "> 0" check: nan or inf positions
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    return value


# What YAML 1.1 reads as a string although it is a float: an exponent without a dot (1e-6, 5E+3)
YAML_STRING_FLOAT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")
# nan, inf, -Infinity: text to YAML 1.2 (its own are .nan, .inf), floats to OmegaConf's typed keys (optim.lr=nan)
_NON_FINITE_WORD = re.compile(r"[-+]?(nan|inf|infinity)", re.IGNORECASE)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _yaml_float(value: str) -> Any:
    """``eps: 1e-6`` is a string to YAML 1.1; OmegaConf's typed config converts it for every schema key
    (``optim.lr: 1e-3`` works), so the free-form position block must too, and ``nan`` / ``inf`` as it converts them
    (then refused as not finite: ``base=nan`` was told to drop quotes it never had). Other strings (a quoted "2") are
    returned as they are, and refused by the caller."""
    text = value.strip()
    return float(text) if YAML_STRING_FLOAT.fullmatch(text) or _NON_FINITE_WORD.fullmatch(text) else value


def positions_like(x: Tensor, offset: int = 0) -> Tensor:
    """Default positions 0..T-1 (+ offset) as a (1, T) long tensor on x's device."""
    return torch.arange(offset, offset + x.shape[1], device=x.device).unsqueeze(0)
