"""RoPE frequencies as data: one pure function from (head_dim, base, scaling, current length) to
(inv_freq, attention_factor).

The scaling block uses the key names of Hugging Face transformers' ``rope_parameters`` so configs and exports
speak the ecosystem's language. The rotary module takes its frequencies from ``compute_rope`` and nowhere else.

``ROPE_SCALING`` below is the registry: a visible dict literal ``rope_type -> ScalingEntry(params, fn)`` in the
shape of transformers' ``ROPE_INIT_FUNCTIONS``. Each entry owns a typed, frozen parameter dataclass; a bad value
raises ``ConfigError`` whose message starts with the key (``"factor: must be >= 1, got 0.5"``), and
``validate_scaling`` prefixes where the block sits (``model.position.scaling.factor: ...``).

Conventions chosen here (implementations differ; docs/extension.md repeats them):

- ``original_max_position_embeddings`` (L below) is the pretraining length every method that needs one reads;
  there is no separate ``max_position_embeddings`` (transformers' dynamic NTK reads that one instead — the parity
  tests set both equal).
- "Current length" (``seq_len``) is 1 + the largest key position (the rotary module computes it). Only the types
  in ``LENGTH_DEPENDENT`` read it; every other type ignores it. Nothing is cached between calls, so dynamic
  methods never leak state from a long call into a short one (transformers' cached dynamic RoPE does).
  It may be an int or a 0-d tensor: the rotary module passes ``k_pos.amax() + 1`` as a tensor, so the
  length-dependent types are computed on the device with no host sync, and ``torch.compile`` traces them
  without a graph break and without a recompilation per length (their attention factor is then a tensor too).
- The attention factor is applied by the rotary module to cos and sin, so queries and keys each carry it and the
  logits scale by its square (transformers and the YaRN reference implementation do the same).
- ``partial_rotary_factor`` (transformers' rule): the function rotates ``int(head_dim · partial_rotary_factor)``
  dimensions and returns that many / 2 frequencies. The model's own ``model.position.fraction`` is applied
  before (the rotary module passes its rotary dimension as ``head_dim``), so the two multiply; use one of them.
- Everything is computed in float64 and returned as float32.
"""

from __future__ import annotations

import math
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields, MISSING
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from minilm.errors import ConfigError
from minilm.positions.base import FP32_MAX, FP32_POSITIONS, FP32_TINY, YAML_STRING_FLOAT, check_in_fp32

# rope_types whose frequencies depend on the current sequence length (recomputed per call, no state kept).
# longrope is here because it switches from short_factor to long_factor beyond the original length.
LENGTH_DEPENDENT = frozenset({"dynamic", "dynamic_yarn", "longrope"})


# --------------------------------------------------------------------------------------------------------------
# value checks shared by the parameter dataclasses (they raise ValueError("key: why"); parse_scaling converts)


def _check(ok: bool, key: str, why: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{key}: {why}, got {value!r}")


def _check_factor(factor: float) -> None:
    _check(factor >= 1, "factor", "must be >= 1", factor)


def _check_fraction(partial_rotary_factor: float) -> None:
    _check(0 < partial_rotary_factor <= 1, "partial_rotary_factor", "must be in (0, 1]", partial_rotary_factor)


INT64_MAX = torch.iinfo(torch.int64).max  # positions are int64


def _check_length(original: int) -> None:
    _check(original >= 1, "original_max_position_embeddings", "must be >= 1", original)
    # compared with the current length, a 0-d int64 tensor in the rotary module, and used in torch ops: beyond int64
    # (1e30 is an integer to the parser) it passed this check, then the first forward was an OverflowError traceback
    _check(original <= INT64_MAX, "original_max_position_embeddings",
           f"must be at most {INT64_MAX} (2^63 − 1: positions are int64, and no length reaches beyond)", original)


def _check_betas(beta_fast: float, beta_slow: float) -> None:
    _check(beta_slow > 0, "beta_slow", "must be > 0", beta_slow)
    _check(beta_fast > beta_slow, "beta_fast", f"must be > beta_slow ({beta_slow})", beta_fast)


# The rotary module takes positions in fp32 (rotary.cos_sin_tables), which counts integers exactly up to 2^24 only: the
# positions whose angle m·θ_i/λ_i must stay finite. A longrope rescale factor λ_i below 2^24 / FP32_MAX (4.9e-32)
# makes θ_0/λ_i (θ_0 = 1, the largest θ_i) so large that an angle below position 2^24 is inf in fp32, and its cos and
# sin NaN: at fp32's smallest normal number (the bound before) from position 4 on, at 1e-35 from position 3403 on.
LONGROPE_MIN_FACTOR = FP32_POSITIONS / FP32_MAX
FLOAT_MAX = sys.float_info.max


def _round_up(x: float, digits: int = 3) -> float:
    """x rounded up to ``digits`` significant digits: a printed lower bound that is itself allowed."""
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / unit) * unit


def _check_rescale_factor(key: str, value: float) -> None:
    _check(value > 0, key, "must be > 0", value)
    if value < LONGROPE_MIN_FACTOR:
        raise ValueError(
            f"{key}: must be at least {_round_up(LONGROPE_MIN_FACTOR):g} (2^24 / fp32's largest number: the frequency "
            f"θ_i/{key} times a position up to 2^24, the positions fp32 counts exactly, must stay finite in fp32, else "
            f"that dimension's angles are inf and its cos and sin NaN), got {value:g}"
        )


# The attention factor multiplies cos and sin, so queries and keys each carry it and every logit its square: that
# square must stay within fp32's range with room for the q·k it multiplies, else every logit is inf and the attention
# NaN (attention_factor 1e19 on a tiny model, though fp32 holds 1e19: its largest number, 3.4e38, was the bound). At
# most e^40, so the logits' factor is at most e^80 and leaves fp32's e^88 to q·k, as xPos leaves it to its decay.
ATTENTION_FACTOR_MAX = math.exp(40.0)  # 2.35e17
ATTENTION_FACTOR_WHY = ("e^40: queries and keys each carry it, so the logits carry its square, which must leave room "
                        "for q·k within fp32's range")


def _check_mscales(p: Any, factor: Optional[float], at: str = "") -> None:
    """YaRN's mscale / mscale_all_dim scale the 0.1·ln(s) term of the temperature 0.1·mscale·ln(s) + 1 (s >= 1), and
    the attention factor is the ratio of two such terms (``_yarn_attention``). A negative one lets a term reach 0:
    mscale_all_dim −7.21 at factor 4 was a ZeroDivisionError traceback, −100 a negative attention factor (every
    q·k negated); and dynamic_yarn's s grows with the length, so any negative one reaches 0 at some length. At
    ``factor`` (yarn's; dynamic_yarn's at the longest length, ``at`` says so: the ratio is monotone in s, so its
    extremes lie at s = 1, where it is 1, and there) the ratio itself must lie between fp32's smallest normal number
    and ``ATTENTION_FACTOR_MAX``: mscale 1e40 gave 1.2e39, inf in fp32, and 1e25 NaN logits."""
    for key in ("mscale", "mscale_all_dim"):
        value = getattr(p, key)
        if value is not None:
            _check(value >= 0, key, "must be >= 0 (it scales the 0.1·ln(factor) term of YaRN's temperature)", value)
    if factor is not None:
        t = _yarn_attention(p, factor)
        _check(t <= ATTENTION_FACTOR_MAX, "mscale", f"gives the attention factor {t:g} (its ratio to mscale_all_dim's "
               f"term at factor {factor:g}{at}), above {ATTENTION_FACTOR_MAX:.3g} = {ATTENTION_FACTOR_WHY}; give a "
               "smaller one", p.mscale)
        _check(t >= FP32_TINY, "mscale_all_dim", f"gives the attention factor {t:g} (mscale's term over its own at "
               f"factor {factor:g}{at}), below fp32's smallest normal number {FP32_TINY:.3g}; give a smaller one",
               p.mscale_all_dim)


def _check_optional_positive(key: str, value: Optional[float]) -> None:
    if value is not None:  # (the attention factor multiplies cos and sin in fp32, and the logits by its square)
        check_in_fp32(key, value, ATTENTION_FACTOR_MAX, ATTENTION_FACTOR_WHY)


# --------------------------------------------------------------------------------------------------------------
# typed parameter objects, one per rope_type (fields without a default are required)


@dataclass(frozen=True)
class DefaultScaling:
    """``default``: θ_i = base^(−2i/d) (Su et al. 2021). A change of ``base`` alone is ABF, adjusted base
    frequency (Xiong et al. 2023; ProLong / EasyContext raise it per stage)."""

    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class LinearScaling:
    """``linear``: Position Interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    factor: float
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class NtkScaling:
    """``ntk``: NTK-aware scaling (bloc97 2023): base · factor^(d/(d−2))."""

    factor: float
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class DynamicScaling:
    """``dynamic``: dynamic NTK (emozilla / bloc97 2023; transformers' formula), from the current length."""

    factor: float
    original_max_position_embeddings: int
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_length(self.original_max_position_embeddings)
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class NtkByPartsScaling:
    """``ntk_by_parts``: the YaRN ramp between beta_fast and beta_slow (Peng et al. 2023, §3.2), no temperature."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # round the ramp's ends to whole dimensions (floor / ceil), as the YaRN reference does
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_length(self.original_max_position_embeddings)
        _check_betas(self.beta_fast, self.beta_slow)
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class YarnScaling:
    """``yarn``: NTK-by-parts plus the attention temperature (Peng et al. 2023)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # The temperature: an explicit attention_factor wins; else, when mscale and mscale_all_dim are both set and
    # non-zero (transformers' rule, used by DeepSeek-V2/V3 configs), their mscale ratio; else 0.1·ln(factor) + 1.
    # (DeepSeek's attention also multiplies its softmax scale by mscale(factor, mscale_all_dim)²; minilm's does not:
    # docs/extension.md, "Parity".)
    attention_factor: Optional[float] = None
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_length(self.original_max_position_embeddings)
        _check_betas(self.beta_fast, self.beta_slow)
        _check_optional_positive("attention_factor", self.attention_factor)
        _check_mscales(self, self.factor)
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class DynamicYarnScaling:
    """``dynamic_yarn``: YaRN whose factor is taken from the current length (Peng et al. 2023, §3.3)."""

    original_max_position_embeddings: int
    # The effective factor is factor·L'/L − (factor − 1) for a current length L' > L (the same rule as ``dynamic``);
    # factor = 1 gives L'/L, the YaRN reference implementation's Dynamic-YaRN.
    factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: Optional[float] = None  # a fixed temperature; else computed from the effective factor
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_length(self.original_max_position_embeddings)
        _check_betas(self.beta_fast, self.beta_slow)
        _check_optional_positive("attention_factor", self.attention_factor)
        # its factor follows the length: checked at the longest, FP32_POSITIONS
        longest = _dynamic_scale(self.factor, self.original_max_position_embeddings, FP32_POSITIONS)
        _check_mscales(self, longest, ", the one it reaches at length 2^24")
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class Llama3Scaling:
    """``llama3``: Llama 3.1's piecewise rule (Meta 2024); low/high_freq_factor default to Meta's 1 and 4."""

    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_factor(self.factor)
        _check_length(self.original_max_position_embeddings)
        _check(self.low_freq_factor > 0, "low_freq_factor", "must be > 0", self.low_freq_factor)
        _check(
            self.high_freq_factor > self.low_freq_factor,
            "high_freq_factor",
            f"must be > low_freq_factor ({self.low_freq_factor})",
            self.high_freq_factor,
        )
        _check_fraction(self.partial_rotary_factor)


@dataclass(frozen=True)
class LongRopeScaling:
    """``longrope``: per-dimension rescale factors found by search (LongRoPE, Ding et al. 2024; Phi-3)."""

    original_max_position_embeddings: int
    short_factor: Tuple[float, ...]  # one per frequency (rotary dims / 2), used up to the original length
    long_factor: Tuple[float, ...]  # one per frequency, used beyond it
    # Only feeds the temperature sqrt(1 + ln(factor)/ln(L)) (the target length / L); required unless
    # attention_factor gives the temperature directly. (transformers derives it from max_position_embeddings,
    # which minilm does not have.)
    factor: Optional[float] = None
    attention_factor: Optional[float] = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        _check_length(self.original_max_position_embeddings)
        for key in ("short_factor", "long_factor"):
            values = getattr(self, key)
            _check(len(values) > 0, key, "must be a list of numbers > 0", values)
            for i, value in enumerate(values):  # θ_i / value: "> 0" passed 1e-50 (an infinite frequency in fp32),
                # and fp32's smallest normal number passed 1e-35 (finite, but position·θ_0/1e-35 inf from 3403 on)
                _check_rescale_factor(f"{key}[{i}]", value)
        if self.factor is not None:
            _check_factor(self.factor)
        _check_optional_positive("attention_factor", self.attention_factor)
        _check(
            self.factor is not None or self.attention_factor is not None,
            "factor",
            "required for rope_type 'longrope' unless attention_factor is set",
            self.factor,
        )
        if self.attention_factor is None and self.factor is not None and self.factor > 1:
            # the temperature sqrt(1 + ln(factor)/ln(L)) divides by ln L: 0 at L = 1 (a ZeroDivisionError traceback)
            _check(self.original_max_position_embeddings >= 2, "original_max_position_embeddings",
                   "must be >= 2 for rope_type 'longrope' with factor > 1 (its temperature sqrt(1 + ln(factor)/ln(L)) "
                   "divides by ln L, 0 at L = 1); or give attention_factor", self.original_max_position_embeddings)
        _check_fraction(self.partial_rotary_factor)


# --------------------------------------------------------------------------------------------------------------
# the functions: (params, rotary dims d, base, current length or None) -> (inv_freq float64 (d/2,), factor)


def _inv_freq64(dim: int, base: float | Tensor, device: Optional[torch.device] = None) -> Tensor:
    # θ_i = base^(-2i/d), i = 0 .. d/2-1 (Su et al. 2021); a tensor base (a traced length) keeps its device
    if isinstance(base, Tensor):
        device = base.device
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))


def _device(x: Any) -> Optional[torch.device]:
    return x.device if isinstance(x, Tensor) else None


def _default_inv_freq(dim: int, base: float) -> Tensor:
    return _inv_freq64(dim, base).float()


def _current(seq_len: Optional[int | Tensor], original: int) -> float | Tensor:
    """The length a dynamic method reads: the current length, but never below the original one (a float64 0-d
    tensor when the length is a tensor)."""
    if isinstance(seq_len, Tensor):
        return seq_len.to(torch.float64).clamp(min=original)
    return float(original if seq_len is None else max(seq_len, original))


def _ntk_exponent(dim: int, rope_type: str) -> float:
    if dim <= 2:
        raise ConfigError(f"rope_type: {rope_type!r} needs a rotary dimension > 2, got {dim}")
    return dim / (dim - 2)


def _mscale(scale: float | Tensor, mscale: float = 1.0) -> float | Tensor:
    # YaRN's temperature sqrt(1/t) = 0.1·ln(s) + 1 (Peng et al. 2023, eq. 22); DeepSeek-V2 scales the 0.1 by mscale
    if isinstance(scale, Tensor):  # a current-length scale: >= 1 (_current clamps), where the formula gives 1 at 1
        return 0.1 * mscale * torch.log(scale) + 1.0
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, factor: float | Tensor, original: int, beta_fast, beta_slow, truncate):
    """NTK-by-parts (Peng et al. 2023, §3.2): dimension i keeps its frequency where its wavelength λ_i = 2π/θ_i
    fits more than beta_fast times into L, is divided by factor where it fits fewer than beta_slow times, and is
    blended linearly (in i) between the two."""

    def dim_for(rotations: float) -> float:  # the (fractional) i at which L / λ_i == rotations
        # ln(L / (2π·rotations)) as a difference of logarithms: the quotient overflowed float64 for a tiny beta_slow
        # (1e-310 at L = 128: floor(inf), an OverflowError traceback) and was 0 for a huge beta_fast (1e308: log(0),
        # 'math domain error'); every log here is finite
        return dim * (math.log(original) - math.log(rotations) - math.log(2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low > high:
        # Both ends beyond d − 1 (every wavelength fits more than beta_fast times into L: keep every frequency, the
        # paper's γ = 0) or both below 0 (none fits beta_slow times: interpolate every one). transformers' clamps
        # cross there and invert the ramp: base 1.5 at L 2048 interpolated every frequency it should keep.
        low, high = (dim, dim + 1) if high == dim - 1 else (-2, -1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    device = _device(factor)  # a traced current-length factor: compute on its device
    i = torch.arange(dim // 2, dtype=torch.float64, device=device)
    ramp = ((i - low) / (high - low)).clamp(0, 1)  # 0 keep .. 1 interpolate
    inv_freq = _inv_freq64(dim, base, device)
    return inv_freq * (1 - ramp) + (inv_freq / factor) * ramp


def _yarn_attention(p, factor: float) -> float:
    if p.attention_factor is not None:
        return float(p.attention_factor)
    if p.mscale and p.mscale_all_dim:  # both set and non-zero: transformers' / DeepSeek's ratio
        return _mscale(factor, p.mscale) / _mscale(factor, p.mscale_all_dim)
    return _mscale(factor)


def _default(p: DefaultScaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    return _inv_freq64(dim, base), 1.0


def _linear(p: LinearScaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    # PI: positions m -> m / factor, i.e. every θ_i / factor (Chen et al. 2023)
    return _inv_freq64(dim, base) / p.factor, 1.0


def _ntk(p: NtkScaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    # base' = base · factor^(d/(d−2)): θ_0 = 1 stays, the lowest θ_{d/2−1} is divided by exactly factor (bloc97 2023)
    return _inv_freq64(dim, _ntk_base(base, p.factor, _ntk_exponent(dim, "ntk"))), 1.0


def _ntk_base(base: float, scale: float | Tensor, exponent: float) -> Tensor:
    """base · scale^exponent in float64 tensors: Python's float power raised OverflowError (a traceback) where it
    leaves float64 (ntk factor 1e300); as a tensor it is inf, and base'^(−2i/d) then gives the limit (θ_0 = 1, the
    others 0), not an error. A tensor scale (a traced current length) keeps its device."""
    return torch.as_tensor(scale, dtype=torch.float64) ** exponent * base


def _dynamic_scale(factor: float, original: int, seq_len: Optional[int | Tensor]) -> float | Tensor:
    """factor·L'/L − (factor − 1), written 1 + factor·(L' − L)/L: the same number, but the first form cancels to 0
    at L' = L for a factor from about 2^53 = 9e15 (factor − 1 rounds to factor in float64), and base · 0^(d/(d−2))
    = 0 made every frequency but θ_0 inf, so cos and sin NaN at and below the original length. At most float64's
    largest number: a factor from about 1e307 made it inf, and dynamic_yarn's temperature 0.1·ln(inf) + 1 inf (NaN
    logits), where a finite scale gives the limit (θ_0 and the kept dimensions, the others 0; temperature <= 72)."""
    scale = 1 + factor * (_current(seq_len, original) - original) / original
    return scale.clamp(max=FLOAT_MAX) if isinstance(scale, Tensor) else min(scale, FLOAT_MAX)


def _dynamic(p: DynamicScaling, dim: int, base: float, seq_len: Optional[int | Tensor]) -> tuple[Tensor, Any]:
    # base' = base · (factor·L'/L − (factor − 1))^(d/(d−2)) with L' = max(current length, L): the default at or
    # below L. transformers' _compute_dynamic_ntk_parameters, with L = original_max_position_embeddings.
    L = p.original_max_position_embeddings
    scale = _dynamic_scale(p.factor, L, seq_len)
    return _inv_freq64(dim, _ntk_base(base, scale, _ntk_exponent(dim, "dynamic"))), 1.0


def _ntk_by_parts(p: NtkByPartsScaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    L = p.original_max_position_embeddings
    return _yarn_inv_freq(dim, base, p.factor, L, p.beta_fast, p.beta_slow, p.truncate), 1.0


def _yarn(p: YarnScaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    L = p.original_max_position_embeddings
    inv_freq = _yarn_inv_freq(dim, base, p.factor, L, p.beta_fast, p.beta_slow, p.truncate)
    return inv_freq, _yarn_attention(p, p.factor)


def _dynamic_yarn(p: DynamicYarnScaling, dim: int, base: float, seq_len: Optional[int | Tensor]):
    L = p.original_max_position_embeddings
    scale = _dynamic_scale(p.factor, L, seq_len)  # >= 1; == 1 at or below L (then: default)
    inv_freq = _yarn_inv_freq(dim, base, scale, L, p.beta_fast, p.beta_slow, p.truncate)
    return inv_freq, _yarn_attention(p, scale)


def _llama3(p: Llama3Scaling, dim: int, base: float, seq_len: Optional[int]) -> tuple[Tensor, float]:
    # Meta 2024 (Llama 3.1): wavelengths below L/high_freq_factor keep θ; above L/low_freq_factor θ/factor; between,
    # a blend linear in L/λ: (1 − s)·θ/factor + s·θ with s = (L/λ − low_freq_factor)/(high − low).
    L = p.original_max_position_embeddings
    inv_freq = _inv_freq64(dim, base)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = L / p.low_freq_factor, L / p.high_freq_factor
    smooth = (L / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
    blended = (1 - smooth) * inv_freq / p.factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / p.factor, inv_freq)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, out), 1.0


def _longrope(p: LongRopeScaling, dim: int, base: float, seq_len: Optional[int | Tensor]) -> tuple[Tensor, Any]:
    # Ding et al. 2024: θ_i / λ_i with λ = short_factor up to L (and when no length is given), long_factor beyond.
    L = p.original_max_position_embeddings
    for key in ("short_factor", "long_factor"):
        n = len(getattr(p, key))
        if n != dim // 2:
            raise ConfigError(f"{key}: must have one entry per rotary frequency ({dim // 2}), got {n}")
    device = _device(seq_len)
    short, long = (torch.tensor(f, dtype=torch.float64, device=device) for f in (p.short_factor, p.long_factor))
    if isinstance(seq_len, Tensor):
        factors = torch.where(seq_len > L, long, short)
    else:
        factors = long if seq_len is not None and seq_len > L else short
    inv_freq = _inv_freq64(dim, base, device) / factors
    attention = float(p.attention_factor) if p.attention_factor is not None else longrope_attention(p.factor, L)
    return inv_freq, attention


def longrope_attention(factor: float, original: int) -> float:
    """LongRoPE's temperature without an explicit attention_factor: sqrt(1 + ln(s)/ln(L)) for the factor s and the
    original length L, applied at every length (as Phi-3 / transformers do); 1 where s <= 1."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


class ScalingEntry(NamedTuple):
    params: type  # the typed, frozen parameter dataclass
    # (params, dim, base, seq_len: int, 0-d tensor or None) -> (inv_freq float64, attention factor)
    fn: Callable[[Any, int, float, Any], tuple[Tensor, Any]]


# THE registry of RoPE scaling methods (the shape of transformers' ROPE_INIT_FUNCTIONS).
ROPE_SCALING: dict[str, ScalingEntry] = {
    "default": ScalingEntry(DefaultScaling, _default),
    "linear": ScalingEntry(LinearScaling, _linear),
    "ntk": ScalingEntry(NtkScaling, _ntk),
    "dynamic": ScalingEntry(DynamicScaling, _dynamic),
    "ntk_by_parts": ScalingEntry(NtkByPartsScaling, _ntk_by_parts),
    "yarn": ScalingEntry(YarnScaling, _yarn),
    "dynamic_yarn": ScalingEntry(DynamicYarnScaling, _dynamic_yarn),
    "llama3": ScalingEntry(Llama3Scaling, _llama3),
    "longrope": ScalingEntry(LongRopeScaling, _longrope),
}


# --------------------------------------------------------------------------------------------------------------
# parsing a scaling block into its typed parameters


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        annotation = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if value is None:
        raise ConfigError(f"{key}: must not be null")
    if origin is tuple:  # Tuple[float, ...]: a list of numbers
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{key}: must be a list of numbers, got {value!r}")
        return tuple(_coerce(v, float, f"{key}[{i}]") for i, v in enumerate(value))
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {value!r}")
        return value
    if isinstance(value, str) and YAML_STRING_FLOAT.fullmatch(value.strip()):
        # not converted: the block is also read as written (export), where a string would stay a string
        raise ConfigError(f"{key}: must be a number, got the string {value!r}; write it without quotes")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: must be a number, got {value!r}")
    if not math.isfinite(value):  # inf / nan pass every ">= 1" check below and give inf or nan frequencies
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    if annotation is int:
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: must be an integer, got {value!r}")
        return int(value)
    return float(value)


def parse_scaling(scaling: Optional[Mapping[str, Any]], named_apart: bool = False) -> tuple[str, Any]:
    """(rope_type, typed parameters) for a scaling block; None or {} is ``default``. Raises ConfigError naming
    the key for an unknown rope_type, an unknown or missing key, or a bad value. ``named_apart``: the user gave the
    rope_type as a name, not as a key of the block (an evaluation's extension), so the keys an unknown one is told
    it may be do not include rope_type."""
    values = dict(scaling or {})
    # the two keys of a transformers block that are not scaling parameters here: say where they go rather than
    # "not a parameter of rope_type 'default'"
    if "type" in values:
        raise ConfigError(f"type: the key is rope_type (transformers' older name 'type'), got type: {values['type']!r}")
    if "rope_theta" in values:
        theta = values["rope_theta"]
        raise ConfigError(f"rope_theta: the RoPE base is model.position.base, not a scaling key, got {theta!r}")
    rope_type = values.pop("rope_type", "default")
    if rope_type not in ROPE_SCALING:
        raise ConfigError(f"rope_type: unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_SCALING)}")
    cls = ROPE_SCALING[rope_type].params
    hints = typing.get_type_hints(cls)
    allowed = [f.name for f in fields(cls)]
    for key in values:
        if key not in allowed:
            raise ConfigError(
                f"{key}: not a parameter of rope_type {rope_type!r}; it takes: "
                + ", ".join(allowed if named_apart else ["rope_type", *allowed])
            )
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in values:
            raise ConfigError(f"{f.name}: required for rope_type {rope_type!r}")
    kwargs = {key: _coerce(value, hints[key], key) for key, value in values.items()}
    try:
        return rope_type, cls(**kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def compute_rope(
    head_dim: int,
    base: float,
    scaling: Optional[Mapping[str, Any]] = None,
    seq_len: Optional[int | Tensor] = None,
) -> tuple[Tensor, float | Tensor]:
    """(inv_freq of shape (d/2,) float32, attention_factor) with d = int(head_dim · partial_rotary_factor).

    ``head_dim``: the dimensions that rotate (the rotary module passes its rotary dimension); ``base``: θ base;
    ``scaling``: a transformers-style ``rope_parameters`` block (``rope_type`` picks the ROPE_SCALING entry);
    ``seq_len``: the current length (1 + the largest key position), read only by LENGTH_DEPENDENT types.
    """
    if head_dim % 2:
        raise ConfigError(f"rotary dimension must be even, got {head_dim}")
    if not (base > 1 and math.isfinite(base)):  # base 1: the YaRN ramp divides by ln(base)
        raise ConfigError(f"base: must be a finite number > 1, got {base}")
    if seq_len is not None and not isinstance(seq_len, Tensor) and seq_len < 1:
        raise ConfigError(f"seq_len: must be >= 1, got {seq_len}")
    rope_type, params = parse_scaling(scaling)
    return scaled_frequencies(rope_type, params, head_dim, base, seq_len)


def scaled_frequencies(
    rope_type: str, params: Any, head_dim: int, base: float, seq_len: Optional[int | Tensor] = None
) -> tuple[Tensor, float | Tensor]:
    """``compute_rope`` for a block already parsed by ``parse_scaling`` (the rotary module parses once, at
    configuration, and calls this per forward: nothing here needs tracing through dataclass validation). With a
    tensor ``seq_len`` a length-dependent type returns inv_freq on its device and a tensor attention factor."""
    dim = int(head_dim * params.partial_rotary_factor)  # transformers' rule
    if dim < 2 or dim % 2:
        raise ConfigError(
            f"partial_rotary_factor: {params.partial_rotary_factor} of {head_dim} gives {dim} rotary dimensions;"
            " it must be an even number >= 2"
        )
    inv_freq, attention_factor = ROPE_SCALING[rope_type].fn(params, dim, float(base), seq_len)
    if isinstance(attention_factor, Tensor):
        return inv_freq.float(), attention_factor.float()
    return inv_freq.float(), float(attention_factor)


def validate_scaling(scaling: Optional[Mapping[str, Any]], head_dim: int, where: str) -> None:
    """Raise ConfigError naming ``where.<key>`` for a bad scaling block (by computing it once)."""
    try:
        compute_rope(head_dim, 10000.0, scaling)
    except ConfigError as e:
        raise ConfigError(f"{where}.{e}") from None
