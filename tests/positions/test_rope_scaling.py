"""Properties of compute_rope (minilm/positions/rope_scaling.py), and parity with transformers where it has the
same rope_type. Tiny shapes: every test runs in milliseconds."""

import math
import re
import sys
from dataclasses import fields

import pytest
import torch

from minilm.errors import ConfigError
from minilm.positions import compute_rope
from minilm.positions.base import PositionDims
from minilm.positions.rope_scaling import LENGTH_DEPENDENT, ROPE_SCALING, parse_scaling, validate_scaling
from minilm.positions.rotary import Rope, RopeParams

D, BASE, L = 32, 10000.0, 64  # rotary dims, θ base, original length


def default():
    return compute_rope(D, BASE)[0]


def wavelengths(inv_freq):
    return 2 * math.pi / inv_freq.double()


# One block per rope_type with factor 1 (and unit factor lists): each must reproduce `default`.
FACTOR_ONE = {
    "default": {},
    "linear": {"factor": 1},
    "ntk": {"factor": 1},
    "dynamic": {"factor": 1, "original_max_position_embeddings": L},
    "ntk_by_parts": {"factor": 1, "original_max_position_embeddings": L},
    "yarn": {"factor": 1, "original_max_position_embeddings": L},
    "dynamic_yarn": {"factor": 1, "original_max_position_embeddings": L},
    "llama3": {"factor": 1, "original_max_position_embeddings": L},
    "longrope": {
        "factor": 1,
        "original_max_position_embeddings": L,
        "short_factor": [1.0] * (D // 2),
        "long_factor": [1.0] * (D // 2),
    },
}


def test_factor_one_table_covers_the_registry():
    assert set(FACTOR_ONE) == set(ROPE_SCALING)


@pytest.mark.parametrize("rope_type", list(ROPE_SCALING))
@pytest.mark.parametrize("seq_len", [None, 1, L // 2, L])
def test_factor_one_reproduces_default(rope_type, seq_len):
    inv_freq, factor = compute_rope(D, BASE, {"rope_type": rope_type, **FACTOR_ONE[rope_type]}, seq_len=seq_len)
    torch.testing.assert_close(inv_freq, default(), rtol=1e-6, atol=0)
    assert factor == 1.0


def test_default_is_su_and_base_change_is_abf():
    i = torch.arange(D // 2, dtype=torch.float64)
    torch.testing.assert_close(default(), (BASE ** (-2 * i / D)).float())
    torch.testing.assert_close(compute_rope(D, 500000.0)[0], (500000.0 ** (-2 * i / D)).float())


@pytest.mark.parametrize("factor", [2, 4.5])
def test_linear_divides_every_frequency(factor):
    inv_freq, attention = compute_rope(D, BASE, {"rope_type": "linear", "factor": factor})
    torch.testing.assert_close(inv_freq, default() / factor)
    assert attention == 1.0


@pytest.mark.parametrize("factor", [2, 8])
def test_ntk_keeps_highest_frequency_and_divides_lowest(factor):
    inv_freq, _ = compute_rope(D, BASE, {"rope_type": "ntk", "factor": factor})
    ref = default()
    assert inv_freq[0] == ref[0] == 1.0
    torch.testing.assert_close(inv_freq[-1], ref[-1] / factor, rtol=1e-6, atol=0)
    assert torch.all(inv_freq[1:-1] < ref[1:-1]) and torch.all(inv_freq[1:-1] > ref[1:-1] / factor)


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("beta_fast,beta_slow", [(32, 1), (8, 2)])
def test_yarn_keeps_short_wavelengths_and_interpolates_long_ones(truncate, beta_fast, beta_slow):
    factor, n = 4, 2048  # a long original length, so that L/beta_fast exceeds the shortest wavelength 2π
    block = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": n,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
    }
    inv_freq, attention = compute_rope(D, BASE, block)
    ref = default()
    lam = wavelengths(ref)
    short, long = lam < n / beta_fast, lam > n / beta_slow
    assert short.any() and long.any() and not (short | long).all()  # the test exercises all three regions
    torch.testing.assert_close(inv_freq[short], ref[short], rtol=0, atol=0)
    torch.testing.assert_close(inv_freq[long], ref[long] / factor, rtol=1e-6, atol=0)
    middle = ~(short | long)
    assert torch.all(inv_freq[middle] <= ref[middle]) and torch.all(inv_freq[middle] >= ref[middle] / factor - 1e-12)
    assert attention == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_temperature_choices():
    base = {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": L}
    assert compute_rope(D, BASE, base)[1] == pytest.approx(0.1 * math.log(8) + 1)
    assert compute_rope(D, BASE, {**base, "attention_factor": 1.5})[1] == 1.5
    ratio = compute_rope(D, BASE, {**base, "mscale": 1.0, "mscale_all_dim": 0.5})[1]
    assert ratio == pytest.approx((0.1 * math.log(8) + 1) / (0.05 * math.log(8) + 1))
    # only one of the two: the plain temperature (transformers' rule)
    assert compute_rope(D, BASE, {**base, "mscale": 1.0})[1] == pytest.approx(0.1 * math.log(8) + 1)


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("rope_type", ["yarn", "ntk_by_parts", "dynamic_yarn"])
def test_a_ramp_beyond_every_dimension_keeps_or_interpolates_them_all(rope_type, truncate):
    """Where every wavelength fits more than beta_fast times into L (base 1.5: λ_i <= 2π·1.5 < 2048/32) YaRN keeps
    every frequency; where none fits beta_slow times (L 1 < λ_0 = 2π) it divides every one by the factor. The
    clamped ends crossed there (low > high) and inverted the ramp: all divided, and all kept."""
    block = {"rope_type": rope_type, "factor": 4.0, "truncate": truncate}
    seq_len = None if rope_type != "dynamic_yarn" else 4 * 2048  # (its factor at 4L: 1 + 4·3 = 13)
    kept, _ = compute_rope(D, 1.5, {**block, "original_max_position_embeddings": 2048}, seq_len)
    torch.testing.assert_close(kept, compute_rope(D, 1.5)[0], rtol=0, atol=0)
    seq_len = None if rope_type != "dynamic_yarn" else 4
    divided, _ = compute_rope(D, BASE, {**block, "original_max_position_embeddings": 1}, seq_len)
    scale = 4.0 if rope_type != "dynamic_yarn" else 1 + 4.0 * 3
    torch.testing.assert_close(divided, default() / scale, rtol=1e-6, atol=0)


def test_ntk_by_parts_is_yarn_without_temperature():
    common = {"factor": 4, "original_max_position_embeddings": L}
    parts, t1 = compute_rope(D, BASE, {"rope_type": "ntk_by_parts", **common})
    yarn, t2 = compute_rope(D, BASE, {"rope_type": "yarn", **common})
    torch.testing.assert_close(parts, yarn)
    assert t1 == 1.0 and t2 > 1.0


@pytest.mark.parametrize("rope_type", ["dynamic", "dynamic_yarn"])
def test_dynamic_equals_default_up_to_original_length_and_changes_beyond(rope_type):
    block = {"rope_type": rope_type, "factor": 2, "original_max_position_embeddings": L}
    for n in (None, 1, L - 1, L):
        inv_freq, attention = compute_rope(D, BASE, block, seq_len=n)
        torch.testing.assert_close(inv_freq, default(), rtol=0, atol=0)
        assert attention == 1.0
    previous = default()
    for n in (L + 1, 2 * L, 4 * L):
        inv_freq, _ = compute_rope(D, BASE, block, seq_len=n)
        assert torch.all(inv_freq[-1] < previous[-1])  # lowest frequency keeps falling as the length grows
        previous = inv_freq


def test_dynamic_ntk_formula():
    n, factor = 4 * L, 2.0
    block = {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": L}
    inv_freq, _ = compute_rope(D, BASE, block, n)
    new_base = BASE * (factor * n / L - (factor - 1)) ** (D / (D - 2))
    torch.testing.assert_close(inv_freq, compute_rope(D, new_base)[0])


def test_dynamic_yarn_at_length_equals_yarn_with_that_factor():
    dyn = compute_rope(D, BASE, {"rope_type": "dynamic_yarn", "original_max_position_embeddings": L}, seq_len=4 * L)
    yarn = compute_rope(D, BASE, {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": L})
    torch.testing.assert_close(dyn[0], yarn[0])
    assert dyn[1] == pytest.approx(yarn[1])


@pytest.mark.parametrize("rope_type", sorted(LENGTH_DEPENDENT))
def test_rotary_module_keeps_no_state_between_lengths(rope_type):
    block = {"rope_type": rope_type, **FACTOR_ONE[rope_type]}
    if rope_type == "longrope":
        block["long_factor"] = [2.0] * (D // 2)
    elif rope_type in ("dynamic", "dynamic_yarn"):
        block["factor"] = 2
    rope = Rope(RopeParams(scaling=block), PositionDims(D * 2, 2, 2, D, 1))
    short = rope.frequencies(L)[0].clone()
    long = rope.frequencies(4 * L)[0]
    assert not torch.equal(short, long)
    torch.testing.assert_close(rope.frequencies(L)[0], short, rtol=0, atol=0)
    torch.testing.assert_close(rope.frequencies(4 * L)[0], compute_rope(D, BASE, block, seq_len=4 * L)[0])


@pytest.mark.parametrize("rope_type", sorted(LENGTH_DEPENDENT))
def test_a_length_dependent_type_gives_empty_logits_for_zero_tokens(rope_type):
    """A model with a length-dependent scaling gives (B, 0, V) logits for zero tokens, as every encoding does with its
    defaults (tests/positions/test_registry.py): its current length was the largest of no key positions, which torch
    refuses ("amax(): Expected reduction dim to be specified for input.numel() == 0")."""
    from .helpers import V, tiny_model

    block = {"rope_type": rope_type, **FACTOR_ONE[rope_type], "factor": 2.0}
    if rope_type == "longrope":
        block.update(short_factor=[1.0] * 4, long_factor=[1.0] * 4)  # the tiny model's 8 rotary dims: 4 frequencies
    for name in ("rope", "xpos"):
        model = tiny_model(name, f"model.position.scaling={block}")
        with torch.no_grad():
            assert model(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, V)


@pytest.mark.parametrize("rope_type", sorted(LENGTH_DEPENDENT))
@pytest.mark.parametrize("seq_len", [1, L - 1, L, L + 1, 4 * L])
def test_a_tensor_length_gives_what_the_int_length_gives(rope_type, seq_len):
    """The rotary module passes the current length as a 0-d tensor (no host sync under torch.compile); the
    frequencies and the attention factor must be the int path's, on both sides of the original length."""
    block = {"rope_type": rope_type, **FACTOR_ONE[rope_type], "factor": 3}
    if rope_type == "longrope":
        block["long_factor"] = [1.0 + i / 4 for i in range(D // 2)]
    want, want_factor = compute_rope(D, BASE, block, seq_len=seq_len)
    got, got_factor = compute_rope(D, BASE, block, seq_len=torch.tensor(seq_len))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert float(got_factor) == pytest.approx(want_factor, rel=1e-6)


def test_llama3_three_regions():
    factor, low, high = 8, 1, 4
    block = {
        "rope_type": "llama3",
        "factor": factor,
        "original_max_position_embeddings": L,
        "low_freq_factor": low,
        "high_freq_factor": high,
    }
    inv_freq, attention = compute_rope(D, BASE, block)
    ref = default()
    lam = wavelengths(ref)
    high_freq, low_freq = lam < L / high, lam > L / low
    mid = ~(high_freq | low_freq)
    assert high_freq.any() and low_freq.any() and mid.any()
    torch.testing.assert_close(inv_freq[high_freq], ref[high_freq], rtol=0, atol=0)
    torch.testing.assert_close(inv_freq[low_freq], ref[low_freq] / factor)
    s = (L / lam[mid] - low) / (high - low)
    torch.testing.assert_close(inv_freq[mid], ((1 - s) * ref[mid].double() / factor + s * ref[mid].double()).float())
    assert attention == 1.0


def test_longrope_switches_lists_at_original_length():
    short = [1.0 + 0.1 * i for i in range(D // 2)]
    long = [2.0 + 0.5 * i for i in range(D // 2)]
    block = {
        "rope_type": "longrope",
        "factor": 4,
        "original_max_position_embeddings": L,
        "short_factor": short,
        "long_factor": long,
    }
    ref = default().double()
    for n in (None, 1, L):
        inv_freq, attention = compute_rope(D, BASE, block, seq_len=n)
        torch.testing.assert_close(inv_freq, (ref / torch.tensor(short, dtype=torch.float64)).float())
    inv_freq, attention_long = compute_rope(D, BASE, block, seq_len=L + 1)
    torch.testing.assert_close(inv_freq, (ref / torch.tensor(long, dtype=torch.float64)).float())
    assert attention == attention_long == pytest.approx(math.sqrt(1 + math.log(4) / math.log(L)))
    assert compute_rope(D, BASE, {**block, "attention_factor": 1.25})[1] == 1.25


def test_partial_rotary_factor_rotates_fewer_dimensions():
    inv_freq, _ = compute_rope(D, BASE, {"rope_type": "linear", "factor": 2, "partial_rotary_factor": 0.5})
    torch.testing.assert_close(inv_freq, compute_rope(D // 2, BASE)[0] / 2)


YARN = {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": L}
LLAMA3 = {"rope_type": "llama3", "factor": 2, "original_max_position_embeddings": L}
LONG = {
    "rope_type": "longrope",
    "factor": 2,
    "original_max_position_embeddings": L,
    "short_factor": [1.0] * (D // 2),
    "long_factor": [1.0] * (D // 2),
}
INVALID = [
    ({"rope_type": "linear", "factor": 0.5}, "factor: must be >= 1, got 0.5"),
    ({"rope_type": "linear"}, "factor: required"),
    ({"rope_type": "yarn", "factor": 2}, "original_max_position_embeddings: required"),
    ({"rope_type": "dynamic", "factor": 2}, "original_max_position_embeddings: required"),
    ({"rope_type": "llama3", "factor": 2}, "original_max_position_embeddings: required"),
    ({**YARN, "original_max_position_embeddings": 0}, "original_max_position_embeddings: must be >= 1"),
    ({**YARN, "original_max_position_embeddings": 64.5}, "original_max_position_embeddings: must be an integer"),
    ({**YARN, "beta_fast": 1}, "beta_fast: must be > beta_slow"),
    ({**YARN, "attention_factor": 0}, "attention_factor: must be > 0"),
    # > 0, but 0 in fp32, where it multiplies cos and sin: every query and key 0, the attention uniform
    ({**YARN, "attention_factor": 1e-50}, "attention_factor: must be at least 1.18e-38 (fp32's smallest normal"),
    ({**YARN, "truncate": 1}, "truncate: must be true or false"),
    # a negative mscale term reaches 0: a ZeroDivisionError traceback (at factor 2: −1/(0.1·ln 2)), or a negative
    # attention factor; a huge ratio is inf in fp32, where it multiplies cos and sin
    ({**YARN, "mscale": 1.0, "mscale_all_dim": -1 / (0.1 * math.log(2))}, "mscale_all_dim: must be >= 0"),
    ({**YARN, "mscale": -100.0, "mscale_all_dim": 1.0}, "mscale: must be >= 0"),
    ({"rope_type": "dynamic_yarn", "original_max_position_embeddings": L, "mscale": 1.0, "mscale_all_dim": -1.0},
     "mscale_all_dim: must be >= 0"),
    ({**YARN, "mscale": 1e40, "mscale_all_dim": 1.0}, "mscale: gives the attention factor 6.48216e+38 (its ratio"),
    ({**YARN, "mscale": 1.0, "mscale_all_dim": 1e300}, "mscale_all_dim: gives the attention factor 1.54"),
    # finite in fp32, but q and k each carry it, so the logits its square: 1e19 made every logit inf, the output NaN
    ({**YARN, "attention_factor": 1e19}, "attention_factor: must be at most 2.35e+17 (e^40"),
    ({**LONG, "attention_factor": 1e30}, "attention_factor: must be at most 2.35e+17 (e^40"),
    ({**YARN, "mscale": 1e25, "mscale_all_dim": 1.0}, "mscale: gives the attention factor 6.48216e+23 (its ratio"),
    # dynamic_yarn's ratio grows with the length: checked at 2^24 (it was not checked at all: NaN from 8 tokens on)
    ({"rope_type": "dynamic_yarn", "original_max_position_embeddings": L, "mscale": 1e39, "mscale_all_dim": 1.0},
     "mscale: gives the attention factor 5.55094e+38 (its ratio to mscale_all_dim's term at factor 262144, the one it "
     "reaches at length 2^24)"),
    ({"rope_type": "dynamic_yarn", "original_max_position_embeddings": L, "mscale": 1.0, "mscale_all_dim": 1e300},
     "mscale_all_dim: gives the attention factor 1.8015e-300"),
    ({"rope_type": "linear", "factor": "2"}, "factor: must be a number"),
    ({"rope_type": "linear", "factor": "4e0"}, "factor: must be a number, got the string '4e0'; write it without"),
    ({"rope_type": "linear", "factor": 2, "beta_fast": 4},
     "beta_fast: not a parameter of rope_type 'linear'; it takes: rope_type, factor, partial_rotary_factor"),
    ({"rope_type": "lineal", "factor": 2}, "rope_type: unknown rope_type 'lineal'"),
    ({"rope_type": "default", "partial_rotary_factor": 0}, "partial_rotary_factor: must be in (0, 1]"),
    ({**LLAMA3, "high_freq_factor": 1}, "high_freq_factor: must be > low_freq_factor"),
    ({**LONG, "short_factor": [1.0] * 3}, "short_factor: must have one entry per rotary frequency (16), got 3"),
    ({**LONG, "long_factor": [1.0] * 5}, "long_factor: must have one entry per rotary frequency (16), got 5"),
    ({**LONG, "short_factor": 1.0}, "short_factor: must be a list"),
    ({**LONG, "factor": None}, "factor: required for rope_type 'longrope' unless attention_factor is set"),
    # beyond int64 (1e30 reads as an integer): passed, then an OverflowError at the first forward (llama3: at once)
    *[({**block, "original_max_position_embeddings": 10**30},
       "original_max_position_embeddings: must be at most 9223372036854775807 (2^63 − 1")
      for block in (LONG, LLAMA3, {"rope_type": "dynamic", "factor": 2.0},
                    {"rope_type": "dynamic_yarn"})],
    # its temperature sqrt(1 + ln(factor)/ln(L)) divided by ln 1 = 0: a ZeroDivisionError traceback
    ({**LONG, "original_max_position_embeddings": 1},
     "original_max_position_embeddings: must be >= 2 for rope_type 'longrope' with factor > 1"),
    # non-finite values passed the range checks: inf frequencies, or a "math domain error" traceback
    ({"rope_type": "linear", "factor": float("inf")}, "factor: must be a finite number, got inf"),
    ({**YARN, "beta_fast": float("inf")}, "beta_fast: must be a finite number, got inf"),
    ({**YARN, "attention_factor": float("nan")}, "attention_factor: must be a finite number, got nan"),
    ({**LONG, "short_factor": [float("nan")] * (D // 2)}, "short_factor[0]: must be a finite number, got nan"),
    # > 0, but θ_3 / 1e-50 is inf in fp32: an infinite frequency, every angle of that dimension inf, cos and sin nan
    ({**LONG, "long_factor": [1.0] * 3 + [1e-50] + [1.0] * (D // 2 - 4)},
     "long_factor[3]: must be at least 4.94e-32 (2^24 / fp32's largest number"),
    ({**LONG, "short_factor": [1.0, 0.0] + [1.0] * (D // 2 - 2)}, "short_factor[1]: must be > 0, got 0.0"),
    # a normal fp32 number, θ_0 / 1e-35 finite, but position · θ_0 / 1e-35 inf from position 3403 on: cos, sin NaN
    ({**LONG, "short_factor": [1.0, 1.0, 1e-35] + [1.0] * (D // 2 - 3)},
     "short_factor[2]: must be at least 4.94e-32 (2^24 / fp32's largest number"),
    # a block copied from a transformers config: say where its two non-scaling keys go
    ({"type": "yarn", "factor": 2}, "type: the key is rope_type"),
    ({**YARN, "rope_theta": 10000.0}, "rope_theta: the RoPE base is model.position.base"),
]


@pytest.mark.parametrize("block,message", INVALID)
def test_invalid_parameters_raise_naming_the_key(block, message):
    with pytest.raises(ConfigError) as e:
        compute_rope(D, BASE, block)
    assert str(e.value).startswith(message.split(":")[0] + ":") and message in str(e.value)
    with pytest.raises(ConfigError, match=r"^model\.position\.scaling\." + re.escape(message.split(":")[0]) + ":"):
        validate_scaling(block, D, "model.position.scaling")


@pytest.mark.parametrize("rope_type", ["yarn", "ntk_by_parts", "dynamic_yarn"])
@pytest.mark.parametrize("betas", [{"beta_slow": 1e-310}, {"beta_fast": 1e308}])
def test_extreme_ramp_betas_give_finite_frequencies_not_an_overflow(rope_type, betas):
    """The ramp's ends d·ln(L / (2π·β)) / (2 ln base): the quotient overflowed float64 for a tiny beta_slow (floor(inf):
    OverflowError) and underflowed to 0 for a huge beta_fast (log(0): 'math domain error'), tracebacks from the config
    check. Finite ends, clamped into [0, d − 1] as ever: θ_0 keeps its frequency (L fits it more than β_fast times only
    for β_fast below L/2π, and the ramp starts at dimension 0 at the latest)."""
    block = {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": L, **betas}
    for seq_len in (None, 4 * L):
        inv_freq, factor = compute_rope(D, BASE, block, seq_len)
        assert torch.isfinite(inv_freq).all() and math.isfinite(float(factor)) and inv_freq[0] == 1.0


@pytest.mark.parametrize("rope_type", ["dynamic", "dynamic_yarn", "longrope", "llama3", "yarn"])
def test_the_longest_original_length_allowed_computes_at_a_tensor_length(rope_type):
    """original_max_position_embeddings at its bound, 2^63 − 1, at the length the rotary module passes (a 0-d int64
    tensor): finite frequencies and temperature, not an OverflowError (1e30 passed the config check, then failed so
    at the first forward)."""
    block = {"rope_type": rope_type, "factor": 2.0, "original_max_position_embeddings": 2**63 - 1}
    if rope_type == "longrope":
        block |= {"short_factor": [1.0] * (D // 2), "long_factor": [2.0] * (D // 2)}
    inv_freq, factor = compute_rope(D, BASE, block, seq_len=torch.tensor(100))
    assert torch.isfinite(inv_freq).all() and math.isfinite(float(factor))


@pytest.mark.parametrize("seq_len", [None, 10 * L])  # short_factor, then long_factor
def test_longrope_s_smallest_rescale_factor_keeps_every_angle_finite_up_to_position_2_24(seq_len):
    """Each factor at the printed lower bound (itself allowed): the rotary tables at positions 0 .. 2^24 (the ones
    fp32 counts exactly) are finite. Half of it is refused: its angles overflow fp32 before 2^24."""
    from minilm.positions.rope_scaling import LONGROPE_MIN_FACTOR
    from minilm.positions.rotary import cos_sin_tables

    least = float(re.search(r"at least (\S+) ", _longrope_refusal()).group(1))
    assert LONGROPE_MIN_FACTOR <= least < 1.01 * LONGROPE_MIN_FACTOR  # rounded up, to 3 digits
    block = {**LONG, "short_factor": [least] * (D // 2), "long_factor": [least] * (D // 2)}
    inv_freq, factor = compute_rope(D, BASE, block, seq_len)
    positions = torch.tensor([[0, 1, 2**23, 2**24 - 1, 2**24]])
    cos, sin = cos_sin_tables(positions, inv_freq, factor)
    assert torch.isfinite(cos).all() and torch.isfinite(sin).all()
    with pytest.raises(ConfigError, match=r"^short_factor\[0\]: must be at least"):
        compute_rope(D, BASE, {**block, "short_factor": [least / 2] * (D // 2)})


def _longrope_refusal() -> str:
    with pytest.raises(ConfigError) as e:
        compute_rope(D, BASE, {**LONG, "long_factor": [1e-35] * (D // 2)})
    return str(e.value)


@pytest.mark.parametrize("block", [
    {**YARN, "attention_factor": None},
    {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 4, "mscale": None, "mscale_all_dim": 1.0},
])  # fmt: skip
def test_the_largest_attention_factor_allowed_keeps_the_logits_finite(block):
    """The attention factor multiplies cos and sin, so the logits carry its square: at the printed bound (itself
    allowed) a model's outputs are finite, where 1e19, which fp32 holds (its largest number was the bound), made every
    logit inf and the output NaN. For dynamic_yarn the mscale whose ratio reaches the bound at length 2^24."""
    from minilm.config import load_config
    from minilm.model import GPT
    from minilm.positions.rope_scaling import ATTENTION_FACTOR_MAX

    if block["rope_type"] == "yarn":
        block = {**block, "attention_factor": float(re.search(r"at most (\S+) ", _refusal(block, 1e19)).group(1))}
    else:  # the mscale whose ratio at length 2^24 is the bound: (0.1·m·ln s + 1) / (0.1·ln s + 1) = the bound
        s = 1 + (2**24 - 4) / 4
        block = {**block, "mscale": (ATTENTION_FACTOR_MAX * (0.1 * math.log(s) + 1) - 1) / (0.1 * math.log(s)) * 0.999}
    assert block[next(k for k in ("attention_factor", "mscale") if block.get(k))] > 1e16
    cfg = load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.position.name=rope",
                                 f"model.position.scaling={block}"])  # fmt: skip
    torch.manual_seed(0)
    model = GPT(cfg.model, 50).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
        assert torch.isfinite(model(torch.randint(0, 50, (2, 64)))).all()


def _refusal(block, attention_factor) -> str:
    with pytest.raises(ConfigError) as e:
        compute_rope(D, BASE, {**block, "attention_factor": attention_factor})
    return str(e.value)


@pytest.mark.parametrize("rope_type", ["dynamic", "dynamic_yarn"])
@pytest.mark.parametrize("seq_len", [None, L, torch.tensor(L)])
def test_a_huge_dynamic_factor_is_the_default_at_the_original_length(rope_type, seq_len):
    """factor·L'/L − (factor − 1) cancelled to 0 at L' = L for a factor from 2^53: base · 0 = 0, every frequency but
    θ_0 inf, cos and sin NaN at and below the original length, where the method is meant to be the default."""
    block = {"rope_type": rope_type, "factor": 1e17, "original_max_position_embeddings": L}
    inv_freq, factor = compute_rope(D, BASE, block, seq_len)
    torch.testing.assert_close(inv_freq, compute_rope(D, BASE)[0])
    assert float(factor) == 1.0


@pytest.mark.parametrize("block", [
    {"rope_type": "ntk", "factor": 1e300},
    {"rope_type": "dynamic", "factor": 1e300, "original_max_position_embeddings": L},
])  # fmt: skip
@pytest.mark.parametrize("seq_len", [None, 2 * L, torch.tensor(2 * L)])
def test_an_ntk_base_past_float64_gives_the_limit_not_an_overflow_error(block, seq_len):
    """base · factor^(d/(d−2)) left float64: Python's float power raised OverflowError (a traceback from a config
    that loaded). The limit of a huge factor: θ_0 = 1 stays, every other frequency 0."""
    inv_freq, _ = compute_rope(D, BASE, block, seq_len)
    if block["rope_type"] == "dynamic" and seq_len is None:  # at the original length: the default
        torch.testing.assert_close(inv_freq, compute_rope(D, BASE)[0])
    else:
        assert inv_freq[0] == 1 and (inv_freq[1:] == 0).all()


@pytest.mark.parametrize("seq_len", [2 * L, 3 * L, torch.tensor(3 * L)])
def test_a_dynamic_scale_past_float64_gives_the_limit_and_a_finite_temperature(seq_len):
    """1 + factor·(L' − L)/L left float64 for a factor from about 1e307: inf, and dynamic_yarn's temperature
    0.1·ln(inf) + 1 inf, so every logit NaN. Held at float64's largest number: the limit of the frequencies (θ_0 = 1
    kept, the interpolated ones 0) and a finite temperature: yarn's at the largest factor."""
    block = {"rope_type": "dynamic_yarn", "factor": 1e308, "original_max_position_embeddings": L}
    inv_freq, factor = compute_rope(D, BASE, block, seq_len)
    limit, temperature = compute_rope(D, BASE, {**YARN, "factor": sys.float_info.max})
    torch.testing.assert_close(inv_freq, limit)
    assert (inv_freq == 0).any() and math.isfinite(float(factor)) and float(factor) == pytest.approx(temperature)


@pytest.mark.parametrize("base", [1.0, 0.5, float("inf"), float("nan")])
def test_compute_rope_refuses_a_base_that_is_not_above_one(base):
    """base 1 divided the YaRN ramp by ln(1) (a ZeroDivisionError traceback); below 1 the frequencies invert."""
    with pytest.raises(ConfigError, match=r"^base: must be a finite number > 1"):
        compute_rope(D, base, YARN)


def test_rope_module_rejects_a_bad_block_at_construction():
    with pytest.raises(ConfigError, match=r"model\.position\.scaling\.factor: must be >= 1"):
        Rope(RopeParams(scaling={**YARN, "factor": 0.5}), PositionDims(64, 2, 2, D, 1))


def test_parse_scaling_gives_typed_frozen_parameters():
    rope_type, params = parse_scaling({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 128})
    assert rope_type == "yarn" and params.factor == 4.0 and isinstance(params.factor, float)
    assert params.beta_fast == 32 and params.beta_slow == 1 and params.truncate is True
    with pytest.raises(Exception):
        params.factor = 2.0
    assert parse_scaling(None)[0] == "default"


# ---------------------------------------------------------------------------------------------------------------
# parity with Hugging Face transformers (optional dependency)


def _hf(block, head_dim=D, max_len=L, base=BASE):
    transformers = pytest.importorskip("transformers")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from minilm.export import _yarn_reads_truncate, llama_rope_kwargs

    if block.get("truncate") is False and not _yarn_reads_truncate():
        pytest.skip(f"transformers {transformers.__version__}'s yarn does not read truncate")
    kwargs = llama_rope_kwargs({"rope_theta": base, **block})  # rope_parameters (5.x) or rope_scaling (4.x)
    if "rope_parameters" not in kwargs:  # 4.x reads partial_rotary_factor from the config, not from rope_scaling
        kwargs["partial_rotary_factor"] = block.get("partial_rotary_factor", 1.0)
        original = block.get("original_max_position_embeddings")
        if block["rope_type"] in ("yarn", "longrope") and block.get("factor") and original is not None:
            # and its yarn and longrope take the factor as max_position_embeddings / original: given so, as the
            # export writes it (minilm.export.hf_rope_parameters)
            max_len = round(original * block["factor"])
    cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=max_len, **kwargs
    )
    return rope_utils, cfg


def _hf_rope(block, seq_len=None, head_dim=D, max_len=L, base=BASE):
    """transformers' (inv_freq, attention factor) for ``block`` (its own ``ROPE_INIT_FUNCTIONS`` entry)."""
    rope_utils, cfg = _hf(block, head_dim, max_len, base)
    inv_freq, factor = rope_utils.ROPE_INIT_FUNCTIONS[block["rope_type"]](cfg, "cpu", seq_len=seq_len)
    return inv_freq.float(), float(factor)


PARITY = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L},
    {**YARN, "factor": 16.0, "original_max_position_embeddings": 256, "beta_fast": 16.0, "beta_slow": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "truncate": False},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L, "attention_factor": 1.3},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "partial_rotary_factor": 0.5},
    {**LLAMA3, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {**LLAMA3, "factor": 4.0, "original_max_position_embeddings": 128, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
    {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": L,
        "short_factor": [1.0 + 0.05 * i for i in range(D // 2)],
        "long_factor": [1.5 + 0.25 * i for i in range(D // 2)],
    },
    {
        "rope_type": "longrope",
        "attention_factor": 1.2,
        "original_max_position_embeddings": L,
        "short_factor": [1.0] * (D // 2),
        "long_factor": [3.0] * (D // 2),
    },
    # every parameter of every shared rope_type, beyond the cases above
    {"rope_type": "linear", "factor": 2.5},
    {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L},
    {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": L, "partial_rotary_factor": 0.5},
    {**YARN, "factor": 2.5, "beta_fast": 12.5, "beta_slow": 0.5},
    {**YARN, "factor": 16.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    {**YARN, "factor": 8.0, "mscale": 1.0},  # only one of the pair: the plain temperature
    {**YARN, "factor": 8.0, "mscale_all_dim": 0.5},
    {**YARN, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V2's pair: a ratio of 1
    {**YARN, "factor": 4.0, "mscale": 0.0, "mscale_all_dim": 1.0},  # a zero mscale: the plain temperature
    {**LLAMA3, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "partial_rotary_factor": 0.5},
    {**LLAMA3, "factor": 3.0, "low_freq_factor": 0.5, "high_freq_factor": 1.5},
    {
        "rope_type": "longrope",
        "factor": 8.0,
        "original_max_position_embeddings": L,
        "short_factor": [1.0 + 0.1 * i for i in range(D // 4)],
        "long_factor": [2.0 + 0.5 * i for i in range(D // 4)],
        "partial_rotary_factor": 0.5,
    },
    {**LONG, "factor": 1.0, "long_factor": [2.0] * (D // 2)},  # factor 1: no temperature
]


def test_parity_cases_cover_every_shared_rope_type_and_parameter():
    """The PARITY list exercises every rope_type transformers shares with minilm and every parameter of each."""
    shared = {"linear", "dynamic", "yarn", "llama3", "longrope"}
    assert {b["rope_type"] for b in PARITY} == shared
    for rope_type in shared:
        keys = {k for b in PARITY if b["rope_type"] == rope_type for k in b} - {"rope_type"}
        assert keys == {f.name for f in fields(ROPE_SCALING[rope_type].params)}, rope_type


@pytest.mark.parametrize("block", PARITY, ids=lambda b: b["rope_type"])
@pytest.mark.parametrize("seq_len", [None, L // 2, L, L + 1, 4 * L])
def test_parity_with_transformers(block, seq_len):
    rope_utils, cfg = _hf(block)
    theirs, their_factor = rope_utils.ROPE_INIT_FUNCTIONS[block["rope_type"]](cfg, "cpu", seq_len=seq_len)
    reads_length = block["rope_type"] in LENGTH_DEPENDENT
    ours, our_factor = compute_rope(D, BASE, block, seq_len=seq_len if reads_length else None)
    torch.testing.assert_close(ours, theirs.float(), rtol=2e-6, atol=0)
    assert our_factor == pytest.approx(float(their_factor), rel=1e-12)


def test_parity_default_with_transformers():
    rope_utils, cfg = _hf({"rope_type": "default"})
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    # 5.x moved the default type from ROPE_INIT_FUNCTIONS to the rotary class
    compute = getattr(LlamaRotaryEmbedding, "compute_default_rope_parameters", None)
    theirs, factor = (compute or rope_utils.ROPE_INIT_FUNCTIONS["default"])(config=cfg, device="cpu")
    torch.testing.assert_close(default(), theirs.float(), rtol=2e-6, atol=0)
    assert factor == 1.0


def _shared_block(rope_type, head_dim, original, factor=8.0):
    """A block of ``rope_type`` with every parameter away from its default, for a rotary dimension ``head_dim``."""
    n = head_dim // 2
    return {
        "linear": {"factor": factor},
        "dynamic": {"factor": factor, "original_max_position_embeddings": original},
        "yarn": {"factor": factor, "original_max_position_embeddings": original, "beta_fast": 24.0, "beta_slow": 2.0},
        "llama3": {"factor": factor, "original_max_position_embeddings": original, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0},
        "longrope": {"factor": factor, "original_max_position_embeddings": original,
                     "short_factor": [1.0 + 0.02 * i for i in range(n)], "long_factor": [1.0 + i for i in range(n)]},
    }[rope_type] | {"rope_type": rope_type}  # fmt: skip


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3", "longrope"])
@pytest.mark.parametrize("head_dim,base,original", [(128, 500000.0, 8192), (64, 1e6, 2048), (16, 10000.0, 256)])
def test_parity_with_transformers_at_other_head_dims_and_bases(rope_type, head_dim, base, original):
    """Llama-3-sized heads and bases (head_dim 128, θ 500000, 8192 tokens) as well as tiny ones."""
    block = _shared_block(rope_type, head_dim, original)
    for seq_len in (None, original // 2, original, original + 1, 3 * original + 5):
        theirs, their_factor = _hf_rope(block, seq_len, head_dim, original, base)
        ours, our_factor = compute_rope(head_dim, base, block, seq_len if rope_type in LENGTH_DEPENDENT else None)
        torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
        assert our_factor == pytest.approx(their_factor, rel=1e-12)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
@pytest.mark.parametrize("seq_len", [1, L, L + 1, 4 * L + 3])
def test_parity_with_transformers_at_a_tensor_length(rope_type, seq_len):
    """The rotary module passes the length as a 0-d tensor, as transformers' dynamic_rope_update does."""
    block = _shared_block(rope_type, D, L, factor=3.0)
    theirs, their_factor = _hf_rope(block, torch.tensor(seq_len))
    ours, our_factor = compute_rope(D, BASE, block, seq_len=torch.tensor(seq_len))
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
    assert float(our_factor) == pytest.approx(their_factor, rel=1e-6)


# The three rope_types transformers does not have are compositions of its functions: checked against those.


@pytest.mark.parametrize("factor", [2, 4, 8, 32])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_ntk_equals_transformers_dynamic_ntk_at_factor_times_the_length(factor, partial):
    """bloc97's NTK-aware base change is what dynamic NTK (factor 1) gives at L' = factor · L."""
    block = {"rope_type": "ntk", "factor": factor, "partial_rotary_factor": partial}
    dynamic = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    theirs, their_factor = _hf_rope({**dynamic, "partial_rotary_factor": partial}, seq_len=factor * L)
    ours, our_factor = compute_rope(D, BASE, block)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
    assert our_factor == their_factor == 1.0


@pytest.mark.parametrize(
    "params",
    [
        {"factor": 4.0, "original_max_position_embeddings": L},
        {"factor": 16.0, "original_max_position_embeddings": 256, "beta_fast": 16.0, "beta_slow": 2.0},
        {"factor": 4.0, "original_max_position_embeddings": 2048, "truncate": False, "partial_rotary_factor": 0.5},
    ],
)
def test_ntk_by_parts_equals_transformers_yarn_frequencies_without_temperature(params):
    theirs, _ = _hf_rope({"rope_type": "yarn", **params})
    ours, our_factor = compute_rope(D, BASE, {"rope_type": "ntk_by_parts", **params})
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
    assert our_factor == 1.0


@pytest.mark.parametrize("factor", [1.0, 2.0])
@pytest.mark.parametrize("extra", [{}, {"mscale": 1.0, "mscale_all_dim": 0.5}, {"beta_fast": 8.0, "truncate": False}])
@pytest.mark.parametrize("seq_len", [1, L // 2, L, L + 1, 3 * L + 7, 16 * L])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_dynamic_yarn_equals_transformers_yarn_at_the_length_s_factor(factor, extra, seq_len, as_tensor):
    """Dynamic YaRN (the YaRN repo's LlamaDynamicYaRNScaledRotaryEmbedding, with factor 1): the default up to L,
    beyond it transformers' YaRN with the factor s·L'/L − (s − 1), frequencies and temperature both."""
    block = {"rope_type": "dynamic_yarn", "factor": factor, "original_max_position_embeddings": L, **extra}
    ours, our_factor = compute_rope(D, BASE, block, seq_len=torch.tensor(seq_len) if as_tensor else seq_len)
    if seq_len <= L:
        theirs, their_factor = compute_rope(D, BASE)
    else:
        effective = factor * seq_len / L - (factor - 1)
        theirs, their_factor = _hf_rope({**block, "rope_type": "yarn", "factor": effective})
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
    assert float(our_factor) == pytest.approx(their_factor, rel=1e-6)


@pytest.mark.parametrize(
    "block",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": L, "attention_factor": 0.75},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L},
        _shared_block("longrope", D, L, factor=4.0),
        _shared_block("llama3", D, L),
        {"rope_type": "linear", "factor": 4.0},
    ],
    ids=lambda b: b["rope_type"],
)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("T", [L // 2, 3 * L])
def test_rotary_module_equals_transformers_rotary_embedding(block, layout, T):
    """Where the attention factor goes: transformers' LlamaRotaryEmbedding multiplies cos and sin by it (so q and
    k each carry it and the logits its square), and dynamic / longrope read max(position_ids) + 1. A fresh module
    per length (transformers' dynamic update caches the longest length seen). Interleaved is the same rotation
    with the pairs permuted."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    _, cfg = _hf(block)
    pos = torch.arange(T)[None]
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(2, 2, 3, T, D, generator=g, dtype=torch.float64).float()
    cos, sin = modeling_llama.LlamaRotaryEmbedding(cfg)(q, pos)
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    rope = Rope(RopeParams(scaling=block, layout=layout), PositionDims(D * 2, 2, 2, D, 1))
    half = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))  # interleaved dim 2i, 2i+1 -> half i, i + D/2
    perm = half if layout == "interleaved" else torch.arange(D)
    inv = torch.argsort(perm)
    q_ours, k_ours = rope.rotate(q[..., inv], k[..., inv], pos, pos)
    # fp32 angles up to ~200 rad: one ulp of the angle is ~1.5e-5, and the float32 frequencies differ by ~1e-7
    torch.testing.assert_close(q_ours[..., perm], q_hf, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_ours[..., perm], k_hf, rtol=1e-4, atol=1e-4)
    assert transformers  # the import is the skip


def test_reconfiguring_keeps_the_tables_on_the_model_s_device():
    """A phase reconfigures the rotary layers wherever the model is: the new inv_freq was built on the CPU, so a
    model on a GPU would have mixed devices in its first forward. (The meta device stands in for a GPU here.)"""
    from minilm.config import load_config
    from minilm.model import GPT

    model = GPT(load_config(overrides=["model.n_layers=1", "model.d_model=32", "model.n_heads=2"]).model, 64)
    pos = model.blocks[0].attn.pos
    model.to("meta")
    pos.configure(pos.params)
    assert pos.inv_freq.device.type == "meta"
