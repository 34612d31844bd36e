"""Absolute encodings: they act once, on the token embeddings (``embed``), before the first block.

Shapes: x (B, T, D); positions (B or 1, T) integer positions (which may start above 0 with a KV cache or restart
per packed document). Every class here is the ``embedding`` hook of its registry entry; attention uses SDPA.

Conventions chosen here (docs/positions.md repeats them):

- ``sinusoidal`` interleaves sin and cos as in the paper (PE[2i] = sin, PE[2i+1] = cos) and is added unscaled
  (the token embeddings are not multiplied by √d here; ``scale`` rescales the table instead).
- ``floater`` integrates from t = 0 with a fixed step, so position p's vector never depends on how many
  positions were asked for; it starts at rest (h's output layer zero), p(n) = p0 of the token embeddings' size.
- ``conv`` sees the tokens of the current call only: with a KV cache the taps that reach before the call would
  read zeros, so it declares ``supports_kv_cache = False`` and generation decodes it without a cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minilm.errors import ConfigError, MinilmError
from minilm.positions.base import FP32_MAX, PositionDims, PositionEncoding, check_in_fp32


class SequenceTooLong(MinilmError):
    """A position beyond what a bounded encoding (a learned table) can represent."""


class NegativePosition(MinilmError):
    """A position below 0 given to an encoding that looks positions up by index (a learned table, FLOATER's
    trajectory)."""


def highest_position(positions: Tensor, name: str) -> int:
    """The largest of ``positions``, refusing a negative one: indexing a table or trajectory with it reads a row from
    the end (−1: the last one), a wrong position and no error. One host sync for both ends. −1 for no positions (an
    input of zero tokens, which reads no row; aminmax has no identity to give)."""
    if positions.numel() == 0:
        return -1
    low, high = torch.stack(torch.aminmax(positions)).tolist()
    if low < 0:
        raise NegativePosition(
            f"position {low} is negative: the {name} encoding looks positions up from 0 (a negative one would read "
            f"one from the end); give the model positions >= 0"
        )
    return high


def sinusoid(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. 2017, "Attention Is All You Need" (§3.5): PE(pos, 2i) = sin(pos / base^(2i/d)),
    PE(pos, 2i+1) = cos(pos / base^(2i/d)). positions (...,) -> (..., dim), fp32, computed in float64."""
    i = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)  # the 2i of the formula
    angles = positions.to(torch.float64).unsqueeze(-1) / base ** (i / dim)  # (..., ceil(dim/2))
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :dim]  # sin, cos interleaved
    return pe.float()


# ------------------------------------------------------------------------------------------------- learned


@dataclass
class LearnedParams:
    max_positions: int = 2048  # rows of the table: the longest sequence the model can ever see

    def __post_init__(self):
        if self.max_positions < 1:
            raise ValueError(f"max_positions: must be >= 1, got {self.max_positions}")


class LearnedAbsolute(PositionEncoding):
    """A trainable vector per position added to the token embedding (GPT / GPT-2; Gehring et al. 2017,
    "Convolutional Sequence to Sequence Learning"). Bounded: positions >= max_positions are an error."""

    no_weight_decay = ("table",)
    length_keys = ("max_positions",)

    def __init__(self, params: LearnedParams, dims: PositionDims):
        super().__init__()
        self.limit = params.max_positions
        self.table = nn.Parameter(torch.randn(params.max_positions, dims.d_model) * 0.02)  # (P, D)

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        top = highest_position(positions, "learned")
        if top >= self.limit:
            raise SequenceTooLong(
                f"position {top} is beyond the learned position table (model.position.max_positions="
                f"{self.limit}): a 'learned' model cannot read sequences longer than {self.limit} tokens; "
                f"train with a larger max_positions or use an extrapolating encoding (rope, alibi, fire, ...)"
            )
        return x + self.table[positions]  # (B, T, D)

    def max_length(self) -> int:
        return self.limit


# ---------------------------------------------------------------------------------------------- sinusoidal


@dataclass
class SinusoidalParams:
    base: float = 10000.0
    # multiplies the table before it is added. null (default): √2 · model.init_std, which gives the table the token
    # embeddings' RMS; 1.0 is Vaswani's unscaled table (RMS 0.71), which there met embeddings scaled up by √d. Here,
    # with embeddings of RMS 0.02, it drowned them: the tiny config's val loss at step 150 was 5.88 with 1.0, 4.63
    # with the default, 4.59 with no position at all (docs/positions.md)
    scale: Optional[float] = None

    def __post_init__(self):
        if self.base <= 1:
            raise ValueError(f"base: must be > 1, got {self.base}")
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"scale: must be > 0 (or null: √2 · model.init_std), got {self.scale}")
        if self.scale is not None:
            check_in_fp32("scale", self.scale)

    def check_width(self, d_model: int, where: str) -> None:
        """``scale`` against the model's width, when the model is built (the config's check does not know d_model):
        the table's entries reach ±scale, and every block's RMSNorm sums d_model squares in fp32. Past
        √(3.4e38 / d_model) that sum may overflow (from 2.3e18 at d_model 128: every norm 0, the logits constant)."""
        if self.scale is not None:
            try:
                check_in_fp32("scale", self.scale, math.sqrt(FP32_MAX / d_model), f"√(3.4e38 / d_model {d_model}): "
                              "the table's entries reach ±scale, and each block's RMSNorm sums d_model squares in fp32")
            except ValueError as e:
                raise ConfigError(f"{where}.{e}") from None


class Sinusoidal(PositionEncoding):
    """Fixed sinusoids added to the token embeddings (Vaswani et al. 2017); defined at every position."""

    def __init__(self, params: SinusoidalParams, dims: PositionDims):
        super().__init__()
        params.check_width(dims.d_model, "model.position")
        self.base, self.dim = params.base, dims.d_model
        self.scale = params.scale if params.scale is not None else math.sqrt(2) * dims.init_std

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        return x + (self.scale * sinusoid(positions, self.dim, self.base)).to(x.dtype)  # (B, T, D)


# ------------------------------------------------------------------------------------------------- FLOATER


@dataclass
class FloaterParams:
    hidden: int = 32  # width of the dynamics network h
    # time between consecutive positions: position n sits at t = n · delta. 0.01, the authors' value: an optimizer
    # step on h moves p(n) in proportion to t, and at 0.1 such steps shook p by several times the embeddings' size
    # (val loss 4.80 against 4.62 at step 150 of configs/positions/floater.yaml, docs/positions.md)
    delta: float = 0.01
    substeps: int = 1  # RK4 steps per position
    cache_size: int = 65536  # never integrate past this position (keeps a typo from running for hours)

    def __post_init__(self):
        if self.hidden < 1:
            raise ValueError(f"hidden: must be >= 1, got {self.hidden}")
        check_in_fp32("delta", self.delta)
        if self.substeps < 1:
            raise ValueError(f"substeps: must be >= 1, got {self.substeps}")
        if self.cache_size < 1:
            raise ValueError(f"cache_size: must be >= 1, got {self.cache_size}")
        last = self.delta * (self.cache_size - 1)  # the time of the last position: t is an input of h, in fp32
        if last > FP32_MAX:
            raise ValueError(f"delta: {self.delta:g} puts position {self.cache_size - 1} (cache_size − 1) at t = "
                             f"{last:.3g}, past fp32's largest number, and h reads t in fp32: give delta · (cache_size "
                             f"− 1) <= {FP32_MAX:.3g}")


class Floater(PositionEncoding):
    """FLOATER (Liu et al. 2020, "Learning to Encode Position for Transformer with Continuous Dynamical
    Model", arXiv:2003.09229): positions are samples p(n·Δ) of the solution of dp/dt = h(t, p), p(0) = p0, with
    a small network h, added to the token embeddings.

    Here a fixed-step RK4 integrates from t = 0 once, at the input only, so p(n) is the same for the same
    parameters whatever the length requested (the trajectory is computed in the same order for every prefix), and
    any length works. The authors' code injects p into every block instead (a q, k and v bias per layer), with a
    ReLU network h and RK4 steps of delta/5, on top of sinusoidal input positions (docs/positions.md).
    Without gradients the trajectory is cached until a parameter changes or a forward with gradients runs; a longer
    one goes on from its end."""

    length_keys = ("cache_size",)

    def __init__(self, params: FloaterParams, dims: PositionDims):
        super().__init__()
        self.delta, self.substeps, self.limit = params.delta, params.substeps, params.cache_size
        self.init_std = dims.init_std
        self.p0 = nn.Parameter(torch.empty(dims.d_model))  # (D,)
        self.h_in = nn.Linear(dims.d_model + 1, params.hidden)
        self.h_out = nn.Linear(params.hidden, dims.d_model)
        self._cache = None
        self.reset_position_parameters()

    def reset_position_parameters(self) -> None:
        # p(n) starts as large as the token embeddings at every position: p0 of their size (model.init_std) and h at
        # rest (dp/dt = 0). A moving start drowned them, as the unscaled sinusoids did: with h's output layer N(0,
        # init_std) the trajectory drifted to RMS 0.23 over 128 positions and 12 over 2048 at delta 0.1, 0.023 and
        # 0.53 at 0.01 (docs/positions.md)
        nn.init.normal_(self.p0, std=self.init_std)
        self.h_in.reset_parameters()  # O(1) hidden activations, varying with t: h's output layer learns from step 1
        nn.init.zeros_(self.h_out.weight)
        nn.init.zeros_(self.h_out.bias)

    def dynamics(self, t: float, p: Tensor) -> Tensor:
        tt = torch.full_like(p[..., :1], t)
        return self.h_out(torch.tanh(self.h_in(torch.cat((p, tt), dim=-1))))  # (D,)

    # Eager under train.compile: the integration is a Python loop over positions, which dynamo unrolled into a graph
    # of ~40 ops per position and step (every length its own graph), and inductor took minutes to compile it on CPU
    # (train.seq_len 64: over 8 minutes; 8 tokens: 1.5), for a loop of tiny sequential ops that compiling cannot speed
    @torch.compiler.disable
    def trajectory(self, n: int) -> Tensor:
        """p(0), p(Δ), ..., p((n-1)Δ): (n, D), by classic RK4 with ``substeps`` steps per position."""
        if n > self.limit:
            raise SequenceTooLong(f"floater: position {n - 1} is beyond model.position.cache_size={self.limit}, the "
                                  f"number of positions the ODE is integrated over (0..{self.limit - 1}); raise "
                                  f"cache_size (the ODE is defined at any position: weights trained with a smaller "
                                  f"one load with a larger one)")
        if torch.is_grad_enabled():
            # a forward with gradients is training: its optimizer step will change the parameters, and the fused
            # AdamW (minilm.training.optim) updates them without bumping their _version, which the key reads; a
            # trajectory kept across it was the previous validation's (stale val/loss and end-of-phase evaluation)
            self._cache = None
        key = tuple((p.data_ptr(), p._version) for p in self.parameters())
        start = None  # the cached trajectory of these parameters: its first n positions, or where to go on from
        if not torch.is_grad_enabled() and self._cache is not None and self._cache[0] == key:
            start = self._cache[1]
            if start.shape[0] >= n:
                return start[:n]
        # fp32 under autocast too: an ODE integrated with bf16 steps drifts, and the cached trajectory would then
        # depend on whether the first call after a parameter change ran under autocast
        with torch.autocast(self.p0.device.type, enabled=False):
            traj = self._integrate(n, start)
        if not torch.is_grad_enabled():
            self._cache = (key, traj)
        return traj[:n]  # (n = 0: none; the integration itself always holds p(0))

    def _integrate(self, n: int, start: Optional[Tensor] = None) -> Tensor:
        """From p0, or on from the end of ``start`` (p(0)..p(m−1), as this returned them): the same steps in the same
        order, so bit-identical. KV-cache decoding asks for one position more per token; integrating each time from
        t = 0 made a token at 2048 positions cost 0.4 s (the tiny config's FLOATER, one CPU thread)."""
        h = self.delta / self.substeps
        out = [self.p0] if start is None else list(start.unbind(0))
        p = out[-1]
        for n_done in range(len(out), n):
            for s in range(self.substeps):
                t = ((n_done - 1) * self.substeps + s) * h
                k1 = self.dynamics(t, p)
                k2 = self.dynamics(t + h / 2, p + h / 2 * k1)
                k3 = self.dynamics(t + h / 2, p + h / 2 * k2)
                k4 = self.dynamics(t + h, p + h * k3)
                p = p + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            out.append(p)
        return torch.stack(out).float()  # (n, D)

    def max_length(self) -> int:
        return self.limit  # trajectory() integrates no further than cache_size positions

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        traj = self.trajectory(highest_position(positions, "floater") + 1)
        return x + traj[positions].to(x.dtype)  # (B, T, D)


# ------------------------------------------------------------------------------------------ multiplicative


@dataclass
class MultiplicativeParams:
    base: float = 10000.0
    amplitude: float = 0.5  # p_k = 1 + amplitude · PE(k): in [1 - a, 1 + a], so no dimension is ever zeroed

    def __post_init__(self):
        if self.base <= 1:
            raise ValueError(f"base: must be > 1, got {self.base}")
        if not 0 < self.amplitude < 1:
            raise ValueError(f"amplitude: must be in (0, 1), got {self.amplitude}")
        check_in_fp32("amplitude", self.amplitude)


class Multiplicative(PositionEncoding):
    """Multiplicative absolute positions: x_k ⊙ p_k instead of x_k + p_k (the "multiplicative integration" of
    position information surveyed by Dufter, Schmitt & Schütze 2022, "Position Information in Transformers: An
    Overview", §4). p_k = 1 + amplitude · PE_sin(k) (Vaswani's sinusoids, so every length is defined)."""

    def __init__(self, params: MultiplicativeParams, dims: PositionDims):
        super().__init__()
        self.base, self.amplitude, self.dim = params.base, params.amplitude, dims.d_model

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        p = 1.0 + self.amplitude * sinusoid(positions, self.dim, self.base)  # (B, T, D)
        return x * p.to(x.dtype)


# ------------------------------------------------------------------------------------------- complex order


@dataclass
class ComplexOrderParams:
    base: float = 10000.0  # initial frequencies ω = base^(-2i/D), as the sinusoids'

    def __post_init__(self):
        if self.base <= 1:
            raise ValueError(f"base: must be > 1, got {self.base}")

    def check_width(self, d_model: int, where: str) -> None:
        """The output replaces x with ⌊d_model/2⌋ (real, imaginary) pairs, an odd d_model's last dimension zero: at
        d_model 1 there is no pair, and every token's embedding was 0 (the model saw no input at all)."""
        if d_model < 2:
            raise ConfigError(f"{where}.name: complex_order replaces each embedding with ⌊d_model/2⌋ complex "
                              f"dimensions (a cos and a sin each), so it needs model.d_model >= 2, got {d_model} "
                              "(every embedding would be zero)")  # fmt: skip


class ComplexOrder(PositionEncoding):
    """Word-order complex embeddings (Wang et al. 2020, "Encoding Word Order in Complex Embeddings", ICLR):
    token j at position k is r_j · e^{i(ω_j k + θ_j)} with per-token amplitude r, frequency ω and phase θ; the
    model reads its real and imaginary parts, concatenated: [r cos(ωk + θ), r sin(ωk + θ)] (D/2 complex dims).

    Convention: r, ω, θ are linear functions of the token embedding x (the paper's per-word tables, factored
    through the embedding table, so they stay per token); ω has a learned bias initialized to the sinusoidal
    frequencies, so at initialization every dimension rotates at a different rate. The output replaces x."""

    def __init__(self, params: ComplexOrderParams, dims: PositionDims):
        super().__init__()
        params.check_width(dims.d_model, "model.position")
        d = dims.d_model
        self.half = d // 2
        self.base = params.base
        self.amplitude = nn.Linear(d, self.half, bias=False)
        self.frequency = nn.Linear(d, self.half)
        self.phase = nn.Linear(d, self.half, bias=False)
        self.reset_position_parameters()

    def reset_position_parameters(self) -> None:
        d = self.amplitude.in_features
        # r as large as x per dimension; the output (r cos, r sin) is 1/√2 of it
        nn.init.normal_(self.amplitude.weight, std=d**-0.5)
        nn.init.normal_(self.frequency.weight, std=0.02)
        nn.init.normal_(self.phase.weight, std=0.02)
        with torch.no_grad():
            i = torch.arange(self.half, dtype=torch.float64)
            self.frequency.bias.copy_((self.base ** (-2 * i / d)).float())

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        # fp32 under autocast too: in bf16 the angle ω·k + θ has a resolution of k/128 rad (2 rad at k = 256), so
        # neighbouring positions would get the same phase
        with torch.autocast(x.device.type, enabled=False):
            xf = x.float()
            r, w, theta = self.amplitude(xf), self.frequency(xf), self.phase(xf)  # (B, T, D/2) each
            angle = w * positions.unsqueeze(-1).float() + theta
            z = torch.cat((r * angle.cos(), r * angle.sin()), dim=-1)  # (B, T, 2·(D/2))
        return F.pad(z, (0, x.shape[-1] - z.shape[-1])).to(x.dtype)  # odd D: one zero dimension


# -------------------------------------------------------------------------------------------- convolution


@dataclass
class ConvParams:
    kernel_size: int = 4

    def __post_init__(self):
        if self.kernel_size < 2:
            raise ValueError(f"kernel_size: must be >= 2, got {self.kernel_size}")


class CausalConv(PositionEncoding):
    """Position through zero padding: x + DepthwiseConv(x), causal (left padding only). CNNs learn absolute
    position from their padding (Islam et al. 2020, "How Much Position Information Do Convolutional Neural
    Networks Encode?"); the depthwise-convolution form is the conditional positional encoding of Chu et al. 2021
    (arXiv:2102.10882), made causal here. A tap reaching before the start of its document reads zeros — before
    position 0 (the sequence start, or a packed document whose positions restart), or, with ``doc_ids``
    (document masking), into another document although the positions run on — so documents do not leak into
    each other through the embeddings when attention keeps them apart."""

    supports_kv_cache = False  # taps read the previous kernel_size − 1 embeddings, which no KV cache holds

    def __init__(self, params: ConvParams, dims: PositionDims):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(params.kernel_size, dims.d_model) * 0.02)  # (K, D); tap m: x[t-m]

    def embed(self, x: Tensor, positions: Tensor, doc_ids: Optional[Tensor] = None) -> Tensor:
        T = x.shape[1]
        out = x
        for m in range(self.weight.shape[0]):
            shifted = F.pad(x, (0, 0, m, 0))[:, :T]  # x[t - m], zeros before the call's first token
            valid = positions >= m  # (B|1, T): no tap before position 0
            if doc_ids is not None and m > 0:  # nor into the previous document (positions need not restart)
                valid = valid & (F.pad(doc_ids, (m, 0), value=-1)[:, :T] == doc_ids)  # (B, T): doc of t − m is t's
            out = out + shifted * valid.unsqueeze(-1).to(x.dtype) * self.weight[m]
        return out  # (B, T, D)
