"""Documented properties of the position encodings that mutation testing found no other test would notice breaking
(each test names the behaviour it pins; the docstrings and docs/positions.md state it)."""

import math

import pytest
import torch

from minilm.errors import ConfigError
from minilm.model.attention import Attention, AttentionMask, reference_attention
from minilm.positions import PositionDims, build_position, compute_rope, validate_position
from minilm.positions.absolute import NegativePosition, sinusoid
from minilm.positions.base import positions_like
from minilm.positions.bias import t5_bucket
from minilm.positions.rotary import Rope, RopeParams, apply_rotary, cos_sin_tables
from minilm.positions.training_free import build_extension

from .helpers import perturb


def embedding_hook(name, d_model=16, seed=0, **params):
    dims = PositionDims(d_model=d_model, n_heads=2, n_kv_heads=2, head_dim=d_model // 2, n_layers=2, layer=-1)
    torch.manual_seed(seed)
    return perturb(build_position({"name": name, **params}, dims, "embedding"), seed).eval()


# ------------------------------------------------------------------------------------------------ absolute


@pytest.mark.parametrize("name, params", [("learned", {"max_positions": 8}), ("floater", {"hidden": 8})])
@pytest.mark.parametrize("positions", [[-1, 0, 1], [-3, -2]])
def test_encodings_that_index_by_position_refuse_negative_positions(name, params, positions):
    """A negative index silently read the table (or FLOATER's trajectory) from its end: position −1 was the last
    row, and FLOATER's −1 among 0, 1 was p(1); positions all negative were an IndexError from torch. The learned
    table's refusal named the largest position as "beyond the table". Both now name the negative one."""
    emb = embedding_hook(name, **params)
    x = torch.zeros(1, len(positions), 16)
    with pytest.raises(NegativePosition, match=rf"position {min(positions)} is negative: the {name} encoding .*>= 0"):
        emb.embed(x, torch.tensor([positions]))


def test_sinusoidal_scale_multiplies_the_table():
    p, x = torch.arange(20)[None], torch.zeros(1, 20, 16)
    emb = embedding_hook("sinusoidal", scale=2.5)
    assert torch.allclose(emb.embed(x, p), 2.5 * sinusoid(p, 16))


def test_sinusoidal_refuses_a_scale_whose_squares_overflow_the_norms():
    """Each block's RMSNorm sums d_model squares of the embeddings in fp32: from scale 2.3e18 at d_model 128 (4.6e18
    at 32) the sum overflowed, every norm was 0 and the logits constant, silently. The encoding is refused when built,
    naming the key and the bound for the model's width, √(3.4e38 / d_model); at the bound the norm is finite."""
    with pytest.raises(ConfigError, match=r"model\.position\.scale: must be at most 1\.63e\+18 \(√\(3\.4e38 / d_model "
                                          r"128\): .*, got 2\.4e\+18"):  # fmt: skip
        embedding_hook("sinusoidal", d_model=128, scale=2.4e18)
    # and when the config loads, saying where the value was set (it was found only as the model was built)
    from minilm.config import load_config

    with pytest.raises(ConfigError, match=r"model\.position\.scale: must be at most 1\.63e\+18 .*, got 2\.4e\+18 "
                                          r"\(set on the command line\)$"):  # fmt: skip
        load_config(None, ["model.d_model=128", "model.position={name: sinusoidal, scale: 2.4e18}"])
    p = torch.arange(64)[None]
    for width, scale in ((128, 1.63e18), (32, 3.26e18)):
        x = embedding_hook("sinusoidal", d_model=width, scale=scale).embed(torch.zeros(1, 64, width), p)
        assert torch.nn.RMSNorm(width)(x).pow(2).mean().item() == pytest.approx(1.0, rel=1e-4)


def test_the_sinusoidal_table_is_as_large_as_the_token_embeddings_by_default():
    """Added unscaled (RMS 0.71) to token embeddings of RMS 0.02 (model.init_std), it drowned them: the shipped
    configs/positions/sinusoidal.yaml learned less in 150 steps than no position at all. By default its RMS is now
    the embeddings'."""
    p, x = torch.arange(512)[None], torch.zeros(1, 512, 16)
    for std in (0.02, 0.05):
        dims = PositionDims(d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, n_layers=2, layer=-1, init_std=std)
        table = build_position({"name": "sinusoidal"}, dims, "embedding").embed(x, p)
        assert table.pow(2).mean().sqrt().item() == pytest.approx(std, rel=1e-3)


def test_sinusoidal_and_multiplicative_use_their_base():
    p, x = torch.arange(20)[None], torch.randn(1, 20, 16)
    table = sinusoid(p, 16, base=100.0)
    assert not torch.allclose(table, sinusoid(p, 16))  # the base matters at these positions
    assert torch.allclose(embedding_hook("sinusoidal", base=100.0, scale=1.0).embed(x, p), x + table)
    multiplicative = embedding_hook("multiplicative", base=100.0, amplitude=0.5)
    assert torch.allclose(multiplicative.embed(x, p), x * (1 + 0.5 * table))


def test_complex_order_frequencies_start_at_the_sinusoidal_ones():
    # ω's bias starts at base^(−2i/D), the sinusoids' frequencies, so every dimension rotates at its own rate
    dims = PositionDims(d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, n_layers=2, layer=-1)
    emb = build_position({"name": "complex_order", "base": 100.0}, dims, "embedding")
    i = torch.arange(8, dtype=torch.float64)
    torch.testing.assert_close(emb.frequency.bias.double(), 100.0 ** (-2 * i / 16), rtol=1e-6, atol=0)


def test_complex_order_pads_an_odd_width_with_one_zero_dimension_last():
    # odd D: D/2 = 7 complex dimensions [r cos, r sin] fill the first 14; the 15th is the one zero dimension
    odd = embedding_hook("complex_order", d_model=15)
    out = odd.embed(torch.randn(1, 5, 15), torch.arange(5)[None])
    assert torch.equal(out[..., 14], torch.zeros(1, 5)) and out[..., 0].abs().min() > 0


def test_floater_integrates_its_ode_accurately():
    """p(nΔ) solves dp/dt = h(t, p): with h independent of p, h(t) = W·tanh(a·t) + b, the solution is
    p0 + W·log(cosh(a·t))/a + b·t, which RK4 (4th order) reaches within ~1e-6 at Δ = 0.1 — a wrong stage weight or
    a time offset is off by far more."""
    d, hidden, a = 4, 3, 1.5
    emb = embedding_hook("floater", d_model=d, hidden=hidden, delta=0.1, substeps=1)
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(d, hidden, generator=g), torch.randn(d, generator=g)
    with torch.no_grad():
        emb.h_in.weight.zero_()
        emb.h_in.weight[:, -1] = a  # the last input is t: every hidden unit is tanh(a·t)
        emb.h_in.bias.zero_()
        emb.h_out.weight.copy_(W)
        emb.h_out.bias.copy_(b)
        traj = emb.trajectory(30).double()
    t = torch.arange(30, dtype=torch.float64)[:, None] * 0.1
    want = emb.p0.double() + torch.log(torch.cosh(a * t)) / a * W.double().sum(1) + b.double() * t
    assert torch.allclose(traj, want, atol=1e-4), (traj - want).abs().max()


def test_floater_starts_as_large_as_the_token_embeddings():
    """With h's output layer initialized like every matrix, p(n) drifted to RMS 0.23 over 128 positions and 12 over
    2048 at delta 0.1 (ten to hundreds of times the token embeddings' 0.02) and drowned them, as the unscaled
    sinusoids did. It starts at rest now: p(n) = p0, of RMS model.init_std, at every position, however far the
    trajectory reaches; and h still learns from the first step."""
    p, x = torch.arange(32)[None], torch.zeros(1, 32, 16)
    for std in (0.02, 0.05):
        dims = PositionDims(d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, n_layers=2, layer=-1, init_std=std)
        torch.manual_seed(0)
        emb = build_position({"name": "floater", "hidden": 8, "delta": 2.0}, dims, "embedding")  # t up to 62
        added = emb.embed(x, p)  # (1, 32, 16)
        assert added.pow(2).mean(-1).sqrt().max().item() < 2 * std  # at every position, the last included
        assert added.pow(2).mean().sqrt().item() > std / 2
    added.pow(2).sum().backward()
    assert emb.h_out.weight.grad.abs().max() > 0  # at rest, not frozen: the velocity is learned


def test_floater_cache_follows_a_parameter_change():
    # the trajectory is cached without gradients "until a parameter changes": an optimizer step between two
    # evaluations must not leave the old trajectory in use
    emb = embedding_hook("floater", hidden=8)
    with torch.no_grad():
        before = emb.trajectory(12).clone()
        emb.p0.add_(1.0)  # in place, as an optimizer step updates it
        after = emb.trajectory(12)
    assert torch.allclose(after[0], before[0] + 1.0)  # p(0) = p0, moved by the step


@pytest.mark.parametrize("key", ["max_positions", "kernel_size"])
def test_a_boolean_is_not_an_integer_parameter(key):
    # YAML's true is a Python int subclass: max_positions: true must be refused, not read as 1
    name = "learned" if key == "max_positions" else "conv"
    with pytest.raises(ConfigError, match=rf"model\.position\.{key}: must be int, got True"):
        validate_position({"name": name, key: True})


def test_null_for_a_required_parameter_names_the_key():
    # `max_bias:` left empty in YAML is null: a ConfigError naming the key, not a TypeError from a comparison
    with pytest.raises(ConfigError, match=r"model\.position\.max_bias: must not be null"):
        validate_position({"name": "alibi", "max_bias": None})


def test_a_block_without_a_name_lists_the_registered_encodings():
    with pytest.raises(ConfigError, match=r"model\.position\.name: missing; registered encodings: learned, "):
        validate_position({"base": 500.0})


@pytest.mark.parametrize("gamma", [0.0, -0.5])
def test_xpos_refuses_a_gamma_that_is_not_positive(gamma):
    # ζ_0 = γ/(1 + γ) must lie in (0, 1): γ = 0 gives ζ_0 = 0, whose decay is 0 or inf
    with pytest.raises(ConfigError, match=r"model\.position\.gamma: must be > 0"):
        validate_position({"name": "xpos", "gamma": gamma})


def test_positions_like_starts_at_the_offset():
    assert torch.equal(positions_like(torch.zeros(2, 4, 8), offset=3), torch.tensor([[3, 4, 5, 6]]))


# -------------------------------------------------------------------------------------------------- rotary


def test_fraction_rounds_the_rotary_dimensions_down_to_even():
    # 0.375 · 8 = 3 dimensions: two rotate (rounded down to even), the third passes through, and the config is valid
    rope = Rope(RopeParams(fraction=0.375), PositionDims(16, 2, 2, 8, 1))
    assert rope.rot_dim == 2 and rope.inv_freq.shape == (1,)
    q = torch.randn(1, 2, 5, 8)
    p = torch.arange(5)[None]
    rq, _ = rope.rotate(q, q, p, p)
    assert torch.equal(rq[..., 2:], q[..., 2:])
    assert not torch.allclose(rq[..., :2], q[..., :2])


@pytest.mark.parametrize("block", [
    {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
     "short_factor": [1.0] * 4, "long_factor": [2.0, 3.0, 4.0, 5.0]},
])  # fmt: skip
def test_length_dependent_rope_reads_one_plus_the_largest_key_position(block):
    """The current length is 1 + max(k_pos): 17 keys (positions 0..16) are one past the original length 16, so
    the long-context frequencies apply — also to a single query decoded against a KV cache."""
    rope = Rope(RopeParams(scaling=block), PositionDims(16, 2, 2, 8, 1))
    k_pos, q_pos = torch.arange(17)[None], torch.tensor([[16]])
    inv_freq, factor = compute_rope(8, 10000.0, block, seq_len=17)
    assert not torch.equal(inv_freq, compute_rope(8, 10000.0, block, seq_len=16)[0])  # the length matters here
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 8, generator=g), torch.randn(1, 2, 17, 8, generator=g)
    rq, rk = rope.rotate(q, k, q_pos, k_pos)
    torch.testing.assert_close(rq, apply_rotary(q, *cos_sin_tables(q_pos, inv_freq, factor), "half"))
    torch.testing.assert_close(rk, apply_rotary(k, *cos_sin_tables(k_pos, inv_freq, factor), "half"))


def test_compute_rope_refuses_a_length_below_one():
    # a current length is 1 + the largest key position: 0 is a caller's bug, not "the original length"
    block = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
    with pytest.raises(ConfigError, match=r"seq_len: must be >= 1, got 0"):
        compute_rope(8, 10000.0, block, seq_len=0)


def test_compute_rope_names_an_odd_rotary_dimension_not_a_key_left_unset():
    # partial_rotary_factor is not set here: the message must blame the odd dimension count itself
    with pytest.raises(ConfigError, match=r"rotary dimension must be even, got 7"):
        compute_rope(7, 10000.0)


# ---------------------------------------------------------------------------------------------------- biases


def attention_hook(name, n_heads=4, head_dim=8, **params):
    """Unperturbed: the parameters hold their documented initial values."""
    dims = PositionDims(d_model=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim,
                        n_layers=2, layer=0)  # fmt: skip
    return build_position({"name": name, **params}, dims, "attention")


def test_alibi_uses_its_max_bias():
    # head i (1-based) of n = 4 gets slope 2^(−max_bias·i/n): max_bias 4 gives 1/2, 1/4, 1/8, 1/16
    alibi = attention_hook("alibi", max_bias=4.0)
    torch.testing.assert_close(alibi.slopes, torch.tensor([2.0**-1, 2.0**-2, 2.0**-3, 2.0**-4]))


def test_t5_bidirectional_gives_keys_after_the_query_their_own_buckets():
    # bidirectional: keys after the query use the upper half of the buckets (causal bucketing sends them to 0)
    t5 = attention_hook("t5", num_buckets=8, max_distance=16, bidirectional=True)
    perturb(t5)
    q_pos, k_pos = torch.tensor([[0]]), torch.arange(6)[None]  # distances 0, −1, ..., −5
    buckets = t5_bucket(-torch.arange(6), 8, 16, bidirectional=True)
    assert buckets[1:].min() >= 4  # (the upper half: the bucketing itself is checked in test_encodings.py)
    got = t5.score(None, None, q_pos, k_pos, None)[0, :, 0]  # (H, S)
    torch.testing.assert_close(got, t5.table[buckets].t())


def test_fire_normalizes_by_the_threshold_below_it():
    """ψ(i − j) / ψ(max(L, i)): a query before L = 16 divides by ψ(16), not by ψ(i), so a short prefix is not
    stretched to [0, 1]; beyond L it divides by ψ(i)."""
    fire = attention_hook("fire", init_L=16.0, init_c=0.1)
    psi = lambda x: math.log(0.1 * x + 1)  # noqa: E731
    for i, d in ((4, 4), (4, 2), (10, 7), (40, 40), (40, 13)):
        got = fire.normalized(torch.tensor(d), torch.tensor(i)).item()
        assert got == pytest.approx(psi(d) / (psi(max(16, i)) + 1e-6), rel=1e-5), (i, d)
    with torch.no_grad():
        fire.L_multiplier.fill_(-1.0)  # L = |multiplier · init_L|: a multiplier trained through zero keeps L = 16
    got = fire.normalized(torch.tensor(4), torch.tensor(4)).item()
    assert got == pytest.approx(psi(4) / (psi(16) + 1e-6), rel=1e-5)


def test_kerple_initializes_like_the_authors():
    # r1 ~ U(0, 2), r2 ~ U(0, 1), clamped at eps (chijames/KERPLE): over 4096 heads each range is filled from eps
    # nearly to its top. A draw in (eps, 2·eps) keeps its value; one below eps sits on eps.
    torch.manual_seed(0)
    eps = 0.01
    r1, r2 = (r.detach() for r in attention_hook("kerple", n_heads=4096, eps=eps).coefficients())
    for r, top in ((r1, 2.0), (r2, 1.0)):
        assert r.min().item() == pytest.approx(eps, rel=1e-4) and 0.95 * top < r.max() <= top + 1e-5
        assert ((r > 1.05 * eps) & (r < 1.95 * eps)).any()
        on_floor = (r < 1.0001 * eps).float().mean().item()  # P(U(0, top) < eps) = eps / top
        assert 0.3 * eps / top < on_floor < 3 * eps / top


# ------------------------------------------------------------------------------------------- training-free


@pytest.mark.parametrize("name, params", [("rerope", {"window": 2}), ("self_extend", {"group_size": 2, "window": 2}),
                                          ("dca", {"chunk_size": 3, "local_window": 1})])
def test_extension_gives_zeros_for_a_query_that_sees_no_key(name, params):
    """A row with no allowed key (a query whose document has no key yet) gives zeros, not NaN (the merged
    softmax's documented rule), and leaves the other rows finite."""
    method = build_extension(name, params)
    rope = Rope(RopeParams(), PositionDims(16, 2, 2, 8, 1))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    docs = torch.tensor([[0, 0, 0, 0, 0]])
    mask = AttentionMask(q_doc=torch.tensor([[0, 0, 1, 0, 0]]), k_doc=docs)  # query 2 is in a document no key is
    p = torch.arange(5)[None]
    out = method.attend(q, k, v, rope, p, p, mask)
    assert torch.equal(out[:, :, 2], torch.zeros(1, 2, 8))
    assert out.isfinite().all() and out[:, :, 3].abs().sum() > 0


@pytest.mark.parametrize("name", ["cope", "shaw", "none"])
def test_reference_attention_gives_zeros_for_a_query_that_sees_no_key(name):
    # the reference path's documented rule for a fully masked row: zeros, not NaN (value terms included)
    pos = attention_hook(name)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g) for _ in range(3))
    mask = AttentionMask(q_doc=torch.tensor([[0, 0, 1, 0, 0]]), k_doc=torch.zeros(1, 5, dtype=torch.long))
    p = torch.arange(5)[None]
    out = reference_attention(q, k, v, pos, p, p, mask)
    assert torch.equal(out[:, :, 2], torch.zeros(1, 4, 8))
    assert out.isfinite().all() and out[:, :, 3].abs().sum() > 0



@pytest.mark.parametrize("name, params", [("shaw", {"values": False}), ("transformer_xl", {}), ("deberta", {})])
def test_attend_reads_each_row_of_a_q_k_term_when_the_batch_shares_positions(name, params):
    """Positions arrive as (1, T) when the batch shares them; a term that reads q or k (score_reads_qk) must still
    be computed per row on the CPU's SDPA-with-bias path, so row 1 gets its own q·R table, not row 0's."""
    dims = PositionDims(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, layer=0)
    torch.manual_seed(0)
    attn = perturb(Attention(32, 4, 2, {"name": name, **params}, dims)).eval()
    assert attn.kernel(torch.device("cpu")) == "sdpa_bias"
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8)
    p, mask = torch.arange(6)[None], AttentionMask()
    with torch.no_grad():
        got = attn.attend(q, k, v, p, p, mask)
        want = reference_attention(q, k, v, attn.pos, p.expand(2, -1), p.expand(2, -1), mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_reference_attention_adds_shaw_s_value_term():
    """z_i = Σ_j α_ij (v_j + R^V[clip(i − j, −k, k)]) with α the softmax of q·(k_j + R^K_ij)/√Dh (Shaw et al.)."""
    pos = attention_hook("shaw", max_distance=2)
    perturb(pos)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=g) for _ in range(3))
    p, mask = torch.arange(6)[None], AttentionMask()
    idx = (p[0, :, None] - p[0, None, :]).clamp(-2, 2) + 2  # (T, S)
    with torch.no_grad():
        logits = torch.einsum("bhtd,bhtsd->bhts", q, k[:, :, None] + pos.rel_k[idx]) / math.sqrt(8)
        alpha = torch.softmax(logits.masked_fill(~mask.dense(6, 6, "cpu")[0], float("-inf")), -1)
        want = torch.einsum("bhts,bhtsd->bhtd", alpha, v[:, :, None] + pos.rel_v[idx])
        got = reference_attention(q, k, v, pos, p, p, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_transformer_xl_embeds_distances_with_its_base():
    """(b) + (c) + (d) = (q_i + v)·W_{K,R} R_{i−j} + u·k_j, scaled by 1/√Dh, R the sinusoids of model.position.base."""
    txl = perturb(attention_hook("transformer_xl", base=100.0))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 1, 8, generator=g), torch.randn(1, 4, 6, 8, generator=g)
    q_pos, k_pos = torch.tensor([[5]]), torch.arange(6)[None]
    with torch.no_grad():
        r = txl.w_kr(sinusoid(5 - torch.arange(6), 32, base=100.0)).view(6, 4, 8)  # (S, H, Dh): W_{K,R} R_{i−j}
        want = (torch.einsum("hd,shd->hs", q[0, :, 0] + txl.v, r) + torch.einsum("hd,hsd->hs", txl.u, k[0])) / 8**0.5
        got = txl.score(q, k, q_pos, k_pos, None)[0, :, 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_logn_scales_the_queries_of_a_layer_that_does_not_rotate():
    # NoPE layers of nope_every get plain attention, but log-n still multiplies their queries by max(1, log n/log L)
    rope = Rope(RopeParams(nope_every=2), PositionDims(16, 2, 2, 8, 2, layer=1))
    assert not rope.rotates
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    p, mask = torch.arange(12)[None], AttentionMask()
    got = build_extension("logn", {"train_len": 4}).attend(q, k, v, rope, p, p, mask)
    scale = (torch.log(torch.arange(12.0) + 1) / math.log(4)).clamp(min=1)
    want = reference_attention(q * scale[:, None], k, v, rope, p, p, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_validate_position_with_a_head_size_checks_the_rotary_dimensions():
    # a phase's block is validated with the head size when the config loads: 0.1 of 8 rotates no dimension
    with pytest.raises(ConfigError, match=r"model\.position\.fraction: .* rotates 0 dimensions"):
        validate_position({"name": "rope", "fraction": 0.1}, head_dim=8)
    validate_position({"name": "rope", "fraction": 0.1}, head_dim=64)  # 6 dimensions: fine
