"""Relative biases: a term added to the attention logits that depends on (head, query position, key position)
only — ALiBi, T5 buckets, KERPLE, FIRE.

Every class here has ``score_kind = "bias"`` and ``score_reads_qk = False``: ``score`` materializes the
(B|1, H, T, S) term for SDPA's mask and the fp32 reference path, and ``score_mod`` returns the same term as a
FlexAttention ``score_mod(score, b, h, i, j)`` that reads the position tensors inside the kernel, so no T×S bias
exists on the CUDA path. ``i`` and ``j`` are indices; positions are looked up as q_pos[b, i], k_pos[b, j].

The learned biases of one distance only (T5, KERPLE) give the kernel a per-step table with one entry per
distance the positions can produce, built outside it: FlexAttention's backward adds the gradient of every score
element into the captured tensor it read with one atomic add (pytorch/pytorch#137452), so reading KERPLE's
r1[h] and r2[h], or T5's one far-distance entry, directly would send a whole block's adds to one address per
head; through the table, neighbouring elements add into neighbouring entries, and autograd takes the table's
gradient to the parameters outside the kernel. ``flex_distance_table = False`` restores the direct form, for
scripts/bench_attention.py to compare the two (``--no-flex-table``).

Adds into one entry still meet: a block's elements on one diagonal all add into that distance's entry, and FIRE's
per-query and per-piece entries take a whole row's or block's adds. ``FLEX_TABLE_COPIES`` = R > 1 gives every
learned table the kernel reads (T5's, KERPLE's, FIRE's four) R copies, (H, n) -> (H, R, n), and each score element
reads the copy its indices pick, so the adds that met at one entry spread over R of them; autograd sums the copies'
gradients outside the kernel. The copy is (i + b) mod R for tables of the distance (the elements of one diagonal
have distinct i), (j + b) mod R for FIRE's per-query table (a row's elements have distinct j) and (i + j + b) mod R
for FIRE's pieces (any elements); b, the batch row, also sends the rows of a batch, which the kernel runs side by
side and which read the same entries, to different copies. Exact for every R; whether it is faster is the GPU's to
say (scripts/bench_attention.py ``--flex-table-copies``), so the default stays 1: the tables as measured.

Convention: the relative distance is d = i − j = q_pos − k_pos (≥ 0 for the keys a causal query sees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minilm.positions.base import (
    FP32_LOG_TINY,
    FP32_MAX,
    FP32_POSITIONS,
    FP32_TINY,
    SMALL_FLEX_BLOCKS,
    FlexCoefficients,
    FlexPart,
    PositionDims,
    PositionEncoding,
    check_in_fp32,
)


FLEX_TABLE_COPIES = 1  # copies of each learned table a score_mod reads (the module docstring)
INT64_MAX = torch.iinfo(torch.int64).max  # positions are int64


def flex_copies(table: Tensor) -> Tensor:
    """(H, n) -> (H, R, n), R = ``FLEX_TABLE_COPIES``, each copy its own memory (the backward's atomic adds land in
    them); the table itself when R is 1."""
    R = FLEX_TABLE_COPIES
    return table if R == 1 else table.unsqueeze(1).expand(-1, R, -1).contiguous()


def copy_index(table: Tensor, spread: Tensor) -> tuple:
    """The index of the copy a score element reads in a ``flex_copies`` table, as a tuple to splice between the head
    and the entry: (spread mod R,), or () for a table without copies."""
    return (spread % table.shape[1],) if table.dim() == 3 else ()


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """d = q_pos − k_pos: (B, T), (B, S) -> (B, 1, T, S), in the positions' dtype (long; fp32 where given fp32)."""
    return (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).unsqueeze(1)


def _position_span(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """(lowest, highest) of the query and key positions, as 0-dim tensors (no host sync)."""
    return torch.minimum(q_pos.min(), k_pos.min()), torch.maximum(q_pos.max(), k_pos.max())


def assert_distances_within(q_pos: Tensor, k_pos: Tensor, n: int, name: str) -> None:
    """Fail unless every |q_pos − k_pos| is at most ``n``: true whenever positions lie in [0, S) (training, the KV
    cache, restarted documents), false only for positions a caller spread further apart. Asynchronous on the GPU
    (no host sync; a device-side assert when it fails) and traced into a compiled graph."""
    lo, hi = _position_span(q_pos, k_pos)
    torch._assert_async(hi - lo <= n, f"{name}: query and key positions lie more than {n} apart; "
                        f"its per-distance table covers 0..{n} (positions within [0, {n + 1}) always fit)")


def assert_positions_within(q_pos: Tensor, k_pos: Tensor, n: int, name: str) -> None:
    """Fail unless every position lies in [0, ``n``]: true for training, the KV cache and restarted documents
    (positions within [0, S)). Asynchronous on the GPU, as ``assert_distances_within``."""
    lo, hi = _position_span(q_pos, k_pos)
    torch._assert_async((lo >= 0) & (hi <= n), f"{name} on FlexAttention: a position lies outside [0, {n}]; its "
                        f"per-position tables cover 0..{n} (positions within [0, {n + 1}) always fit)")


def _inv_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


# --------------------------------------------------------------------------------------------------- ALiBi


def alibi_slopes(n_heads: int, max_bias: float = 8.0) -> Tensor:
    """Press et al. 2022, "Train Short, Test Long" (ALiBi): for n a power of two, head i (1-based) gets slope
    2^(−max_bias·i/n). Otherwise, as BLOOM's ``build_alibi_tensor`` computes it: the 2^⌊log2 n⌋ power-of-two
    slopes, then the odd-indexed slopes of the 2·2^⌊log2 n⌋ sequence for the remaining heads (the same list as
    the ALiBi authors' recursive ``get_slopes``)."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-max_bias / closest)
    slopes = [base**i for i in range(1, closest + 1)]
    if closest != n_heads:
        extra_base = 2.0 ** (-max_bias / (2 * closest))
        remaining = min(closest, n_heads - closest)
        slopes += [extra_base**i for i in range(1, 2 * remaining, 2)]
    return torch.tensor(slopes, dtype=torch.float32)  # (H,)


# The smallest slope is 2^−max_bias whatever the number of heads (``alibi_slopes``): at 126 it is fp32's smallest
# normal number; beyond, the slopes round toward 0 (max_bias 1e6: all of them, a model without positions)
ALIBI_MAX_BIAS = -math.log2(FP32_TINY)


@dataclass
class AlibiParams:
    max_bias: float = 8.0  # the 8 in 2^(−8i/n)

    def __post_init__(self):
        check_in_fp32("max_bias", self.max_bias, ALIBI_MAX_BIAS,
                      "the smallest slope, 2^−max_bias for any number of heads, is then fp32's smallest normal number; "
                      "beyond, the slopes round to 0 and leave no positions")


class Alibi(PositionEncoding):
    """ALiBi (Press et al. 2022, arXiv:2108.12409): logits − m_h · (i − j), fixed head-specific slopes m_h."""

    score_kind = "bias"
    score_reads_qk = False

    def __init__(self, params: AlibiParams, dims: PositionDims):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(dims.n_heads, params.max_bias), persistent=False)  # (H,)

    def score(self, q, k, q_pos, k_pos, logits):
        # distances in fp32 from the start (exact below 2^24): no (B, 1, T, S) int64 pass and conversion
        return -self.slopes.view(1, -1, 1, 1) * relative_distance(q_pos.float(), k_pos.float())  # (B, H, T, S)

    def score_mod(self, q, k, q_pos, k_pos):
        slopes = self.slopes

        def alibi(score, b, h, i, j):
            return score - slopes[h] * (q_pos[b, i] - k_pos[b, j]).float()

        return alibi


# ------------------------------------------------------------------------------------------------------ T5


def t5_bucket(distance: Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False):
    """Raffel et al. 2020 (T5), ``_relative_position_bucket`` with d = i − j (T5's relative_position is j − i).

    Half the buckets (per direction) hold exact distances 0..max_exact−1; the rest are log-spaced up to
    ``max_distance``, beyond which everything shares the last bucket. Causal (``bidirectional=False``): keys
    after the query (d < 0) fall in bucket 0. Bidirectional: keys after the query use the upper half."""
    relative_position = -distance  # T5's j − i
    buckets = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        relative_position = relative_position.abs()
    else:
        relative_position = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    log_ratio = torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, relative_position, large)


def t5_thresholds(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, ...]:
    """The smallest distance of each log-spaced bucket (per direction), as ``t5_bucket`` computes the buckets (in
    fp32, on the CPU): a distance r >= 0 falls in bucket min(r, max_exact) + #{t : t <= r}. Integer comparisons give
    every device and kernel the same bucket, where fp32 logs of near-ties (max_distance 939 of 32 buckets, at 728)
    could round either way. One binary search per bucket over [max_exact, max_distance]: ``t5_bucket`` is monotone
    in the distance, and reaches the last bucket by max_distance."""
    per_side = num_buckets // 2 if bidirectional else num_buckets
    wanted = torch.arange(per_side // 2 + 1, per_side, device="cpu")  # the log-spaced buckets after the first (on the
    # CPU, also while a model is built on the meta device to count its memory: ``.item`` of a meta tensor fails)
    lo, hi = torch.full_like(wanted, per_side // 2), torch.full_like(wanted, max_distance)
    while bool((lo < hi).any()):
        mid = lo + (hi - lo) // 2  # (lo + hi wraps in int64 at a max_distance near 2^63)
        reached = t5_bucket(mid, per_side, max_distance) >= wanted
        lo, hi = torch.where(reached, lo, mid + 1), torch.where(reached, mid, hi)
    return tuple(int(t) for t in lo)


@dataclass
class T5Params:
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = False  # False: causal bucketing, as in T5's decoder

    def __post_init__(self):
        if self.num_buckets < 2 or (self.bidirectional and self.num_buckets < 4):
            raise ValueError(f"num_buckets: must be >= 2 (>= 4 bidirectional), got {self.num_buckets}")
        exact = self.num_buckets // (4 if self.bidirectional else 2)
        if self.max_distance <= exact:  # named with num_buckets: a user who raised that alone meets this
            raise ValueError(
                f"max_distance: must exceed the {exact} exact buckets of num_buckets {self.num_buckets} (the first "
                f"{'quarter' if self.bidirectional else 'half'}), got {self.max_distance}; raise max_distance or "
                "lower num_buckets"
            )
        if self.max_distance > INT64_MAX:  # (clamping a distance at it overflowed: an OverflowError from torch)
            raise ValueError(f"max_distance: must be at most {INT64_MAX} (2^63 − 1: positions, and so distances, are "
                             f"int64, and none lies further apart), got {self.max_distance}")


class T5Bias(PositionEncoding):
    """T5 relative attention bias (Raffel et al. 2020, arXiv:1910.10683, §2.1): a learned scalar per head per
    log-spaced bucket of i − j. Convention: every layer owns its table (T5 shares the first layer's)."""

    score_kind = "bias"
    score_reads_qk = False
    no_weight_decay = ("table",)  # a bias per head and bucket
    flex_distance_table = True  # one table entry per distance in [−(S − 1), S − 1] (the module docstring)
    flex_split = False  # FlexAttention over near and far keys (``flex_parts``); scripts/bench_attention.py --flex-split

    def __init__(self, params: T5Params, dims: PositionDims):
        super().__init__()
        self.params = params
        self.table = nn.Parameter(torch.randn(params.num_buckets, dims.n_heads) * 0.02)  # (buckets, H)
        # Not where the model is built on the meta device to count its parameters (minilm.training.memory), which
        # never runs it (None: it cannot): the search holds a tensor per bucket on the CPU, so num_buckets 2^40 died
        # there with an allocation error before the count could refuse the model's 2^40-row table, naming the sizes
        self.thresholds = None if self.table.is_meta else t5_thresholds(
            params.num_buckets, params.max_distance, params.bidirectional)
        # The smallest distance of every bucket after the first, per side: 1..max_exact (the exact buckets), then
        # the thresholds; a tensor that moves with the module, for ``buckets``' one search (not saved: derived)
        max_exact = params.num_buckets // (4 if params.bidirectional else 2)
        starts = torch.empty(0, dtype=torch.long) if self.thresholds is None else torch.cat(
            [torch.arange(1, max_exact + 1), torch.tensor(self.thresholds, dtype=torch.long)])
        self.register_buffer("bucket_starts", starts, persistent=False)

    def _side(self, distance: Tensor) -> tuple:
        """(the first bucket of the distance's side, |distance| r clamped to max_distance, the exact buckets'
        count)."""
        p = self.params
        if p.bidirectional:  # keys after the query (d < 0): the upper half
            d = distance.clamp(-p.max_distance, p.max_distance)
            return (d < 0).long() * (p.num_buckets // 2), d.abs(), p.num_buckets // 4
        return 0, distance.clamp(0, p.max_distance), p.num_buckets // 2  # keys after the query: bucket 0

    def buckets(self, distance: Tensor) -> Tensor:
        """``t5_bucket`` of each distance, from integer comparisons with ``thresholds`` (``t5_thresholds``): the
        same bucket on every device and in every kernel. min(r, max_exact) + #{t : t <= r} is the number of
        ``bucket_starts`` at most r: one binary search per distance (``torch.bucketize``, right=True: ties count),
        where a pass over the (B, 1, T, S) distances per threshold (15 for 32 causal buckets) took 5 to 20 times as
        long on CPU."""
        side, r, _ = self._side(distance)
        return side + torch.bucketize(r, self.bucket_starts, right=True)

    def kernel_buckets(self, distance: Tensor) -> Tensor:
        """``buckets`` of one score element's distance inside a FlexAttention score_mod, by a comparison per
        threshold: in the kernel a distance is a scalar in a register, where the comparisons cost next to nothing
        (and need no search op of the kernel's compiler)."""
        side, r, max_exact = self._side(distance)
        bucket = r.clamp(max=max_exact) + side
        for t in self.thresholds:
            bucket = bucket + (r >= t).long()
        return bucket

    @staticmethod
    def reach(n: int, scores: int) -> Optional[int]:
        """``n`` where a per-step table of the distances −n..n (n >= max_distance: a distance clamped into it reads
        its own bucket, for any positions) is no larger than the ``scores`` it serves; else None: each score takes
        its bucket from ``buckets``, exact as well. A step then costs what its lengths need whatever max_distance
        is: a table of every distance to max_distance 10^10 was 160 GB."""
        return n if 2 * n + 1 <= scores else None

    def by_distance(self, n: Optional[int]) -> Tensor:
        """(H, 2n+1) fp32: the bias of every distance in [−n, n], computed once per step; n None: (H, num_buckets),
        the bias of every bucket (``index``)."""
        if n is None:
            return self.table.float().t()
        return self.table[self.buckets(torch.arange(-n, n + 1, device=self.table.device))].float().t()

    def index(self, distance: Tensor, n: Optional[int]) -> Tensor:
        """Where each distance reads ``by_distance(n)``: its entry among −n..n (clamped), or (n None) its bucket."""
        return self.buckets(distance) if n is None else distance.clamp(-n, n) + n

    def score(self, q, k, q_pos, k_pos, logits):
        d = relative_distance(q_pos, k_pos)  # (B, 1, T, S)
        n = self.reach(self.params.max_distance, d.numel())
        d, table = self.index(d, n), self.by_distance(n)
        H = table.shape[0]
        # gather from the per-step table rather than index the parameter per (b, i, j): the backward is then one
        # scatter_add into it (3x faster on CPU at T = 2048 than advanced indexing's index_put)
        bias = table.gather(1, d.reshape(1, -1).expand(H, -1))  # (H, B·T·S)
        return bias.view(H, d.shape[0], *d.shape[2:]).transpose(0, 1)  # (B, H, T, S)

    def score_mod(self, q, k, q_pos, k_pos):
        m = self.params.max_distance
        n = max(m, k_pos.shape[-1] - 1) if self.flex_distance_table else m  # exact for any positions (clamped)
        return self._reading(self.reach(n, q_pos.shape[0] * q_pos.shape[-1] * k_pos.shape[-1]), q_pos, k_pos)

    def _reading(self, n: Optional[int], q_pos: Tensor, k_pos: Tensor):
        """The score_mod adding the bias of ``by_distance(n)``, each distance read at ``index`` (n None: at its
        ``kernel_buckets``), in ``flex_copies``."""
        table = flex_copies(self.by_distance(n))  # (H, [R,] 2n + 1 or buckets): the per-step table
        entry = self.kernel_buckets if n is None else (lambda d: self.index(d, n))

        def t5(score, b, h, i, j):
            return score + table[(h, *copy_index(table, i + b), entry(q_pos[b, i] - k_pos[b, j]))]

        return t5

    def flex_kernel_options(self):
        """``SMALL_FLEX_BLOCKS`` when split (its near part did not fit the H100's shared memory in the default
        blocks); else the default blocks, in which the one call compiles."""
        return SMALL_FLEX_BLOCKS if self.flex_split else None

    def flex_parts(self, q, k, q_pos, k_pos):
        """With ``flex_split`` (causal bucketing only; None otherwise): the keys within max_distance m of the query
        (d < m), with the bias of each distance from a (H, 2m + 1) table (or of its bucket: ``reach``), and the far
        keys (d >= m), whose bias is one value per head — the last bucket's — given to their part as a ``shift`` of
        its log-sum-exp. Exact; and the backward's atomic adds fall to the near keys alone (about m + 128 per query,
        against all T), the far bucket's gradient coming through the merge instead. Not measured yet, so off by
        default."""
        if not self.flex_split or self.params.bidirectional:
            return None
        m = self.params.max_distance
        n = self.reach(m, q_pos.shape[0] * q_pos.shape[-1] * k_pos.shape[-1])
        # (H,): the bias of every d >= m, in the last bucket (every threshold is <= m): a Python int, for dynamo's
        # graph (a bucketize of a 0-dim tensor there is a data-dependent index)
        far = self.table[self.params.num_buckets - 1].float()

        def is_near(b, h, i, j):
            return q_pos[b, i] - k_pos[b, j] < m

        def is_far(b, h, i, j):
            return q_pos[b, i] - k_pos[b, j] >= m

        return [FlexPart(is_near, self._reading(n, q_pos, k_pos)), FlexPart(is_far, None, far)]


# -------------------------------------------------------------------------------------------------- KERPLE


KERPLE_KERNELS = ("log", "power")
KERPLE_POWER_MAX = 2.0  # the power kernel's exponent r2 lies in (0, 2]: |d|^r2 is conditionally positive definite


def _largest_log_eps() -> float:
    """The eps at which eps·ln(1 + eps) = FP32_LOG_TINY (bisection: the product increases with eps)."""
    lo, hi = 0.0, FP32_LOG_TINY
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid * math.log1p(mid) <= FP32_LOG_TINY else (lo, mid)
    return lo


# The log kernel's largest eps (26.38, rounded down to be printed as it is checked): with r1, r2 >= eps every key but
# the query's own is at least eps·ln(1 + eps) below it, and past e^−87.3 its weight is no normal fp32 number, so the
# query attends only to itself and r1, r2 take no gradient (further up, from eps ≈ 4e36, the bias overflows: NaN)
KERPLE_LOG_EPS_MAX = math.floor(100 * _largest_log_eps()) / 100


@dataclass
class KerpleParams:
    eps: float = 1e-2  # lower bound of r1 and r2
    kernel: str = "log"  # log: −r1·log(1 + r2·|d|) (the paper's best); power: −r1·|d|^r2, r2 <= 2

    def __post_init__(self):
        check_in_fp32("eps", self.eps, math.inf)  # (its upper bound depends on the kernel: below)
        if self.kernel not in KERPLE_KERNELS:
            raise ValueError(f"kernel: must be one of {KERPLE_KERNELS}, got {self.kernel!r}")
        if self.kernel == "power" and self.eps >= KERPLE_POWER_MAX:
            raise ValueError(f"eps: must be < {KERPLE_POWER_MAX:g} with kernel power (r2 in [eps, 2]), got {self.eps}")
        if self.kernel == "log" and self.eps > KERPLE_LOG_EPS_MAX:
            raise ValueError(
                f"eps: must be <= {KERPLE_LOG_EPS_MAX:g} with kernel log, got {self.eps:g}: r1, r2 >= eps put every "
                f"key but the query's own at least eps·ln(1 + eps) = {self.eps * math.log1p(self.eps):.3g} below it, "
                f"past fp32's smallest normal weight (e^−{FP32_LOG_TINY:.1f}): the query would attend only to itself, "
                "and r1, r2 would take no gradient"
            )


class Kerple(PositionEncoding):
    """KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation",
    arXiv:2205.09921): logits + k(i − j) with r1, r2 > 0 learned per head and the kernel

        log (default):  k(d) = −r1 · log(1 + r2·|d|)        (the authors' ParallelKerpleLog)
        power:          k(d) = −r1 · |d|^r2,  r2 <= 2       (ParallelKerplePower, its bias kernel)

    Convention: positivity by r = eps + softplus(raw), and the power kernel's r2 <= 2 by
    r2 = eps + (2 − eps)·sigmoid(raw) (the authors clamp the raw values into [eps, 2] after each step instead).
    Initialized like the authors' code, clamped at eps: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 ~ U(0, 1),
    r2 ~ U(0, 2). Each layer owns its r1, r2 (the authors' code builds one module and hands it to every layer)."""

    score_kind = "bias"
    score_reads_qk = False
    flex_distance_table = True  # the bias read from by_distance(S − 1) (the module docstring)
    # FlexAttention's kernel adds no gradient into r1, r2: they take theirs from two extra forwards in backward
    # (``flex_coefficients``). Not measured on a GPU yet, so off by default.
    flex_coefficient_forwards = False

    def __init__(self, params: KerpleParams, dims: PositionDims):
        super().__init__()
        self.eps, self.kernel = params.eps, params.kernel
        self.raw_r1 = nn.Parameter(torch.zeros(dims.n_heads))  # (H,)
        self.raw_r2 = nn.Parameter(torch.zeros(dims.n_heads))
        self.reset_position_parameters()

    def reset_position_parameters(self) -> None:
        with torch.no_grad():
            H = self.raw_r1.shape[0]
            top1, top2 = (2.0, 1.0) if self.kernel == "log" else (1.0, KERPLE_POWER_MAX)  # the authors' scales
            self.raw_r1.copy_(self._raw_positive((torch.rand(H) * top1).clamp(min=self.eps)))
            r2 = (torch.rand(H) * top2).clamp(min=self.eps)
            self.raw_r2.copy_(self._raw_positive(r2) if self.kernel == "log" else self._raw_exponent(r2))

    def _raw_positive(self, r: Tensor) -> Tensor:
        """raw with eps + softplus(raw) = r, for r >= eps: the authors' draws, clamped at eps as their code clamps
        them (softplus never reaches 0, so r = eps itself becomes eps·(1 + 1e-6))."""
        return _inv_softplus((r - self.eps).clamp(min=1e-6 * self.eps))

    def _raw_exponent(self, r: Tensor) -> Tensor:
        """raw with eps + (2 − eps)·sigmoid(raw) = r, for r in [eps, 2]."""
        return torch.logit((r - self.eps) / (KERPLE_POWER_MAX - self.eps), eps=1e-6)

    def coefficients(self) -> tuple[Tensor, Tensor]:
        """(r1, r2), (H,) each, fp32."""
        r1 = self.eps + F.softplus(self.raw_r1.float())
        if self.kernel == "log":
            return r1, self.eps + F.softplus(self.raw_r2.float())
        return r1, self.eps + (KERPLE_POWER_MAX - self.eps) * torch.sigmoid(self.raw_r2.float())

    def bias(self, r1: Tensor, r2: Tensor, distance: Tensor) -> Tensor:
        """k(d) for a fp32 distance, broadcast."""
        if self.kernel == "log":
            return -r1 * torch.log1p(r2 * distance.abs())
        return -r1 * distance.abs().pow(r2)  # 0 at d = 0 (r2 > 0); pow passes r2 a zero gradient there

    def coefficient_weights(self, r1: Tensor, r2: Tensor, distance: Tensor) -> tuple[Tensor, Tensor]:
        """(−∂k/∂r1, −∂k/∂r2) at a fp32 distance >= 0, each >= 0 at whole distances (``flex_coefficients``)."""
        if self.kernel == "log":
            return torch.log1p(r2 * distance), r1 * distance / (1 + r2 * distance)
        power = distance.pow(r2)  # ∂/∂r2 of −r1·d^r2 is −r1·d^r2·log d: 0 at d = 1, and taken as 0 at d = 0
        return power, torch.where(distance > 1, r1 * power * torch.log(distance.clamp(min=1)), 0.0)

    def flex_coefficients(self, q, k, q_pos, k_pos):
        """With ``flex_coefficient_forwards``: the bias read from ``by_distance`` detached, and r1, r2 with the
        score_mods of log −∂k/∂r (``FlexCoefficients``). Refuses positions further apart than S − 1, as
        ``score_mod``."""
        if not self.flex_coefficient_forwards:
            return None
        r1, r2 = self.coefficients()
        n = k_pos.shape[-1] - 1
        assert_distances_within(q_pos, k_pos, n, "KERPLE on FlexAttention")
        table = self.by_distance(n).detach()  # (H, S)
        a1, a2 = r1.detach(), r2.detach()

        def weighted(which: int):
            def mod(score, b, h, i, j):
                d = (q_pos[b, i] - k_pos[b, j]).abs().clamp(max=n)
                w = self.coefficient_weights(a1[h], a2[h], d.float())[which]
                return score + table[h, d] + torch.log(w)

            return mod

        return FlexCoefficients(self._reading(table, n, q_pos, k_pos), (r1, r2), (weighted(0), weighted(1)))

    def score(self, q, k, q_pos, k_pos, logits):
        r1, r2 = (c.view(1, -1, 1, 1) for c in self.coefficients())
        return self.bias(r1, r2, relative_distance(q_pos.float(), k_pos.float()))  # (B, H, T, S)

    def by_distance(self, n: int) -> Tensor:
        """(H, n + 1) fp32: the bias of every distance 0..n."""
        r1, r2 = (c.unsqueeze(1) for c in self.coefficients())
        return self.bias(r1, r2, torch.arange(n + 1, device=r1.device, dtype=torch.float32))

    def score_mod(self, q, k, q_pos, k_pos):
        if not self.flex_distance_table:
            r1, r2 = self.coefficients()

            def kerple_direct(score, b, h, i, j):
                return score + self.bias(r1[h], r2[h], (q_pos[b, i] - k_pos[b, j]).float())

            return kerple_direct
        n = k_pos.shape[-1] - 1
        assert_distances_within(q_pos, k_pos, n, "KERPLE on FlexAttention")
        return self._reading(flex_copies(self.by_distance(n)), n, q_pos, k_pos)

    @staticmethod
    def _reading(table: Tensor, n: int, q_pos: Tensor, k_pos: Tensor):
        """The score_mod adding ``table``'s bias, (H, [R,] n + 1) for the distances 0..n (``by_distance(n)``, in
        ``flex_copies`` or not)."""

        def kerple(score, b, h, i, j):
            d = (q_pos[b, i] - k_pos[b, j]).abs().clamp(max=n)
            return score + table[(h, *copy_index(table, i + b), d)]

        return kerple


# ---------------------------------------------------------------------------------------------------- FIRE


@dataclass
class FireParams:
    mlp_width: int = 32
    init_c: float = 0.1  # ψ(x) = log(c·x + 1), c learned
    init_L: float = 512.0  # the threshold L of max(L, i), learned through a multiplier (initially 1)
    eps: float = 1e-6

    def __post_init__(self):
        if self.mlp_width < 1:
            raise ValueError(f"mlp_width: must be >= 1, got {self.mlp_width}")
        # c and L are fp32 parameters, and ψ(x) = ln(c·|x| + 1) is taken of L, of every query position and of every
        # distance: an overflowing c·x makes it inf, the input inf/inf = NaN (and the gradients NaN); a c that is 0 in
        # fp32 makes every ψ 0 (and takes no gradient). Checked up to 2^24, the positions fp32 counts exactly: with
        # c·L alone bounded, init_c 1e36 at init_L 1 passed and gave NaN scores from position 341 on
        check_in_fp32("init_c", self.init_c)
        check_in_fp32("init_L", self.init_L)
        reach = max(self.init_L, FP32_POSITIONS)
        if self.init_c * reach > FP32_MAX:
            raise ValueError(f"init_c: init_c · max(init_L, 2^24) must be at most {FP32_MAX:.3g} (fp32's largest "
                             f"number), got {self.init_c * reach:.3g}: ψ(x) = ln(c·|x| + 1) of L, or of a position or "
                             "distance up to 2^24 (the positions fp32 counts exactly), would overflow: NaN scores")
        check_in_fp32("eps", self.eps)


class Fire(PositionEncoding):
    """FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers", arXiv:2310.04418): b_h(i, j) = f_θ(ψ(i − j) / ψ(max(L, i)))_h with ψ(x) = log(c·|x| + 1)
    and f_θ an MLP 1 → width → H (ReLU). Normalizing by the *query position* i (not the training length) puts the
    input in [0, 1] at every length, which is what lets FIRE extrapolate; L (learned) keeps short prefixes from
    being over-stretched. Follows the paper's reference code: L = |multiplier · init_L|, ψ(max(L, i)) + eps."""

    score_kind = "bias"
    score_reads_qk = False

    def __init__(self, params: FireParams, dims: PositionDims):
        super().__init__()
        self.params = params
        self.mlp_in = nn.Linear(1, params.mlp_width)
        self.mlp_out = nn.Linear(params.mlp_width, dims.n_heads)
        self.c = nn.Parameter(torch.tensor(params.init_c))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(params.init_L), persistent=False)

    def flex_kernel_options(self):
        """``SMALL_FLEX_BLOCKS``: in inductor's default blocks FIRE's score_mod did not fit the H100's shared memory
        (bf16, head size 64: 409,600 bytes asked for, 232,448 there)."""
        return SMALL_FLEX_BLOCKS

    def reset_position_parameters(self) -> None:
        self.mlp_in.reset_parameters()  # PyTorch's Linear init, as the paper's code (not the model's N(0, 0.02))
        self.mlp_out.reset_parameters()
        with torch.no_grad():
            self.c.fill_(self.params.init_c)
            self.L_multiplier.fill_(1.0)

    def log_terms(self, distance: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
        """(ψ(i − j), ψ(max(L, i)) + eps) elementwise (fp32): the numerator and denominator of ``normalized``."""
        threshold = (self.L_multiplier * self.init_L).abs()
        num = torch.log(torch.abs(self.c * distance.float()) + 1)
        den = torch.log(torch.abs(self.c * torch.maximum(query.float(), threshold)) + 1) + self.params.eps
        return num, den

    def normalized(self, distance: Tensor, query: Tensor) -> Tensor:
        """ψ(i − j) / ψ(max(L, i)) elementwise (fp32)."""
        num, den = self.log_terms(distance, query)
        return num / den

    def score(self, q, k, q_pos, k_pos, logits):
        x = self.normalized(relative_distance(q_pos, k_pos), q_pos.unsqueeze(1).unsqueeze(-1))  # (B, 1, T, S)
        return self.mlp_pieces(x.squeeze(1)).transpose(0, 1)  # (B, H, T, S)

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """f_θ's linear pieces, built from the parameters (differentiably): a ReLU MLP of one input is piecewise
        linear in it, with a kink where a hidden unit turns on or off (x = −b1/w1), so between kinks
        f_θ(x) = A·x + C with A = Σ over the units on of w2·w1 and C = b2 + Σ w2·b1. Returns (kinks (W,)
        ascending, without gradient; slopes A (H, W + 1); intercepts C (H, W + 1)): piece p, the number of kinks
        below x, is f_θ(x) = A[:, p]·x + C[:, p]."""
        w1, b1 = self.mlp_in.weight[:, 0].float(), self.mlp_in.bias.float()  # (W,)
        w2, b2 = self.mlp_out.weight.float(), self.mlp_out.bias.float()  # (H, W), (H,)
        W = w1.shape[0]
        with torch.no_grad():  # which units are on in which piece: piece p lies between the p-th and (p+1)-th kink
            kinks = torch.where(w1 != 0, -b1 / w1, torch.full_like(w1, float("inf")))
            edges, order = kinks.sort()
            rank = torch.empty_like(order).scatter_(0, order, torch.arange(W, device=w1.device))
            piece = torch.arange(W + 1, device=w1.device).unsqueeze(1)  # (W + 1, 1)
            on = torch.where(w1 > 0, rank < piece, torch.where(w1 < 0, rank >= piece, b1 > 0)).float()  # (W + 1, W)
        return edges, w2 @ (on * w1).t(), w2 @ (on * b1).t() + b2.unsqueeze(1)

    def mlp_pieces(self, x: Tensor) -> Tensor:
        """f_θ(x) for every element of a fp32 x (...) -> (H, ...), by its pieces (``pieces``): each x gathers its
        piece's slope and intercept — one search among W kinks and 2H values per element, where the layers made
        (..., W) activations (FIRE at 2048 tokens: 4 GB without query blocks). The gradient is the MLP's: of the
        slopes and intercepts by a scatter_add, of x by the slope."""
        edges, slopes, intercepts = self.pieces()
        H = slopes.shape[0]
        index = torch.searchsorted(edges, x.detach().reshape(-1).contiguous())  # (N,): kinks below x
        rows = torch.cat([slopes, intercepts]).gather(1, index.unsqueeze(0).expand(2 * H, -1))  # (2H, N)
        return (rows[:H] * x.reshape(1, -1) + rows[H:]).view(H, *x.shape)

    def score_mod(self, q, k, q_pos, k_pos):
        """The bias from tables the kernel indexes, each captured tensor that requires gradients read once (what
        FlexAttention's backward supports, and one atomic add per element into it): ψ(|d|) per head and distance
        and ψ(max(L, i)) + eps per head and query position, for 0..S − 1 (positions within [0, S) always fit);
        then the kinks (no gradient) pick x's piece and its slope and intercept. Equal to ``score``: the same ψ
        values, and f_θ by its pieces as ``mlp_pieces``."""
        n = k_pos.shape[-1] - 1
        assert_positions_within(q_pos, k_pos, n, "FIRE")
        steps = torch.arange(n + 1, device=q_pos.device, dtype=torch.float32)
        edges, slopes, intercepts = self.pieces()
        # ψ(d) for d = 0..n and ψ(max(L, i)) + eps for i = 0..n, a row per head: inductor (torch 2.11, H100) fails
        # to compile the backward's atomic add into a one-dimensional table indexed per element
        log_distance, log_query = (t.expand(slopes.shape[0], -1).contiguous() for t in self.log_terms(steps, steps))
        log_distance, log_query, slopes, intercepts = map(flex_copies, (log_distance, log_query, slopes, intercepts))
        width = edges.shape[0]

        def fire(score, b, h, i, j):
            query = q_pos[b, i]
            x = (log_distance[(h, *copy_index(log_distance, i + b), (query - k_pos[b, j]).abs().clamp(max=n))]
                 / log_query[(h, *copy_index(log_query, j + b), query.clamp(0, n))])  # fmt: skip
            piece = (edges[0] < x).to(torch.int64)
            for u in range(1, width):  # the kinks below x, unrolled into pointwise compares
                piece = piece + (edges[u] < x).to(torch.int64)
            at = copy_index(slopes, i + j + b)
            return score + slopes[(h, *at, piece)] * x + intercepts[(h, *at, piece)]

        return fire
