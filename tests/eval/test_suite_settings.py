"""The suite's loop on a stub model and a character-level held-out split (no corpus, no training): default lengths,
the position limit (a length equal to it runs, one past it is unsupported; the tightest module wins), how many
retrieval samples each task scores, which sample is shown as the example, token accuracy next to exact match."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from minilm.errors import ConfigError
from minilm.eval import EvalData, EvalSettings, evaluate
from minilm.eval.suite import default_lengths, length_limit

V = 128
EOS = 0


class CharTokenizer:
    eos_id = EOS
    vocab_size = V

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(t) for t in ids)


class Limit(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def max_length(self):
        return self.n


class Digits(nn.Module):
    """Always predicts the digit '1': every answer token that is a '1' is right, the rest wrong. Position modules
    with the given limits (None: none)."""

    def __init__(self, *limits):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(1))
        self.pos_emb = Limit(limits[0]) if limits else None
        self.blocks = [SimpleNamespace(attn=SimpleNamespace(pos=Limit(n))) for n in limits[1:]]

    def forward(self, idx, **_):
        logits = torch.zeros(*idx.shape, V) + self.p
        logits[..., ord("1")] = 1.0
        return logits


def data() -> EvalData:
    text = "x = y + 1\nz = x * 2\n" * 60
    tokens = np.array([ord(c) for c in text] + [EOS], np.int64)
    val = SimpleNamespace(tokens=tokens, doc_offsets=np.array([0]), doc_lengths=np.array([len(tokens)]),
                          n_tokens=len(tokens))  # fmt: skip
    return EvalData(CharTokenizer(), val, "code")


def settings(**kw) -> EvalSettings:
    base = dict(lengths=[96], tasks=["passkey"], batches=1, batch_tokens=512, samples=3, depths=[0.0, 0.5, 1.0],
                seed=0, sliding=False)  # fmt: skip
    return EvalSettings(**{**base, **kw})


def test_default_lengths_run_from_half_to_eight_times_the_training_length():
    assert default_lengths(64) == [32, 64, 128, 256, 512]


def test_a_length_equal_to_the_position_limit_runs_and_one_past_it_is_unsupported():
    res = evaluate(Digits(96), data(), settings(lengths=[96, 97]), log=lambda *_: None)
    assert set(res["unsupported"]) == {"97"}
    assert res["passkey"]["96"] is not None and res["passkey"]["97"] is None


def test_an_unsupported_length_names_what_raises_the_tightest_limit():
    """It named model.position.max_positions whatever the encoding: an xPos model's limit is its scale_base's and
    gamma's (``length_keys``); a module that declares none is named by its limit alone."""
    model = Digits(500, 96)
    model.blocks[0].attn.pos.length_keys = ("scale_base", "gamma")
    model.pos_emb.length_keys = ("cache_size",)
    res = evaluate(model, data(), settings(lengths=[97]), log=lambda *_: None)
    assert res["unsupported"]["97"] == ("longer than the position encoding supports (96 positions, "
                                       "model.position.scale_base or gamma)")  # fmt: skip
    res = evaluate(Digits(96), data(), settings(lengths=[97]), log=lambda *_: None)
    assert res["unsupported"]["97"] == "longer than the position encoding supports (96 positions)"


def test_the_tightest_position_module_sets_the_limit():
    assert length_limit(Digits(500, 96, None)) == 96
    assert length_limit(Digits(None, None)) is None


def test_each_task_scores_samples_per_depth_and_kv_as_many_in_all():
    res = evaluate(Digits(), data(), settings(tasks=["passkey", "needle", "kv"], lengths=[200]), log=lambda *_: None)
    for task in ("passkey", "needle", "kv"):
        assert res["details"][task]["200"]["samples"] == 3 * 3, (task, res["skipped"])
    assert set(res["passkey_grid"]["200"]) == {"0", "0.5", "1"}


def test_the_example_is_the_sample_nearest_the_middle_depth():
    res = evaluate(Digits(), data(), settings(depths=[0.0, 0.4, 1.0]), log=lambda *_: None)
    assert [e["depth"] for e in res["examples"]["passkey"]] == [0.4]


def test_token_accuracy_counts_right_answer_tokens_not_whole_answers():
    """A model right on the answer's '1' digits only: no exact match, but a token accuracy equal to the share of
    answer tokens that are '1' (key digits and the closing quote)."""
    res = evaluate(Digits(), data(), settings(samples=8), log=lambda *_: None)
    d = res["details"]["passkey"]["96"]
    assert res["passkey"]["96"] == 0.0
    assert 0.0 < d["token_accuracy"] < 0.5


def test_ppl_runs_batches_of_batch_tokens_worth_of_windows():
    """eval.batches batches of batch_tokens // L windows each: 2 x (128 // 32) = 8 windows of 32 tokens."""
    res = evaluate(Digits(), data(), settings(tasks=["ppl"], lengths=[32], batches=2, batch_tokens=128),
                   log=lambda *_: None)  # fmt: skip
    assert res["details"]["ppl"]["32"]["windows"]["windows"] == 8
    assert res["details"]["ppl"]["32"]["windows"]["tokens"] == 8 * 32


@pytest.mark.parametrize("bad", [dict(samples=0), dict(lengths=[96, 96]), dict(depths=[0.5, 2.0])])
def test_settings_given_in_python_are_checked_before_anything_runs(bad):
    """evaluate(model, data, settings) is public (docs/evaluation.md): EvalSettings(samples=0) was an IndexError
    after the scoring, a repeated length ran twice into one cell, a depth of 2 put every key at the end."""
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=f"eval.{key}"):
        evaluate(Digits(), data(), settings(**bad), log=lambda *_: None)


def test_settings_without_lengths_are_refused_not_an_evaluation_of_nothing():
    """EvalSettings() has no lengths (eval.lengths: [] is 'no end-of-phase evaluation'): evaluate(model, data,
    EvalSettings(tasks=["ppl"])) returned results with no length in them, and write_report wrote an empty report."""
    with pytest.raises(ConfigError, match=r"^eval\.lengths: empty, so there is nothing to evaluate"):
        evaluate(Digits(), data(), settings(lengths=[]), log=lambda *_: None)


def test_the_report_of_a_model_in_memory_says_no_run_it_does_not_have(tmp_path):
    """evaluate(model, data, settings) has no run, phase, step or position: its report was titled '# Evaluation: '
    and read 'run: `None`, phase: `None`, step None' and 'position: `null`, trained at length None'."""
    from minilm.eval import write_report

    res = evaluate(Digits(), data(), settings(), log=lambda *_: None)
    write_report(res, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Evaluation\n")
    assert "None" not in report and "null" not in report
    assert "| 96 | 0.00 [" in report  # (the summary itself is there)


@pytest.mark.parametrize("bad,said", [(dict(samples=2.5), "eval.samples: must be an integer, got 2.5"),
                                      (dict(needles=True), "eval.needles: must be an integer, got True"),
                                      (dict(stride=8.5), "eval.stride: must be an integer, got 8.5"),
                                      (dict(seed=1.5), "eval.seed: must be an integer, got 1.5"),
                                      (dict(depths=["0.5"]), "eval.depths: must be numbers in [0, 1], got ['0.5']"),
                                      (dict(tasks="ppl"), "eval.tasks: must be a list, got 'ppl'"),
                                      (dict(lengths=[64.5]), "eval.lengths: must be integers >= 2, got [64.5]")])
def test_settings_of_the_wrong_type_are_one_message_naming_the_key(bad, said):
    """Settings built in Python are not typed by the config's schema: samples=2.5 or depths=["0.5"] passed the checks
    and ended in a TypeError inside the scoring; seed=1.5 ran as 1; and evaluate_run(lengths=[64.5]) evaluated 64."""
    with pytest.raises(ConfigError, match=f"^{re.escape(said)}$"):
        evaluate(Digits(), data(), settings(**bad), log=lambda *_: None)
    res = evaluate(Digits(), data(), settings(samples=np.int64(1), lengths=[np.int64(96)], depths=[np.float32(0.5)]),
                   log=lambda *_: None)  # fmt: skip
    assert res["passkey"] == {"96": 0.0}  # numpy's numbers are numbers


def test_evaluate_run_does_not_round_a_length(fake_run):
    from minilm.eval import evaluate_run

    with pytest.raises(ConfigError, match=r"^eval\.lengths: must be integers >= 2, got \[64\.5\]$"):
        evaluate_run(fake_run, lengths=[64.5], tasks=["ppl"], device="cpu", tensorboard=False, log=lambda *_: None)
