"""Which prompts a retrieval cell reads: a function of (seed, task, length, depth) alone, so ``--depths`` and
``--samples`` change exactly what they say (the stub model and character-level split of test_suite_settings)."""

from __future__ import annotations

import pytest

import minilm.eval.suite as suite
from minilm.eval import evaluate
from tests.eval.test_suite_settings import Digits, data, settings

MAKE_SAMPLES = suite.make_samples


def prompts_by_depth(monkeypatch, task: str, **kw) -> dict:
    """{depth: [prompt + answer, ...]} of the prompts ``evaluate`` scored for ``task`` at its one length."""
    drawn = {}

    def recording(task_, tok, val, length, n, rng, *, depth, **rest):
        samples = MAKE_SAMPLES(task_, tok, val, length, n, rng, depth=depth, **rest)
        drawn.setdefault(depth, []).extend(p + a for p, a in samples)
        return samples

    monkeypatch.setattr(suite, "make_samples", recording)
    evaluate(Digits(), data(), settings(tasks=[task], lengths=[200], **kw), log=lambda *_: None)
    return drawn


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_a_depths_prompts_do_not_depend_on_the_other_depths_or_their_order(monkeypatch, task):
    """Keyed by its place in the list, depth 0.5 read other prompts under --depths 0.5 than under --depths 0,0.5,
    and --depths 1,0 read at depth 1 the keys and filler --depths 0,1 read at depth 0."""
    alone = prompts_by_depth(monkeypatch, task, depths=[0.5])
    beside = prompts_by_depth(monkeypatch, task, depths=[0.0, 0.25, 0.5])
    assert beside[0.5] == alone[0.5]
    forward = prompts_by_depth(monkeypatch, task, depths=[0.0, 1.0])
    backward = prompts_by_depth(monkeypatch, task, depths=[1.0, 0.0])
    assert forward == backward
    assert forward[0.0] != forward[1.0]  # each depth still its own prompts


def test_more_samples_add_prompts_to_those_of_fewer(monkeypatch):
    few = prompts_by_depth(monkeypatch, "passkey", samples=2)
    more = prompts_by_depth(monkeypatch, "passkey", samples=5)
    assert all(more[d][:2] == few[d] for d in few)
    kv_few = prompts_by_depth(monkeypatch, "kv", samples=2, depths=[0.5])
    kv_more = prompts_by_depth(monkeypatch, "kv", samples=2, depths=[0.0, 0.5])  # kv: samples x len(depths)
    assert len(kv_more[0.5]) == 4 and kv_more[0.5][:2] == kv_few[0.5]


def test_minus_zero_is_depth_zero(monkeypatch):
    """Keyed '-0', depths 0 and -0 passed the repeat check and ran depth 0 twice into two cells ('0%' and '-0%')."""
    from minilm.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.depths: has repeats"):
        settings(depths=[0.0, -0.0]).validate()
    res = evaluate(Digits(), data(), settings(depths=[-0.0, 1.0]), log=lambda *_: None)
    assert set(res["passkey_grid"]["96"]) == {"0", "1"} and res["depths"] == [0.0, 1.0]
    assert prompts_by_depth(monkeypatch, "passkey", depths=[-0.0])[-0.0] == prompts_by_depth(
        monkeypatch, "passkey", depths=[0.0])[0.0]
