"""Per-encoding properties: the formulas and tables the papers give, and the invariances the methods promise."""

import decimal
import math

import pytest
import torch

from minilm.errors import ConfigError
from minilm.model.attention import Attention, AttentionMask, reference_attention, sdpa_attention
from minilm.positions import REGISTRY, PositionDims, build_position, validate_position
from minilm.positions.absolute import sinusoid
from minilm.positions.bias import alibi_slopes, t5_bucket
from minilm.positions.rotary import apply_rotary

from .helpers import V, hook, perturb, tiny_model


def embedding_hook(name, d_model=16, seed=0, **params):
    dims = PositionDims(d_model=d_model, n_heads=2, n_kv_heads=2, head_dim=d_model // 2, n_layers=2, layer=-1)
    torch.manual_seed(seed)
    return perturb(build_position({"name": name, **params}, dims, "embedding"), seed).eval()


def rotated_scores(pos, q, k, q_pos, k_pos):
    q, k = pos.rotate(q, k, q_pos, k_pos)
    return q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)  # (B, H, T, S)


# ------------------------------------------------------------------------------------------ rotary family


@pytest.mark.parametrize("name", ["rope", "xpos"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rotary_scores_depend_on_the_offset_only(name, layout, fraction):
    pos = hook(name, layout=layout, fraction=fraction)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    p = torch.arange(12)[None]
    base = rotated_scores(pos, q, k, p, p)
    for shift in (5, 300):
        assert torch.allclose(rotated_scores(pos, q, k, p + shift, p + shift), base, atol=1e-4, rtol=1e-4)


def test_xpos_score_is_rope_times_the_decay():
    """q = k = 1: pair i contributes 2·cos(dθ_i) under RoPE and 2·ζ_i^(d/scale_base)·cos(dθ_i) under xPos,
    ζ_i = (2i/Dh + γ)/(1 + γ) (Sun et al. 2022, eq. 6), whatever the absolute positions."""
    xpos = hook("xpos", scale_base=8.0, gamma=0.4)
    q = k = torch.ones(1, 1, 1, 8)
    theta = 10000.0 ** (-torch.arange(0, 8, 2) / 8)
    zeta = (torch.arange(0, 8, 2) / 8 + 0.4) / 1.4
    for n, m in [(5, 0), (40, 3), (1003, 1000)]:
        d = n - m
        got = rotated_scores(xpos, q, k, torch.tensor([[n]]), torch.tensor([[m]])).item()
        want = (2 * zeta ** (d / 8.0) * torch.cos(d * theta)).sum().item()
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_xpos_with_partial_rotary_factor_equals_xpos_with_fraction():
    """The scaling block's partial_rotary_factor rotates fewer dimensions than ``fraction`` alone: ζ must have one
    entry per frequency that really rotates (it had rot_dim/2 entries, and the first forward failed on the shape)."""
    by_fraction = hook("xpos", fraction=0.5, scale_base=8.0)
    by_factor = hook("xpos", scale_base=8.0, scaling={"rope_type": "default", "partial_rotary_factor": 0.5})
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    p = torch.arange(12)[None]
    torch.testing.assert_close(rotated_scores(by_factor, q, k, p, p), rotated_scores(by_fraction, q, k, p, p))
    assert by_factor.max_length() == by_fraction.max_length()


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_a_phase_that_changes_fraction_rotates_the_new_number_of_dimensions(name):
    """``configure`` (what a phase calls) kept the rotary dimensions computed when the module was built, so a
    phase's ``fraction`` was silently ignored (its log line said it applied)."""
    from minilm.positions.rotary import RopeParams, XposParams

    params = {"rope": RopeParams, "xpos": XposParams}[name]
    phased, fresh = hook(name), hook(name, fraction=0.5)
    phased.configure(params(fraction=0.5))
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 4, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    p = torch.arange(12)[None]
    assert phased.rot_dim == fresh.rot_dim == 4
    torch.testing.assert_close(rotated_scores(phased, q, k, p, p), rotated_scores(fresh, q, k, p, p))


def test_xpos_refuses_inputs_whose_decay_leaves_fp32_range():
    """ζ_0^(span/scale_base) overflows fp32 once positions span ~70 scale_bases (at the defaults ζ_0 = 0.4/1.4):
    the scores were NaN at 74K tokens. Within the limit the scores are finite; beyond it rotate raises, naming
    the parameters that raise the limit."""
    xpos = hook("xpos", scale_base=8.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 1, 8, generator=g), torch.randn(1, 2, 2, 8, generator=g)
    fits = xpos.max_span
    assert fits == pytest.approx(80 * 8.0 / math.log(1.4 / 0.4), abs=2) and xpos.max_length() == fits + 1
    ok = rotated_scores(xpos, q, k, torch.tensor([[fits]]), torch.tensor([[0, fits]]))
    assert torch.isfinite(ok).all()
    with pytest.raises(RuntimeError, match=r"xpos: .*model\.position\.scale_base \(now 8\) or gamma \(now 0\.4\)"):
        rotated_scores(xpos, q, k, torch.tensor([[fits + 1]]), torch.tensor([[0, fits + 1]]))
    # the span is per row: rows that sit far apart, each within the limit, are fine
    q2, k2 = q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1)
    q_pos, k_pos = torch.tensor([[fits], [5 * fits]]), torch.tensor([[0, fits], [4 * fits, 5 * fits]])
    far = rotated_scores(xpos, q2, k2, q_pos, k_pos)
    assert torch.isfinite(far).all()


@pytest.mark.parametrize("gamma, scale_base, limit",
                         [(0.4, 1e30, None), (1e30, 512.0, None), (1e-46, 8.0, 7), (1e46, 1e-47, 9)])
def test_xpos_at_an_extreme_gamma_or_scale_base_is_the_decay_it_defines(gamma, scale_base, limit):
    """ζ_i^(d/scale_base) from ln ζ: a huge gamma rounded ζ_0 to 1 (the span limit divided by ln 1: a
    ZeroDivisionError when the model was built), a huge scale_base gave a limit past int64 (an OverflowError in
    rotate), and a gamma below fp32's smallest number rounded ζ_0 to 0 (0^(−x) = inf: NaN scores); a scale_base
    below it was 0 in fp32 (d/0: NaN scores), as was ln ζ at the gamma beside it. The first two have no limit (the
    decay is ~1 at any distance); each score is RoPE's times the decay, ln ζ computed here in 60 digits."""
    xpos = hook("xpos", gamma=gamma, scale_base=scale_base)
    q = k = torch.ones(1, 1, 1, 8)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    with decimal.localcontext(decimal.Context(prec=60)):
        g = decimal.Decimal(gamma)
        log_zeta = torch.tensor([float(((decimal.Decimal(i) / 8 + g) / (1 + g)).ln()) for i in range(0, 8, 2)],
                                dtype=torch.float64)
    got = rotated_scores(xpos, q, k.expand(1, 1, 2, 8), torch.tensor([[5]]), torch.tensor([[0, 5]]))[0, 0, 0]
    for j, d in enumerate((5, 0)):
        want = (2 * torch.exp(d / scale_base * log_zeta) * torch.cos(d * theta)).sum().item()
        assert got[j].item() == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert xpos.max_length() == limit


def test_xpos_at_a_tiny_scale_base_is_finite_up_to_its_max_length():
    """Positions n apart took the decay exponent n/scale_base in fp32, which overflows for a tiny scale_base that
    still fits several positions (gamma 1e37, scale_base 1.3e-38: 11): NaN scores 10 tokens apart. The rate
    ln ζ/scale_base is formed in float64 instead, and n · rate stays within ±80 up to max_length."""
    xpos = hook("xpos", gamma=1e37, scale_base=1.3e-38)
    n = xpos.max_length() - 1
    q = k = torch.ones(1, 1, 1, 8)
    got = rotated_scores(xpos, q, k.expand(1, 1, 2, 8), torch.tensor([[n]]), torch.tensor([[0, n]]))
    assert n == 10 and torch.isfinite(got).all()


def test_xpos_is_finite_up_to_its_max_length_with_a_dense_mask():
    """A masked pair (key m after query n) carries ζ^(−(m − n)/scale_base) whatever the center, and SDPA with a
    dense mask (document masking, queries after cached keys) adds −inf to it: past about half the old limit it
    overflowed, inf − inf = NaN rows, while max_length() still promised the length."""
    xpos = hook("xpos", scale_base=8.0, n_kv_heads=4)
    T = xpos.max_length()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, T, 8, generator=g) for _ in range(3))
    p = torch.arange(T)[None]
    q, k = xpos.rotate(q, k, p, p)
    docs = torch.zeros(1, T, dtype=torch.long)  # one document: the plain causal mask, but dense
    out = sdpa_attention(q, k, v, xpos, AttentionMask(q_doc=docs, k_doc=docs))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference_attention(q, k, v, xpos, p, p, AttentionMask()), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name, params", [("xpos", {"scale_base": 8.0}), ("floater", {"cache_size": 50})])
def test_bounded_encodings_report_their_limit(name, params):
    """max_length() is what the phases, generation and the evaluation suite check lengths against: a sequence of
    exactly that length runs, one token more is refused by the encoding itself."""
    model = tiny_model(name, *(f"model.position.{k}={v}" for k, v in params.items()))
    limit = min(m.max_length() for m in [model.pos_emb, *model.position_modules()] if m.max_length() is not None)
    with torch.no_grad():
        assert torch.isfinite(model(torch.zeros(1, limit, dtype=torch.long))).all()
        with pytest.raises(Exception, match="raise model.position.scale_base|raise cache_size"):  # (what to do)
            model(torch.zeros(1, limit + 1, dtype=torch.long))


def test_floaters_limit_message_names_the_positions_it_integrates():
    """cache_size=50 integrates positions 0..49: the message called 50 "the last position the ODE is integrated to"."""
    model = tiny_model("floater", "model.position.cache_size=50")
    with torch.no_grad(), pytest.raises(Exception, match=r"position 50 is beyond model\.position\.cache_size=50, "
                                                          r"the number of positions the ODE is integrated over "
                                                          r"\(0\.\.49\)"):  # fmt: skip
        model(torch.zeros(1, 51, dtype=torch.long))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_interleaved_is_half_up_to_a_fixed_permutation(fraction):
    """Interleaved pairs (2i, 2i+1) are half's pairs (i, i + d/2): permuting dims maps one rotation onto the
    other, for the rotated dims; the pass-through dims stay where they are."""
    half = hook("rope", layout="half", fraction=fraction)
    inter = hook("rope", layout="interleaved", fraction=fraction)
    dr = half.rot_dim
    perm = torch.arange(8)
    perm[:dr] = torch.stack([torch.arange(dr // 2), torch.arange(dr // 2) + dr // 2], -1).flatten()
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 10, 8, generator=g), torch.randn(2, 2, 10, 8, generator=g)
    p = torch.arange(3, 13)[None].expand(2, -1)
    qh, kh = half.rotate(q, k, p, p)
    qi, ki = inter.rotate(q[..., perm], k[..., perm], p, p)
    assert torch.allclose(qi, qh[..., perm], atol=1e-6) and torch.allclose(ki, kh[..., perm], atol=1e-6)
    scores_inter = rotated_scores(inter, q[..., perm], k[..., perm], p, p)
    assert torch.allclose(rotated_scores(half, q, k, p, p), scores_inter, atol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_rotates_each_pair_as_roformer(layout):
    """RoFormer (Su et al. 2021, eq. 14): pair i of a vector at position m becomes R(m·θ_i)·(x_a, x_b) with
    R(φ) = [[cos φ, −sin φ], [sin φ, cos φ]], θ_i = base^(−2i/d); the pair is (2i, 2i + 1) interleaved and
    (i, i + d/2) half. The direction matters once weights move between implementations (GPT-NeoX / LLaMA
    rotate this way too); the offset-only test above cannot see it."""
    pos = hook("rope", layout=layout, base=100.0)
    x = torch.randn(1, 1, 1, 8)
    m = 3
    got = pos.rotate(x, x[:, :1], torch.tensor([[m]]), torch.tensor([[m]]))[0][0, 0, 0]
    for i in range(4):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + 4)
        phi = torch.tensor(m * 100.0 ** (-2 * i / 8))
        xa, xb = x[0, 0, 0, a], x[0, 0, 0, b]
        assert got[a].item() == pytest.approx((xa * phi.cos() - xb * phi.sin()).item(), abs=1e-5)
        assert got[b].item() == pytest.approx((xa * phi.sin() + xb * phi.cos()).item(), abs=1e-5)


def test_apply_rotary_keeps_the_pass_through_dims():
    x = torch.randn(1, 1, 3, 8)
    cos, sin = torch.zeros(1, 1, 3, 2), torch.ones(1, 1, 3, 2)
    assert torch.equal(apply_rotary(x, cos, sin, "half")[..., 4:], x[..., 4:])


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_fraction_that_rotates_nothing_names_fraction(name):
    """fraction · head_dim below 2 rotates no dimension: the error names model.position.fraction (not the scaling
    block's partial_rotary_factor, which the user never set)."""
    with pytest.raises(ConfigError, match=r"model\.position\.fraction: 0\.1 of head_dim 8 rotates 0") as e:
        hook(name, fraction=0.1)
    assert "partial_rotary_factor" not in str(e.value)


# every encoding but rope and xpos with fraction 1 (which rotate every dimension of a head in pairs), and those two
# with a partial fraction (⌊0.6 · 5⌋ = 3, rounded down to 2 rotated dimensions)
ODD_HEAD_WIDTH = [(n, []) for n in REGISTRY if n not in ("rope", "xpos")] + [
    (n, ["model.position.fraction=0.6"]) for n in ("rope", "xpos")
]


@pytest.mark.parametrize("name, overrides", ODD_HEAD_WIDTH, ids=[n for n, _ in ODD_HEAD_WIDTH])
def test_an_odd_head_width_trains_where_no_pair_of_dimensions_rotates_together(name, overrides, monkeypatch):
    """Head width 5 (d_model 15, 3 heads): refused for every encoding once, although only a rotation of every
    dimension in pairs needs it even. Each other one runs forward and backward, and its fast path equals the
    reference; the sinusoidal tables (of d_model, here odd too) and complex order's (B, T, D/2) parts fit."""
    model = tiny_model(name, "model.d_model=15", "model.n_heads=3", "model.n_kv_heads=1", *overrides)
    assert model.blocks[0].attn.head_dim == 5
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model(x)
    logits.square().mean().backward()
    assert torch.isfinite(logits).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    monkeypatch.setattr(Attention, "kernel", lambda self, device, documents=False: "reference")
    with torch.no_grad():
        torch.testing.assert_close(model(x), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_an_odd_head_width_is_refused_where_every_dimension_rotates_in_pairs(name):
    with pytest.raises(ConfigError, match=rf"model\.position\.fraction: 1 rotates every dimension of a head, and "
                                          rf"'{name}' rotates them in pairs .* must be even, got 5"):  # fmt: skip
        tiny_model(name, "model.d_model=10", "model.n_heads=2")


def test_complex_order_needs_a_pair_of_dimensions():
    """At d_model 1 complex order has no (cos, sin) pair to give, and replaced every embedding with 0: the model saw
    no input (refused by the even head width rule before, which no longer applies to it)."""
    with pytest.raises(ConfigError, match=r"^model\.position\.name: complex_order .* needs model\.d_model >= 2, got 1"):
        tiny_model("complex_order", "model.d_model=1", "model.n_heads=1", "model.n_kv_heads=1")
    assert tiny_model("complex_order", "model.d_model=3", "model.n_heads=1", "model.n_kv_heads=1") is not None


def test_nope_every_leaves_every_nth_layer_unrotated():
    model = tiny_model("rope", "model.position.nope_every=2")
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    p = torch.arange(5)[None]
    first, second = (b.attn.pos for b in model.blocks)
    assert first.rotates and not second.rotates
    assert torch.equal(second.rotate(q, k, p, p)[0], q) and not torch.equal(first.rotate(q, k, p, p)[0], q)


SHIFT_INVARIANT = ["rope", "xpos", "alibi", "t5", "kerple", "shaw", "transformer_xl", "deberta", "cope", "none"]


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
def test_relative_encodings_ignore_a_common_shift(name):
    """For encodings of i − j only, offsetting every position changes no logit."""
    model = tiny_model(name)
    x = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(4))
    p = torch.arange(20)[None]
    with torch.no_grad():
        assert torch.allclose(model(x, positions=p), model(x, positions=p + 57), atol=1e-4)


# ------------------------------------------------------------------------------------------- ALiBi and T5


def press_slopes(n):
    """The ALiBi authors' recursive get_slopes (github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", range(1, 65))
def test_alibi_slopes(n):
    slopes = alibi_slopes(n)
    assert slopes.shape == (n,)
    assert torch.allclose(slopes.double(), torch.tensor(press_slopes(n), dtype=torch.float64), rtol=1e-6)
    if math.log2(n).is_integer():
        want = torch.tensor([2 ** (-8 * i / n) for i in range(1, n + 1)], dtype=torch.float64)
        assert torch.allclose(slopes.double(), want, rtol=1e-6)


def test_alibi_bloom_interleaved_slopes_for_12_heads():
    # 8 power-of-two slopes 2^-1..2^-8, then the odd powers of 2^-0.5 for the 4 extra heads
    want = [2.0**-i for i in range(1, 9)] + [2.0 ** (-0.5 * i) for i in (1, 3, 5, 7)]
    assert torch.allclose(alibi_slopes(12).double(), torch.tensor(want, dtype=torch.float64))


def test_alibi_bias_is_minus_slope_times_distance():
    pos = hook("alibi")
    p = torch.arange(6)[None]
    bias = pos.score(None, None, p, p, None)
    assert torch.allclose(bias[0, 2, 5, 1], -alibi_slopes(4)[2] * 4)


def test_alibi_max_bias_keeps_every_slope_a_normal_fp32_number():
    """The smallest slope is 2^−max_bias for any number of heads: up to max_bias 126 every slope is a normal fp32
    number; a larger one rounded slopes toward 0 (1e6: all of them) and is refused, naming the largest allowed."""
    tiny = torch.finfo(torch.float32).tiny
    assert all(alibi_slopes(n, 126.0).min().item() == tiny for n in range(1, 65))
    with pytest.raises(ConfigError, match=r"model\.position\.max_bias: must be at most 126 .*, got 126\.5"):
        validate_position({"name": "alibi", "max_bias": 126.5})


def test_t5_bidirectional_32_buckets_128_distance():
    d = torch.arange(0, 31)
    want = list(range(8)) + [8] * 4 + [9] * 4 + [10] * 7 + [11] * 8  # 0..7, 8..11, 12..15, 16..22, 23..30
    assert t5_bucket(d, 32, 128, bidirectional=True).tolist() == want
    assert t5_bucket(-d[1:], 32, 128, bidirectional=True).min() >= 16  # keys after the query: the upper half
    assert t5_bucket(torch.tensor([10_000]), 32, 128, bidirectional=True).item() == 15


def test_t5_causal_buckets():
    d = torch.arange(-5, 500)
    b = t5_bucket(d, 32, 128, bidirectional=False)
    assert (b[d < 0] == 0).all()  # the future shares bucket 0 (masked anyway)
    assert b[(d >= 0) & (d < 16)].tolist() == list(range(16))  # exact distances
    assert (b.diff() >= 0).all() and b.max() == 31 and (b[d >= 128] == 31).all()


def test_t5_bias_reads_the_bucket_table():
    pos = hook("t5", num_buckets=8, max_distance=12)
    p = torch.arange(40)[None]
    bias = pos.score(None, None, p, p, None)  # (1, H, 40, 40)
    buckets = t5_bucket(p[0, :, None] - p[0, None, :], 8, 12)
    assert torch.equal(bias[0], pos.table[buckets].permute(2, 0, 1))


# ----------------------------------------------------------------------------------- KERPLE, FIRE, DeBERTa


def test_kerple_coefficients_stay_positive():
    pos = hook("kerple")
    with torch.no_grad():
        pos.raw_r1.fill_(-50.0)
        pos.raw_r2.fill_(-50.0)
    r1, r2 = pos.coefficients()
    assert (r1 > 0).all() and (r2 > 0).all()
    p = torch.arange(8)[None]
    assert (pos.score(None, None, p, p, None) <= 0).all()



def kerple_power_reference(a, p, T):
    """The bias kernel of the authors' ParallelKerplePower (chijames/KERPLE) with learned a and p: −a·(i − j)^p on
    and below the diagonal (their distance matrix is zero above it); a and p (H, 1, 1)."""
    i = torch.arange(T, dtype=torch.float32)
    return -a * (i[:, None] - i[None, :]).clamp(min=0) ** p


def test_kerple_power_kernel_is_the_authors():
    pos = hook("kerple", kernel="power", n_heads=4)
    a, p = pos.coefficients()
    T = 24
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    got = pos.score(None, None, torch.arange(T)[None], torch.arange(T)[None], None)[0]  # (H, T, T)
    want = kerple_power_reference(a.view(-1, 1, 1), p.view(-1, 1, 1), T)
    torch.testing.assert_close(got[:, causal], want[:, causal])
    with torch.no_grad():  # the exponent stays in [eps, 2] however far training pushes it
        pos.raw_r2.copy_(torch.tensor([-50.0, 50.0, 0.0, 3.0]))
    p = pos.coefficients()[1]
    assert p.min() >= 0.01 and p.max() <= 2.0 and p[1] > 1.99


def test_kerple_power_initializes_like_the_authors_and_trains_through_distance_zero():
    # ParallelKerplePower: a ~ U(0, 1), p ~ U(0, 2), both clamped at eps
    torch.manual_seed(0)
    pos = hook("kerple", kernel="power", n_heads=4096)
    pos.reset_position_parameters()  # (hook() perturbs the parameters)
    a, p = (c.detach() for c in pos.coefficients())
    assert a.min().item() == pytest.approx(0.01, rel=1e-4) and 0.95 < a.max() <= 1.0 + 1e-5
    assert p.min().item() == pytest.approx(0.01, rel=1e-3) and 1.9 < p.max() <= 2.0
    q_pos = torch.arange(6)[None]
    pos.score(None, None, q_pos, q_pos, None).sum().backward()  # |0|^p at d = 0: a zero gradient, not NaN
    assert torch.isfinite(pos.raw_r1.grad).all() and torch.isfinite(pos.raw_r2.grad).all()
    assert pos.raw_r2.grad.abs().sum() > 0


@pytest.mark.parametrize("table", [True, False])
def test_kerple_power_score_mod_equals_score(table):
    pos = hook("kerple", kernel="power")
    pos.flex_distance_table = table
    q_pos = k_pos = torch.stack([torch.arange(10), torch.cat([torch.arange(4), torch.arange(6)])])  # (2, 10)
    want = pos.score(None, None, q_pos, k_pos, None)  # (2, H, 10, 10)
    b, h = torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1)
    i, j = torch.arange(10).view(1, 1, 10, 1), torch.arange(10).view(1, 1, 1, 10)
    got = pos.score_mod(None, None, q_pos, k_pos)(torch.zeros(2, 4, 10, 10), b, h, i, j)
    torch.testing.assert_close(got, want)


def test_kerple_refuses_an_unknown_kernel():
    with pytest.raises(ConfigError, match=r"model\.position\.kernel: must be one of \('log', 'power'\)"):
        hook("kerple", kernel="cubic")


def test_kerple_log_eps_is_bounded_where_the_bias_leaves_fp32_s_range():
    """r1, r2 >= eps: the bias at distance 1 is at most −eps·ln(1 + eps), below e^−87.3 (fp32's smallest normal
    weight) past eps 26.38, so a query attends to itself alone and r1, r2 take no gradient; from about 4e36 the bias
    overflowed (NaN gradients) and from 3.4e38 eps itself (a torch traceback building the model). Refused when the
    config is checked; the largest eps allowed still trains."""
    top = hook("kerple", eps=26.38, n_heads=4)
    q_pos = torch.arange(8)[None]
    top.score(None, None, q_pos, q_pos, None).sum().backward()
    assert torch.isfinite(top.raw_r1.grad).all() and top.raw_r1.grad.abs().sum() > 0
    for eps in (26.39, 1e37, 1e39):
        with pytest.raises(ConfigError, match=r"model\.position\.eps: must be <= 26\.38 with kernel log, got"):
            hook("kerple", eps=eps)
    assert 26.38 * math.log1p(26.38) <= 87.34 < 26.39 * math.log1p(26.39)

def test_fire_at_its_largest_init_c_is_finite_up_to_position_2_24():
    """init_c at its bound, fp32's largest number / 2^24: ψ of every position and distance up to 2^24 (the ones fp32
    counts exactly) stays finite, and so does the bias; init_c 1e36 at init_L 1, which bounded c·L alone let pass,
    was NaN from position 341 on."""
    c = float(torch.finfo(torch.float32).max) / 2**24
    fire = hook("fire", init_c=c, init_L=1.0)
    q_pos, k_pos = torch.tensor([[2**24 - 1]]), torch.tensor([[0, 340, 2**24 - 1]])
    with torch.no_grad():
        fire.c.fill_(c)  # (off the perturbation hook applies)
        assert torch.isfinite(fire.score(None, None, q_pos, k_pos, None)).all()
    with pytest.raises(ConfigError, match=r"model\.position\.init_c: init_c · max\(init_L, 2\^24\)"):
        validate_position({"name": "fire", "init_c": 1e36, "init_L": 1.0})


def test_fire_input_is_normalized_at_every_length():
    """ψ(i − j)/ψ(max(L, i)) lies in [0, 1] for every causal pair, however long the sequence: the MLP never sees
    an input outside its training range, which is what lets FIRE extrapolate (Li et al. 2023, §3)."""
    pos = hook("fire", init_L=64.0)
    for n in (16, 1000, 20_000):
        i = torch.tensor([n - 1, n // 2, 0])
        j = torch.tensor([0, n // 3, 0])
        x = pos.normalized(i - j, i)
        assert (x >= 0).all() and (x <= 1 + 1e-5).all()


def test_fire_bias_is_the_mlp_of_the_normalized_distance():
    """b_h(i, j) = f_θ(ψ(i − j) / (ψ(max(L, i)) + eps))_h, ψ(x) = log(|c·x| + 1), f_θ = Linear → ReLU → Linear
    (Li et al. 2023, eq. 8 and their reference code), element by element, with trained-looking c and L."""
    pos = hook("fire", init_L=6.0, init_c=0.3, mlp_width=5)
    with torch.no_grad():
        pos.L_multiplier.fill_(1.5)  # L = 9
    c, L = pos.c.item(), 9.0
    psi = lambda x: math.log(abs(c * x) + 1)  # noqa: E731
    q_pos, k_pos = torch.arange(4, 20)[None], torch.arange(0, 20)[None]  # queries after 4 cached keys
    bias = pos.score(None, None, q_pos, k_pos, None)  # (1, H, 16, 20)
    for i, j in [(0, 0), (3, 1), (10, 2), (15, 19), (15, 0)]:
        qi, kj = 4 + i, j
        x = torch.tensor([psi(qi - kj) / (psi(max(L, qi)) + 1e-6)])
        want = pos.mlp_out(torch.relu(pos.mlp_in(x)))  # (H,)
        torch.testing.assert_close(bias[0, :, i, j], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fire_mlp_by_its_pieces_equals_the_layers(seed):
    """``mlp_pieces`` (A·x + C of the piece x falls in, the CPU path's form) equals Linear → ReLU → Linear in value
    and in the gradients of x and of every MLP parameter: at inputs on both sides of every kink, beyond all of
    them, and at a unit whose w1 is 0 (no kink; on or off by its bias alone)."""
    torch.manual_seed(seed)
    pos = hook("fire", mlp_width=7)
    with torch.no_grad():
        pos.mlp_in.weight[3] = 0.0  # a unit that never turns on or off
        pos.mlp_in.bias[3] = 0.4 if seed % 2 else -0.4
    w1, b1 = pos.mlp_in.weight[:, 0].detach(), pos.mlp_in.bias.detach()
    kinks = (-b1 / w1)[w1 != 0]
    x = torch.cat([kinks - 1e-3, kinks + 1e-3, torch.linspace(-3, 3, 60), torch.rand(40)]).view(4, -1)
    x = x.clone().requires_grad_()
    params = list(pos.mlp_in.parameters()) + list(pos.mlp_out.parameters())
    want = pos.mlp_out(torch.relu(pos.mlp_in(x.unsqueeze(-1)))).movedim(-1, 0)  # the two layers: (H, 4, N)
    got = pos.mlp_pieces(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    out_grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed))
    got_grads, want_grads = (torch.autograd.grad(y, [x, *params], out_grad) for y in (got, want))
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_transformer_xl_terms():
    """(b) + (c) + (d) = ((q_i + v)·W_{K,R}R_{i−j} + u·k_j) / √Dh, R the sinusoids of width d_model."""
    pos = hook("transformer_xl", n_kv_heads=4)
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 4, 6, 8, generator=g), torch.randn(1, 4, 6, 8, generator=g)
    p = torch.arange(10, 16)[None]
    bias = pos.score(q, k, p, p, None)
    for h, i, j in [(0, 5, 0), (3, 2, 2), (1, 1, 4)]:
        r = pos.w_kr(sinusoid(torch.tensor(i - j), 32)).view(4, 8)[h]
        want = ((q[0, h, i] + pos.v[h]) @ r + pos.u[h] @ k[0, h, j]) / 8**0.5
        assert bias[0, h, i, j].item() == pytest.approx(want.item(), abs=1e-5)


def test_deberta_terms():
    """c2p + p2c = (Q^c_i·K^r_{δ(i,j)} + K^c_j·Q^r_{δ(j,i)}) / √(3·Dh)."""
    pos = hook("deberta", n_kv_heads=4, max_distance=3)
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 4, 8, 8, generator=g)
    p = torch.arange(8)[None]
    bias = pos.score(q, k, p, p, None)
    kr, qr = pos.w_kr(pos.rel).view(6, 4, 8), pos.w_qr(pos.rel).view(6, 4, 8)
    delta = lambda a, b: min(max(a - b, -2), 3) + 2  # noqa: E731  clip to (−3, 3] -> [0, 6)
    for h, i, j in [(0, 7, 0), (2, 3, 2), (1, 0, 5)]:
        want = (q[0, h, i] @ kr[delta(i, j), h] + k[0, h, j] @ qr[delta(j, i), h]) / (3 * 8) ** 0.5
        assert bias[0, h, i, j].item() == pytest.approx(want.item(), abs=1e-5)


def test_deberta_distance_clipping_and_scale():
    pos = hook("deberta", max_distance=4)
    assert pos.bucket(torch.tensor([-100, -3, 0, 4, 100])).tolist() == [0, 0, 3, 7, 7]  # (−k, k] -> [0, 2k)
    assert pos.softmax_scale(8) == pytest.approx((3 * 8) ** -0.5)


# ------------------------------------------------------------------------------------------------ absolute


def test_sinusoidal_formula():
    d, p = 10, torch.arange(0, 50)
    pe = sinusoid(p, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    emb = embedding_hook("sinusoidal", d_model=10, scale=1.0)
    assert torch.allclose(emb.embed(torch.zeros(1, 50, 10), p[None]), pe[None])


def test_floater_reproduces_positions_at_any_length():
    emb = embedding_hook("floater", hidden=8, substeps=2)
    short = emb.trajectory(16)
    with torch.no_grad():
        long = emb.trajectory(64)
        cached = emb.trajectory(64)
    assert torch.equal(short, long[:16]) and torch.equal(long, cached)
    assert not torch.allclose(long[1], long[40])  # positions really differ
    x = torch.zeros(1, 64, 16)
    assert torch.equal(emb.embed(x[:, :16], torch.arange(16)[None]), emb.embed(x, torch.arange(64)[None])[:, :16])


def test_floater_goes_on_from_its_cached_trajectory():
    """KV-cache decoding asks for one position more per token: the trajectory cached for the same parameters is
    continued (RK4's four evaluations of h per step and position), not integrated again from t = 0 — which made each
    decoded token cost the whole trajectory — and equals a fresh one bit for bit."""
    emb = embedding_hook("floater", hidden=8, substeps=2)
    integrate, calls = emb.dynamics, []
    emb.dynamics = lambda t, p: calls.append(t) or integrate(t, p)
    with torch.no_grad():
        emb.trajectory(10)
        calls.clear()
        longer = emb.trajectory(13)
        assert len(calls) == 3 * 2 * 4  # 3 new positions, 2 substeps each
        assert torch.equal(longer, emb._integrate(13)) and torch.equal(emb.trajectory(5), longer[:5])


def test_floater_cache_is_not_kept_across_a_fused_optimizer_step():
    """The fused AdamW the trainer uses does not bump a parameter's _version: the trajectory cached by one
    validation was read again by the next one (and by the end-of-phase evaluation) after training steps."""
    emb = embedding_hook("floater", hidden=8)
    opt = torch.optim.AdamW(emb.parameters(), lr=0.1, fused=True)
    with torch.no_grad():
        before = emb.trajectory(8)  # a validation: cached
    emb.trajectory(8).square().sum().backward()  # a training step
    opt.step()
    with torch.no_grad():
        after, fresh = emb.trajectory(8), emb._integrate(8)
    assert not torch.equal(before, fresh) and torch.equal(after, fresh)


def test_learned_table_limit_message():
    model = tiny_model("learned")
    with torch.no_grad():
        model(torch.zeros(1, 32, dtype=torch.long))  # exactly max_positions: fine
    with pytest.raises(Exception, match=r"position 32 .*max_positions=32"):
        with torch.no_grad():
            model(torch.zeros(1, 10, dtype=torch.long), positions=torch.arange(23, 33)[None])


def test_multiplicative_is_a_product():
    emb = embedding_hook("multiplicative", amplitude=0.5)
    x, p = torch.randn(2, 9, 16), torch.arange(9)[None]
    assert torch.allclose(emb.embed(x, p), x * (1 + 0.5 * sinusoid(p, 16)))


def test_complex_order_formula():
    emb = embedding_hook("complex_order")
    x, p = torch.randn(1, 7, 16), torch.arange(7)[None]
    r, w, th = emb.amplitude(x), emb.frequency(x), emb.phase(x)
    phi = w * p[..., None] + th
    assert torch.allclose(emb.embed(x, p), torch.cat([r * phi.cos(), r * phi.sin()], -1), atol=1e-6)


@pytest.mark.parametrize("name", ["complex_order", "floater"])
def test_position_features_stay_fp32_under_autocast(name):
    """bf16 autocast (bf16-mixed training, the GPU default) must not compute an encoding's position features in
    bf16: complex_order's phase ω·k + θ would be off by up to 2 rad at k ≈ 300 (neighbouring positions sharing
    one phase), and FLOATER's ODE would be integrated with bf16 steps."""
    emb = embedding_hook(name, d_model=16)
    x, p = torch.randn(1, 8, 16), torch.arange(300, 308)[None]
    with torch.no_grad():
        want = emb.embed(x, p)
        emb._cache = None  # FLOATER: integrate again, under autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = emb.embed(x, p)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_conv_does_not_leak_across_restarted_documents():
    emb = embedding_hook("conv", kernel_size=4)
    x = torch.randn(1, 12, 16)
    p = torch.cat([torch.arange(5), torch.arange(7)])[None]  # two packed documents
    y = x.clone()
    y[:, :5] += 1.0  # change the first document only
    assert torch.equal(emb.embed(x, p)[:, 5:], emb.embed(y, p)[:, 5:])
    assert not torch.allclose(emb.embed(x, p)[:, :5], emb.embed(y, p)[:, :5])


# --------------------------------------------------------------------------------------------------- CoPE


def test_cope_matches_the_definition():
    """p_ij = min(Σ_{t=j..i} σ(z_it), npos_max − 1); term = interpolation of q_i·e[⌊p⌋], q_i·e[⌈p⌉]."""
    pos = hook("cope", npos_max=4)
    T = 6
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, T, 8, generator=g), torch.randn(1, 4, T, 8, generator=g)
    z = (q @ k.transpose(-1, -2)) / 8**0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    masked = z.masked_fill(~causal, float("-inf"))
    got = pos.score(q, k, None, None, masked)
    e = pos.pos_emb  # (Dh, npos)
    for h in range(4):
        for i in range(T):
            for j in range(i + 1):
                p = min(sum(torch.sigmoid(z[0, h, i, t]).item() for t in range(j, i + 1)), 3.0)
                lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
                want = (1 - w) * (q[0, h, i] @ e[:, lo]) + w * (q[0, h, i] @ e[:, hi])
                assert got[0, h, i, j].item() == pytest.approx(want.item(), abs=1e-5)


def test_shaw_key_term():
    """q_i·R^K[clip(i − j, −k, k)] / √Dh, one table shared by the heads."""
    pos = hook("shaw", max_distance=2)
    q = torch.randn(1, 4, 6, 8)
    p = torch.arange(6)[None]
    bias = pos.score(q, None, p, p, None)
    for h, i, j in [(0, 5, 0), (1, 3, 2), (3, 0, 4)]:
        want = q[0, h, i] @ pos.rel_k[min(max(i - j, -2), 2) + 2] / 8**0.5
        assert bias[0, h, i, j].item() == pytest.approx(want.item(), abs=1e-5)


def test_floater_integrates_eagerly_under_compile():
    """train.compile unrolled FLOATER's integration loop into the graph, ~40 ops per position (inductor then compiled
    for over 8 minutes at seq_len 64 on CPU); it runs eagerly, and gradients still reach its parameters."""
    from torch._dynamo.testing import CompileCounter

    emb = embedding_hook("floater", hidden=8)
    ops = []
    for T in (4, 12):
        torch._dynamo.reset()
        counter = CompileCounter()
        x = torch.randn(1, T, 16)
        got = torch.compile(emb.embed, backend=counter)(x, torch.arange(T)[None])
        ops.append(counter.op_count)
    assert ops[0] == ops[1], f"the compiled graph grows with the length: {ops} ops"
    want = emb.embed(x, torch.arange(12)[None])
    got.square().sum().backward()
    compiled_grads = [p.grad.clone() for p in emb.parameters()]
    emb.zero_grad()
    want.square().sum().backward()
    assert all(torch.allclose(a, p.grad) for a, p in zip(compiled_grads, emb.parameters()))
    torch._dynamo.reset()
