"""Properties every registered encoding must have, parametrized over REGISTRY (a new encoding is tested for
free): config validation, causality, running past the training length, learning, and a shipped config."""

import pytest
import torch

from minilm.config import load_config
from minilm.errors import ConfigError
from minilm.model.cache import KVCache
from minilm.positions import REGISTRY, validate_position
from minilm.positions.absolute import SequenceTooLong

from .helpers import TRAIN_LEN, V, tiny_model

NAMES = list(REGISTRY)


def test_unknown_name_lists_the_registered_names():
    with pytest.raises(ConfigError) as e:
        validate_position({"name": "rotary_but_wrong"})
    msg = str(e.value)
    assert "model.position.name" in msg and "rotary_but_wrong" in msg
    assert all(name in msg for name in NAMES)


@pytest.mark.parametrize("name", [["alibi"], {"a": 1}, 3])
def test_a_name_that_is_not_text_is_named(name):
    """``model.position.name=[alibi]`` was a TypeError traceback (a list is no dict key), not the registry's error."""
    with pytest.raises(ConfigError, match=r"model\.position\.name: unknown encoding .*registered encodings: learned"):
        validate_position({"name": name})


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_is_named(name):
    with pytest.raises(ConfigError, match=r"model\.position\.not_a_param"):
        validate_position({"name": name, "not_a_param": 1})


@pytest.mark.parametrize(
    "block, key",
    [
        ({"name": "learned", "max_positions": 0}, "max_positions"),
        ({"name": "alibi", "max_bias": -1.0}, "max_bias"),
        # every slope 2^−(max_bias·i/n) rounded to 0 in fp32: a model without positions, silently
        ({"name": "alibi", "max_bias": 1e6}, r"max_bias: must be at most 126 \(the smallest slope, .*got 1e\+06"),
        ({"name": "t5", "num_buckets": 32, "max_distance": 8}, "max_distance"),
        # num_buckets raised alone: the message named max_distance only, a key the user had left at its default
        ({"name": "t5", "num_buckets": 512}, r"max_distance: must exceed the 256 exact buckets of num_buckets 512 "
                                             r"\(the first half\), got 128; raise max_distance or lower num_buckets"),
        # beyond int64, which no distance exceeds: an OverflowError from torch at the first forward
        ({"name": "t5", "max_distance": 2**63}, r"max_distance: must be at most 9223372036854775807 \(2\^63 − 1"),
        ({"name": "shaw", "max_distance": 0}, "max_distance"),
        ({"name": "deberta", "max_distance": "far"}, "max_distance"),
        ({"name": "xpos", "scale_base": 0.0}, "scale_base"),
        # a decay that leaves fp32's range within one token: a limit of 1 position, NaN scores for any two
        ({"name": "xpos", "scale_base": 0.0156}, "scale_base: 0.0156 with gamma 0.4 fits no two positions.* >= 0.0157"),
        ({"name": "xpos", "gamma": 1e-300, "scale_base": 8.0}, "scale_base: .*give scale_base >= 8.64, or a larger"),
        ({"name": "xpos", "layout": "diagonal"}, "layout"),
        ({"name": "cope", "npos_max": 1}, "npos_max"),
        # past fp32's range: a torch traceback at the first forward
        ({"name": "floater", "delta": 1e37}, r"delta: 1e\+37 puts position 65535 \(cache_size − 1\) at t = 6.55e\+41"),
        # a torch traceback building the model, or NaN gradients (ψ(L) = ln(c·L + 1) overflowed)
        ({"name": "fire", "init_c": 1e39}, r"init_c: must be at most 3.4e\+38 \(fp32's largest number\), got 1e\+39"),
        ({"name": "fire", "init_L": 1e39}, r"init_L: must be at most 3.4e\+38"),
        ({"name": "fire", "init_c": 1e38}, r"init_c: init_c · max\(init_L, 2\^24\) must be at most 3.4e\+38 .*, got "
                                           r"1.68e\+45"),
        # c·L within fp32, but c·x of a later position or distance not: NaN scores from position 341 on
        ({"name": "fire", "init_c": 1e36, "init_L": 1.0}, r"init_c: init_c · max\(init_L, 2\^24\) must be at most"),
        ({"name": "fire", "init_c": 0.0}, "init_c"),
        # > 0, but 0 in fp32, where the encodings use them: the table, trajectory or ψ switched off (sinusoidal,
        # FLOATER, multiplicative, FIRE's c and L; c then took no gradient), KERPLE's r >= eps lost (r1 reached 0)
        *[({"name": name, key: 1e-50}, rf"{key}: must be at least 1.18e-38 \(fp32's smallest normal number.*got 1e-50")
          for name, key in [("sinusoidal", "scale"), ("floater", "delta"), ("multiplicative", "amplitude"),
                            ("kerple", "eps"), ("fire", "init_c"), ("fire", "init_L"), ("fire", "eps")]],
        ({"name": "multiplicative", "amplitude": 1.5}, "amplitude"),
        ({"name": "rope", "nope_every": -1}, "nope_every"),
        ({"name": "xpos", "nope_every": 1}, "nope_every: 1 leaves every layer unrotated; use name: none"),
        ({"name": "rope", "scaling": "yarn"}, "scaling: must be a mapping"),
        ({"name": "rope", "scaling": [1, 2]}, "scaling: must be a mapping"),
        ({"name": "rope", "scaling": {"rope_type": "yarn", "factr": 4.0}}, r"scaling\.factr"),
        ({"name": "xpos", "scaling": {"rope_type": "linear"}}, r"scaling\.factor: required"),
        # nan passes every "> 0" check and inf every ">= 1" one: the model then trains on nan / degenerate positions
        ({"name": "rope", "base": float("nan")}, "base: must be a finite number"),
        ({"name": "alibi", "max_bias": float("inf")}, "max_bias: must be a finite number"),
        ({"name": "fire", "init_L": float("nan")}, "init_L: must be a finite number"),
        ({"name": "rope", "scaling": {"rope_type": "linear", "factor": float("inf")}},
         r"scaling\.factor: must be a fin"),
        # base 1: every pair one frequency, and the YaRN ramp divided by ln(base) (a ZeroDivisionError traceback)
        ({"name": "rope", "base": 1.0}, "base: must be > 1"),
        ({"name": "xpos", "base": 0.5}, "base: must be > 1"),
        ({"name": "alibi", "max_bias": "8"}, "max_bias: must be float"),  # a quoted number stays refused
        # YAML 1.1 reads 4e0 as a string; the scaling block is also read as written (export): refused, with the fix
        ({"name": "rope", "scaling": {"rope_type": "linear", "factor": "4e0"}}, r"scaling\.factor: .*write it with"),
    ],
)
def test_bad_value_names_the_key(block, key):
    with pytest.raises(ConfigError, match=rf"model\.position\.{key}"):
        validate_position(block)


def test_an_exponent_without_a_dot_is_a_float_as_in_the_rest_of_the_config():
    """``eps: 1e-6`` (FIRE's documented default) is a string to YAML 1.1; OmegaConf converts it for the typed keys
    (``optim.lr: 1e-3``), but the free-form position block refused it: "must be float, got '1e-6'"."""
    assert validate_position({"name": "fire", "eps": "1e-6"}).eps == 1e-6
    assert validate_position({"name": "rope", "base": "5e5"}).base == 500000.0


def test_bad_scaling_in_a_later_phase_stops_at_load_time():
    """A typo in a phase's scaling block is a ConfigError naming the phase's key when the config loads, not an
    error after the earlier phases have trained."""
    with pytest.raises(ConfigError, match=r"phases\.extend\.position\.scaling\.factr: not a parameter"):
        load_config(overrides=["phases.pre.steps=1", "phases.extend.steps=1",
                               "phases.extend.position.scaling={rope_type: yarn, factr: 4.0}"])  # fmt: skip


@pytest.mark.parametrize("name, key, value", [("alibi", "max_bias", 4.0), ("sinusoidal", "base", 500.0),
                                               ("t5", "max_distance", 64), ("shaw", "values", False)])  # fmt: skip
def test_a_phase_changing_a_fixed_encoding_stops_at_load_time(name, key, value):
    """Only the rotary family's modules take new parameters between phases (``configure``); a phase changing
    another encoding's was refused by apply_phase only when that phase began, after the earlier ones trained."""
    phases = ["phases.pre.steps=1", "phases.ext.steps=1"]
    with pytest.raises(ConfigError, match=rf"phases\.ext\.position\.{key}: encoding '{name}' cannot change"):
        load_config(overrides=[f"model.position.name={name}", *phases, f"phases.ext.position.{key}={value}"])
    load_config(overrides=[f"model.position.name={name}", *phases])  # no change: fine
    rope = load_config(overrides=[*phases, "phases.ext.position.base=50000"])  # rotary: reconfigured by the phase
    assert rope.phases.ext.position.base == 50000


@pytest.mark.parametrize("name", NAMES)
def test_causal(name):
    """Changing token t never changes the logits before t (and does change them at t)."""
    model = tiny_model(name)
    x = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(x)
        for t in (3, 17):
            y = x.clone()
            y[:, t] = (y[:, t] + 7) % V
            out = model(y)
            assert torch.allclose(base[:, :t], out[:, :t], atol=1e-6), f"{name}: token {t} leaked backwards"
            assert not torch.allclose(base[:, t], out[:, t])


@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "running"])
@pytest.mark.parametrize("name", NAMES)
def test_document_mask_isolates_documents(name, restart):
    """With attention masked per document (data.document_mask), changing the first packed document changes
    nothing in the second — whether its positions restart (data.restart_positions) or run on. (conv's taps read
    the previous document's last tokens when the positions ran on.)"""
    model = tiny_model(name)
    x = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(2))
    docs = torch.tensor([[0] * 9 + [1] * 11, [0] * 14 + [1] * 6])
    positions = torch.stack([torch.cat([torch.arange(9), torch.arange(11)]),
                             torch.cat([torch.arange(14), torch.arange(6)])]) if restart else None  # fmt: skip
    y = x.clone()
    y[docs == 0] = (y[docs == 0] + 5) % V
    with torch.no_grad():
        a, b = model(x, positions, docs), model(y, positions, docs)
    second = docs == 1
    assert torch.allclose(a[second], b[second], atol=1e-6), f"{name}: the first document leaked into the second"
    assert not torch.allclose(a[~second], b[~second])


@pytest.mark.parametrize("name", NAMES)
def test_an_input_of_zero_tokens_gives_empty_logits(name):
    """Every encoding gives (B, 0, V) logits for zero tokens, alone or after a KV cache's prefill: learned's and
    FLOATER's largest position, xPos's center and span and Transformer-XL's distance range were reductions over no
    positions, which torch refuses, where the other 13 encodings gave the empty result."""
    model = tiny_model(name)
    empty = torch.zeros(2, 0, dtype=torch.long)
    assert model(empty).shape == (2, 0, V)
    if model.pos_emb.supports_kv_cache:
        cache = KVCache(len(model.blocks))
        with torch.no_grad():
            model(torch.randint(0, V, (2, 5)), cache=cache)
            assert model(empty, cache=cache).shape == (2, 0, V)


@pytest.mark.parametrize("name", NAMES)
def test_runs_at_twice_the_training_length(name):
    """Every encoding but ``learned`` evaluates at 2x the length it was built for; ``learned`` says why not."""
    model = tiny_model(name)  # learned: max_positions = TRAIN_LEN
    x = torch.randint(0, V, (1, 2 * TRAIN_LEN))
    if name == "learned":
        with pytest.raises(SequenceTooLong, match=rf"max_positions={TRAIN_LEN}.*extrapolating") as e:
            with torch.no_grad():
                model(x)
        assert str(TRAIN_LEN) in str(e.value)
        assert model.pos_emb.max_length() == TRAIN_LEN
        return
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (1, 2 * TRAIN_LEN, V) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_a_bounded_encoding_names_the_parameters_that_raise_its_limit(name):
    """The refusals of a longer input (the phases' check, the evaluation suite) advise raising ``length_keys``: each
    is a parameter of the encoding, and doubling it raises max_length(). The suite named max_positions for every
    bounded encoding, and the phases' check none."""
    model = tiny_model(name)
    bounded = [m for m in [model.pos_emb, *model.position_modules()] if m.max_length() is not None]
    if not bounded:
        return
    keys = bounded[0].length_keys
    assert keys and set(keys) <= set(REGISTRY[name].params.__dataclass_fields__)
    for key in keys:
        params = validate_position(model.cfg.position)
        raised = tiny_model(name, f"model.position.{key}={2 * getattr(params, key)}")
        higher = [m for m in [raised.pos_emb, *raised.position_modules()] if m.max_length() is not None]
        assert higher[0].max_length() > bounded[0].max_length(), key


@pytest.mark.parametrize("name", NAMES)
def test_learns(name):
    """30 optimizer steps on a fixed batch of a position-dependent task: the loss falls clearly (gradients reach
    every encoding's parameters without breaking the model)."""
    model = tiny_model(name, seed=2).train()
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, V, (4, TRAIN_LEN), generator=g)
    x[:, 1::2] = (x[:, 0::2] * 3 + torch.arange(TRAIN_LEN // 2)) % V  # odd tokens: a function of token + position
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], f"{name}: {losses[0]:.3f} -> {losses[-1]:.3f}"


@pytest.mark.parametrize("name", NAMES)
def test_every_encoding_has_a_config(name, repo):
    path = repo / "configs" / "positions" / f"{name}.yaml"
    if not (repo / "configs" / "tiny.yaml").exists():
        pytest.skip("configs/tiny.yaml (their base) is not there yet")
    cfg = load_config(path)
    assert cfg.model.position.name == name
    assert cfg.run.name == f"pos_{name}"


def test_no_config_without_an_encoding(repo):
    shipped = {p.stem for p in (repo / "configs" / "positions").glob("*.yaml")}
    assert shipped == set(NAMES)
