"""The evaluation suite must be able to fail: exact values on stub models, near-zero retrieval for an untrained
model, agreement of the batched teacher-forced verdict with real greedy decoding, unsupported lengths reported."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from minilm.errors import ConfigError
from minilm.eval import (
    EvalSettings,
    apply_extension,
    evaluate,
    evaluate_phase,
    evaluate_run,
    length_limit,
    parse_extension,
    validate_eval,
    write_report,
)
from minilm.eval.perplexity import bucket_curve, perplexity
from minilm.eval.retrieval import greedy_decode, make_needle_sample, make_samples, score_samples

from tests.conftest import load_script

from .conftest import configure_run, tiny_gpt


class Uniform(nn.Module):
    """Returns zero logits: every token has probability 1/V, so perplexity is exactly V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, idx, positions=None, doc_ids=None, cache=None):
        return torch.zeros(*idx.shape, self.vocab) * self.dummy


def _store(docs):
    lengths = np.array([len(d) for d in docs])
    return SimpleNamespace(tokens=np.concatenate(docs), doc_offsets=np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                           doc_lengths=lengths, n_tokens=int(lengths.sum()))  # fmt: skip


def _settings(**kw):
    base = dict(lengths=[64], tasks=["ppl"], batches=1, batch_tokens=256, samples=2, depths=[0.0, 1.0], seed=0)
    base.update(kw)
    return EvalSettings(**base)


# --------------------------------------------------------------------------------------------------- perplexity


@pytest.mark.parametrize("mode", ["windows", "sliding"])
def test_uniform_logits_have_perplexity_vocab_size(mode):
    V = 97
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, V, size=n) for n in (300, 500, 130)]
    r = perplexity(Uniform(V), docs, 64, mode=mode, n_windows=8, batch_size=3, stride=16)
    assert r.ppl == pytest.approx(V, rel=1e-5)
    assert r.loss == pytest.approx(math.log(V), rel=1e-6)
    assert r.windows == 8
    if mode == "windows":
        assert r.tokens == 8 * 64 and r.per_position.shape == (64,)
    else:  # each document's first window scores 64 targets, later ones only the stride's 16
        assert r.tokens < 8 * 64


def test_uniform_model_through_the_suite(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    V = corpus.tokenizer.vocab_size
    res = evaluate(Uniform(V), eval_data, _settings(lengths=[32, 64]), log=lambda *_: None)
    for L in ("32", "64"):
        assert res["ppl"][L] == pytest.approx(V, rel=1e-5)
        assert res["ppl_sliding"][L] == pytest.approx(V, rel=1e-5)
        assert len(res["per_position_loss"][L]["loss"]) == int(L)


def test_any_integer_seed_draws_the_evaluation_as_run_seed_trains_with_it(corpus_setup, eval_data):
    """run.seed may be negative (the sampler takes any integer), and evaluate.py --seed -1 too: numpy refused it
    with a traceback, at the end of a phase or from evaluate.py."""
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, seed=3)
    s = dict(lengths=[32], tasks=["ppl", "passkey"], samples=1, depths=[0.5])
    neg = evaluate(model, eval_data, _settings(seed=-1, **s), log=lambda *_: None)
    same = evaluate(model, eval_data, _settings(seed=2**63 - 1, **s), log=lambda *_: None)
    assert neg["seed"] == -1 and neg["ppl"] == same["ppl"] and neg["passkey"] == same["passkey"]


def test_sliding_windows_score_each_token_once_with_long_context():
    """A model whose loss at a target is the target's index in the document would expose double counting:
    with stride S the scored targets of a document are exactly 1..n_windows·S (+ the first window's rest)."""
    doc = np.arange(1000) % 50
    class Echo(nn.Module):  # predicts the next token perfectly once it has seen >= 20 tokens of context
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1))

        def forward(self, idx, **_):
            B, T = idx.shape
            logits = torch.zeros(B, T, 50)
            nxt = (idx + 1) % 50
            ctx = torch.arange(T).expand(B, T) >= 20
            logits.scatter_(2, nxt.unsqueeze(-1), torch.where(ctx, 100.0, 0.0).unsqueeze(-1))
            return logits + self.p
    windows = perplexity(Echo(), [doc], 64, mode="windows", n_windows=100, batch_size=4)
    sliding = perplexity(Echo(), [doc], 64, mode="sliding", n_windows=100, batch_size=4, stride=32)
    assert windows.ppl > 2  # 20 of every 64 targets are at uniform 1/50
    # sliding: only the document's first window has short-context targets; every later target has >= 32
    assert sliding.loss == pytest.approx(20 * math.log(50) / sliding.tokens, rel=1e-3)


def test_bucket_curve():
    pos, val = bucket_curve(np.arange(1000, dtype=float), points=10)
    assert len(pos) == 10 and val[0] == pytest.approx(49.5) and pos[-1] == pytest.approx(949.5)
    assert bucket_curve(np.ones(5))[1] == [1.0] * 5


# ---------------------------------------------------------------------------------------------------- retrieval


def test_untrained_model_scores_near_zero_on_passkey(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size)
    res = evaluate(model, eval_data, _settings(lengths=[64, 192], tasks=["passkey", "kv"], samples=4),
                   log=lambda *_: None)  # fmt: skip
    for L in ("64", "192"):
        assert res["passkey"][L] is not None and res["passkey"][L] <= 0.1
        assert set(res["passkey_grid"][L]) == {"0", "1"}
    assert res["kv"]["192"] is not None and res["kv"]["192"] <= 0.1
    assert res["examples"]["passkey"][0]["answer"].rstrip('"').isdigit()


def test_samples_have_the_exact_length_and_answer(corpus_setup, eval_data):
    tok = eval_data.tokenizer
    rng = np.random.default_rng(0)
    for task in ("passkey", "needle", "kv"):
        for p, a in make_samples(task, tok, eval_data.val.tokens, 160, 3, rng, depth=0.3, needles=3):
            assert len(p) + len(a) == 160
            assert tok.eos_id not in p
    p, a = make_needle_sample(tok, eval_data.val.tokens[:400], 200, 0.0, np.random.default_rng(1), needles=3)
    text = tok.decode(p)
    assert text.count(" = \"") >= 3  # the asked needle and two distractors
    asked = text.rsplit("assert ", 1)[1].split(" ==")[0]
    assert f'{asked} = "{tok.decode(a)}' in text  # the answer is the asked needle's value


def test_teacher_forced_verdict_equals_greedy_decoding(corpus_setup, eval_data):
    """score_samples' exact-match must be True iff greedy decoding reproduces the answer: make answers that ARE
    the model's greedy continuation (must score 1) and the same with one token changed (must score 0)."""
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, seed=3)
    good, bad = [], []
    for n_ans in (1, 3, 5):
        prompt = [int(t) for t in eval_data.val.tokens[100 * n_ans : 100 * n_ans + 60 - n_ans]]
        ans = greedy_decode(model, prompt, n_ans)
        good.append((prompt, ans))
        wrong = list(ans)
        wrong[-1] = (wrong[-1] + 1) % corpus.tokenizer.vocab_size
        bad.append((prompt, wrong))
    assert score_samples(model, good, batch_size=2).exact.all()
    assert not score_samples(model, bad, batch_size=2).exact.any()
    # the cached decode equals recomputation without the cache
    prompt = good[2][0]
    x = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(5):
            nxt = int(model(x)[0, -1].argmax())
            out.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], 1)
    assert out == good[2][1]


def test_greedy_example_of_an_encoding_without_kv_cache_is_recomputed(corpus_setup, eval_data):
    """conv declares supports_kv_cache = False: decoded with a cache its taps read zeros, and the report's greedy
    continuation was not the one the exact-match verdict scored."""
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, seed=0, name="conv", kernel_size=4)
    with torch.no_grad():
        model.pos_emb.weight.mul_(200)  # a taps-dominated model: the cached decode then goes elsewhere at once
    prompt = [int(t) for t in eval_data.val.tokens[:40]]
    x, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(8):
            out.append(int(model(x)[0, -1].argmax()))
            x = torch.cat([x, torch.tensor([[out[-1]]])], 1)
    assert greedy_decode(model, prompt, 8) == out


# ------------------------------------------------------------------------------------------ outputs and limits


def test_results_json_figures_and_tensorboard(tmp_path, corpus_setup):
    cfg, corpus = corpus_setup
    from omegaconf import OmegaConf

    pcfg = OmegaConf.merge(cfg, {"data": {"synthetic": {"style": "code"}},
                                 "eval": {"lengths": [64, 160], "tasks": ["ppl", "passkey", "needle", "kv"],
                                          "batches": 1, "batch_tokens": 256, "samples": 2, "depths": [0.0, 0.5, 1.0],
                                          "needles": 2}})  # fmt: skip
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size)
    model.train()
    res = evaluate_phase(model, pcfg, "train", tmp_path / "train", 123, SimpleNamespace(log_dir=str(tmp_path / "tb")),
                         lambda *_: None)  # fmt: skip
    assert model.training  # restored
    out = tmp_path / "train" / "eval"
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["ppl"]) == {"64", "160"} and set(saved["passkey"]) == {"64", "160"}
    assert saved["step"] == 123 and saved["ppl"]["64"] == pytest.approx(res["ppl"]["64"])
    assert saved["needle"]["160"] is not None and saved["kv"]["160"] is not None
    for name in ("ppl_vs_length", "per_position_loss", "passkey_heatmap", "needle_heatmap", "retrieval_vs_length"):
        assert (out / f"{name}.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "| 64 |" in report and "passkey_heatmap.png" in report
    acc = _tensorboard(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"eval/ppl@160", "eval/ppl@64", "eval/passkey@64", "eval/ppl_sliding@64", "eval/needle@160"} <= tags
    assert all(e.step == 123 for tag in tags for e in acc.Scalars(tag))
    assert "eval/passkey_heatmap" in acc.Tags()["images"]


def _tensorboard(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def test_evaluate_again_replaces_the_folders_tensorboard_points(tmp_path, fake_run):
    """An evaluation into a folder that holds one (other settings, or the same after a kill) replaces its points in
    TensorBoard as it replaces results.json: appended, the step had two values and the curves zig-zagged between
    them. An evaluation into another folder keeps its own."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--lengths", "32", "--tasks", "ppl", "--no-sliding", "--batch-tokens", "64",
            "--device", "cpu"]  # fmt: skip
    for batches in ("1", "2"):  # other settings: other numbers at the same step
        assert run_cli(ev.main, ev.parser(), argv + ["--batches", batches]) == 0
    assert run_cli(ev.main, ev.parser(), argv + ["--batches", "1", "--extension", "dynamic", "factor=2"]) == 0
    acc = _tensorboard(fake_run / "tb")
    ppl = json.loads((fake_run / "train" / "eval" / "results.json").read_text())["ppl"]["32"]
    assert [e.value for e in acc.Scalars("eval/ppl@32")] == [pytest.approx(ppl)]
    assert len(acc.Scalars("eval-dynamic/ppl@32")) == 1


def test_learned_table_reports_longer_lengths_as_unsupported(corpus_setup, eval_data):
    from minilm.positions import REGISTRY

    if "learned" not in REGISTRY:
        pytest.skip("the 'learned' encoding is not in minilm.positions.REGISTRY yet")
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, name="learned", max_positions=128)
    assert length_limit(model) == 128
    res = evaluate(model, eval_data, _settings(lengths=[128, 256], tasks=["ppl", "passkey"]), log=lambda *_: None)
    assert res["ppl"]["128"] is not None and res["passkey"]["128"] is not None  # a passkey prompt needs >= 91
    assert res["ppl"]["256"] is None and res["passkey"]["256"] is None
    assert "256" in res["unsupported"] and "128" not in res["unsupported"]


def test_unsupported_length_in_report(tmp_path, corpus_setup, eval_data):
    from minilm.positions import REGISTRY

    if "learned" not in REGISTRY:
        pytest.skip("the 'learned' encoding is not in minilm.positions.REGISTRY yet")
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, name="learned", max_positions=32)
    res = evaluate(model, eval_data, _settings(lengths=[32, 64]), log=lambda *_: None)
    write_report(res, tmp_path)
    assert "| 64 | unsupported" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["ppl"]["64"] is None


def test_too_short_length_is_skipped_not_crashed(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    res = evaluate(tiny_gpt(cfg, corpus.tokenizer.vocab_size), eval_data,
                   _settings(lengths=[8], tasks=["ppl", "passkey", "needle"]), log=lambda *_: None)  # fmt: skip
    assert res["ppl"]["8"] is not None
    assert res["passkey"]["8"] is None and "8" in res["skipped"]["passkey"] and "8" in res["skipped"]["needle"]


# ------------------------------------------------------------------------------------------ extension and config


def test_extensions_at_evaluation(corpus_setup, eval_data):
    cfg, corpus = corpus_setup
    V = corpus.tokenizer.vocab_size
    model = tiny_gpt(cfg, V, seed=1)
    x = torch.from_numpy(np.asarray(eval_data.val.tokens[:64], dtype=np.int64)).unsqueeze(0)
    with torch.no_grad():
        ref = model(x)
        # dynamic NTK leaves every length up to the original one unchanged: a rebuilt model, the same logits
        scaled, undo = apply_extension(model, cfg.model, V, {"name": "dynamic", "factor": 4}, 64)
        assert scaled is not model and scaled.blocks[0].attn.pos.params.scaling["rope_type"] == "dynamic"
        assert scaled.blocks[0].attn.pos.params.scaling["original_max_position_embeddings"] == 64
        torch.testing.assert_close(scaled(x), ref)
        # linear (PI) with factor 4 changes them
        pi, _ = apply_extension(model, cfg.model, V, {"name": "linear", "factor": 4}, 64)
        assert not torch.allclose(pi(x), ref, atol=1e-6, rtol=0)
        # a training-free method is installed on the same model and removed by undo; ReRoPE with a window
        # beyond the length is plain RoPE
        same, undo = apply_extension(model, cfg.model, V, {"name": "rerope", "window": 1000}, 64)
        assert same is model and model.blocks[0].attn.extension is not None
        torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-4)
        undo()
        assert model.blocks[0].attn.extension is None
    s = _settings(lengths=[64], sliding=False)
    assert evaluate(scaled, eval_data, s, log=lambda *_: None)["ppl"]["64"] == pytest.approx(
        evaluate(model, eval_data, s, log=lambda *_: None)["ppl"]["64"], rel=1e-5)


def test_parse_extension_and_validation():
    assert parse_extension(["yarn", "factor=4", "beta_fast=32.0"]) == {"name": "yarn", "factor": 4, "beta_fast": 32.0}
    assert parse_extension([]) == {}
    assert parse_extension(["dynamic", "factor=4e0"])["factor"] == 4.0  # as a config file reads it, not a string
    with pytest.raises(ConfigError, match="key=value"):
        parse_extension(["yarn", "factor"])
    with pytest.raises(ConfigError, match="eval.tasks"):
        validate_eval({"tasks": ["ppl", "bogus"]})
    with pytest.raises(ConfigError, match="eval.depths"):
        validate_eval({"depths": [1.5]})
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        validate_eval({"extension": {"name": "nope"}})
    validate_eval({"lengths": [128], "extension": {"name": "dynamic", "factor": 2}})


# --------------------------------------------------------------------------------------------------- run and CLI


def _script(name: str):
    return load_script(f"scripts/{name}.py")


def test_evaluate_script_and_compare(tmp_path, fake_run, capsys):
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--lengths", "32,128", "--tasks", "ppl,passkey", "--samples", "2", "--depths",
            "0,1", "--batches", "1", "--batch-tokens", "256", "--device", "cpu"]  # fmt: skip
    assert run_cli(ev.main, ev.parser(), argv) == 0
    out = fake_run / "train" / "eval"
    assert json.loads((out / "results.json").read_text())["passkey"]["128"] is not None
    assert list((fake_run / "tb").glob("events.out.tfevents.*"))
    assert run_cli(ev.main, ev.parser(), argv + ["--extension", "dynamic", "factor=2", "--no-tb"]) == 0
    assert (fake_run / "train" / "eval-dynamic" / "results.json").is_file()
    # --out: a side evaluation logs to OUT/tb, not beside the phase's own evaluation (same step, same tags)
    events = sorted((fake_run / "tb").glob("events.out.tfevents.*"))
    assert run_cli(ev.main, ev.parser(), argv + ["--out", str(tmp_path / "side")]) == 0
    assert sorted((fake_run / "tb").glob("events.out.tfevents.*")) == events
    assert list((tmp_path / "side" / "tb").glob("events.out.tfevents.*"))
    # bad input: one message, exit code 2
    assert run_cli(ev.main, ev.parser(), argv + ["--extension", "bogus"]) == 2
    assert "--extension bogus: extension.name: unknown method 'bogus'" in capsys.readouterr().err
    # the flag as given, before the run is read (a missing run would have been the first error)
    bad = ["--run", str(tmp_path / "missing"), "--extension", "yarn", "factor=-1"]
    assert run_cli(ev.main, ev.parser(), bad) == 2
    assert "error: --extension yarn factor=-1: extension.factor: must be >= 1" in capsys.readouterr().err

    cmp = _script("compare_runs")
    assert run_cli(cmp.main, cmp.parser(), [str(fake_run), str(fake_run / "train" / "eval-dynamic"), "--out",
                                            str(tmp_path / "cmp")]) == 0  # fmt: skip
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| run | 32 | 128 |" in table and "| run/train + dynamic |" in table
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000


def test_a_second_evaluation_into_the_folder_leaves_exactly_its_figures(fake_run):
    """Re-running into the same folder with fewer tasks used to leave the old passkey figures next to a report and a
    results.json without passkey, and a failed end-of-phase evaluation's error.txt next to a successful one. Only
    what minilm wrote goes; a user's files in the folder stay."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    out = fake_run / "train" / "eval"
    argv = ["--run", str(fake_run), "--lengths", "32,128", "--samples", "2", "--depths", "0,1", "--batches", "1",
            "--batch-tokens", "256", "--no-sliding", "--device", "cpu", "--no-tb"]  # fmt: skip
    assert run_cli(ev.main, ev.parser(), argv + ["--tasks", "ppl,passkey"]) == 0
    assert (out / "passkey_heatmap.png").is_file() and (out / "retrieval_vs_length.png").is_file()
    (out / "notes.txt").write_text("mine")
    (out / "my_plot.png").write_bytes(b"not minilm's")
    (out / "error.txt").write_text("evaluation failed: ...\n")  # as evaluate_phase leaves it
    assert run_cli(ev.main, ev.parser(), argv + ["--tasks", "ppl"]) == 0
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"ppl_vs_length.png", "per_position_loss.png", "my_plot.png"}, pngs
    assert (out / "notes.txt").read_text() == "mine" and (out / "my_plot.png").read_bytes() == b"not minilm's"
    assert not (out / "error.txt").exists()
    assert "passkey" not in json.loads((out / "results.json").read_text())
    assert "passkey_heatmap" not in (out / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # every file written whole, then moved in place


def test_evaluate_run_default_lengths(fake_run):
    res, out = evaluate_run(fake_run, tasks=["ppl"], batches=1, batch_tokens=128, sliding=False, tensorboard=False,
                            device="cpu", seed=7, log=lambda *_: None)  # fmt: skip
    assert res["lengths"] == [32, 64, 128, 256, 512]
    assert res["phase"] == "train" and res["step"] == 1000
    # the settings that change the numbers, so that compare_runs.py can tell evaluations made otherwise
    settings = {"seed": 7, "batches": 1, "batch_tokens": 128, "sliding": False, "stride": None, "needles": 4}
    assert {k: json.loads((out / "results.json").read_text())[k] for k in settings} == settings
    # (those of the metrics measured: no stride without sliding windows, no needles without the needle task)
    assert "- settings: seed 7, batches 1, batch_tokens 128\n" in (out / "report.md").read_text()
    # what the perplexities were measured in and on: the run's tokenizer and its held-out documents
    from minilm.data.tokenizer import file_digest

    assert res["tokenizer_sha256"] == file_digest(fake_run / "tokenizer.model") and len(res["val_sha256"]) == 64


# ----------------------------------------------------------------------------------------- bad input, one message


@pytest.mark.parametrize(
    "extension,message",
    [
        ({"name": "rerope"}, "eval.extension.window: required"),
        ({"name": "rerope", "window": 8, "foo": 1}, "eval.extension.foo: unknown parameter"),
        ({"name": "self_extend", "group_size": 4}, "eval.extension.window: required"),
        ({"name": "yarn", "factor": 0.5}, "eval.extension.factor: must be >= 1, got 0.5"),
        ({"name": "yarn", "factor": 4, "bogus": 1}, "eval.extension.bogus: not a parameter of rope_type 'yarn'"),
        ({"name": "yarn", "rope_type": "linear", "factor": 4}, "eval.extension.rope_type: not a parameter here"),
        ({"name": "rope_scaling", "rope_type": "dynamic"}, "eval.extension.factor: required"),
    ],
)
def test_bad_extension_parameters_fail_when_the_config_loads(extension, message):
    # not only after a whole phase has trained (evaluate_phase would write them to eval/error.txt)
    with pytest.raises(ConfigError, match=message):
        validate_eval({"lengths": [64], "extension": extension})


@pytest.mark.parametrize("extension", [{"name": "logn"}, {"name": "yarn", "factor": 4}, {"name": "dynamic_yarn"},
                                       {"name": "dca", "chunk_size": 48, "local_window": 4}])  # fmt: skip
def test_good_extensions_pass_config_validation(extension):
    validate_eval({"lengths": [64], "extension": extension})  # training-length defaults are filled in later


@pytest.mark.parametrize("position", ["alibi", "xpos", "learned"])
@pytest.mark.parametrize("extension", ["{name: yarn, factor: 2}", "{name: logn}"])
def test_an_extension_the_encoding_cannot_take_fails_when_the_config_loads(position, extension):
    """Every extension needs plain RoPE: an ALiBi config with eval.extension trained its phases, then failed the
    evaluation at the end of each (eval/error.txt)."""
    from minilm.config import load_config
    from tests.conftest import REPO

    tiny = REPO / "configs/tiny.yaml"
    with pytest.raises(ConfigError, match=f"eval.extension.name: .* needs a RoPE model .* '{position}'"):
        load_config(tiny, [f"model.position={{name: {position}}}", f"eval.extension={extension}"])
    load_config(tiny, [f"eval.extension={extension}"])  # (tiny.yaml's RoPE takes it)


@pytest.mark.parametrize("name", ["longrope", "rope_scaling"])
def test_an_extension_s_lists_that_do_not_fit_the_rotary_dims_fail_when_the_config_loads(name):
    """longrope's lists need one entry per rotary frequency of the model (tiny.yaml: head_dim 32, 16 of them; at
    fraction 0.5, 8): a wrong list passed the config, the phase trained, and its evaluation failed naming
    model.position.scaling.short_factor, which the config does not set."""
    from minilm.config import load_config
    from tests.conftest import REPO

    def extension(n):
        lists = f"short_factor: [{', '.join(['1.0'] * n)}], long_factor: [{', '.join(['1.0'] * n)}]"
        rope_type = "rope_type: longrope, " if name == "rope_scaling" else ""
        return f"eval.extension={{name: {name}, {rope_type}factor: 2.0, {lists}}}"

    tiny = REPO / "configs/tiny.yaml"
    with pytest.raises(ConfigError, match=r"^eval\.extension\.short_factor: .*frequency \(16\), got 2"):
        load_config(tiny, [extension(2)])
    with pytest.raises(ConfigError, match=r"^eval\.extension\.short_factor: .*frequency \(8\), got 16"):
        load_config(tiny, [extension(16), "model.position.fraction=0.5"])
    with pytest.raises(ConfigError, match=r"^eval\.extension\.short_factor: in phase 'b' .*\(8\), got 16"):
        load_config(tiny, [extension(16), "phases.a.steps=1", "phases.b.steps=1", "phases.b.position.fraction=0.5"])
    load_config(tiny, [extension(16)])


@pytest.mark.parametrize("extension", [{"name": "logn"}, {"name": "yarn", "factor": 2}])
def test_an_extension_on_a_model_without_rope_names_its_encoding(corpus_setup, extension):
    """A learned table's attention layers hold an Identity position module: --extension logn said the encoding was
    'Identity', which no config names."""
    from omegaconf import OmegaConf

    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, name="learned", max_positions=128)
    model_cfg = OmegaConf.merge(cfg.model, {"position": {"name": "learned", "max_positions": 128}})
    with pytest.raises(ConfigError, match="needs a RoPE model .*this model's encoding is 'learned'"):
        apply_extension(model, model_cfg, corpus.tokenizer.vocab_size, extension, 64)


def test_a_scaling_extension_cannot_change_its_rope_type(corpus_setup):
    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size)
    with pytest.raises(ConfigError, match="^extension.rope_type"):  # would have built a linear model as 'yarn'
        apply_extension(model, cfg.model, corpus.tokenizer.vocab_size,
                        {"name": "yarn", "rope_type": "linear", "factor": 4}, 64)  # fmt: skip
    with pytest.raises(ConfigError, match="^extension.factor: must be >= 1"):
        apply_extension(model, cfg.model, corpus.tokenizer.vocab_size, {"name": "yarn", "factor": 0.5}, 64)
    # the block's keys, under where the caller's user wrote it (evaluate_phase: the config's eval.extension)
    with pytest.raises(ConfigError, match="^eval.extension.factor: must be >= 1"):
        apply_extension(model, cfg.model, corpus.tokenizer.vocab_size, {"name": "yarn", "factor": 0.5}, 64,
                        "eval.extension")  # fmt: skip


def test_an_extension_the_run_cannot_take_is_named_where_it_was_written(fake_run, capsys):
    """evaluate.py --extension yarn factor=2 on an ALiBi run said 'extension.name: 'yarn' needs a RoPE model', a key
    no command line has: an error found once the run is read names the flag as typed, as the checks before it do
    (--extension longrope with lists that do not fit the model named extension.short_factor alone). An eval.extension
    of the run's config keeps its key."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--lengths", "32", "--tasks", "ppl", "--device", "cpu", "--no-tb"]
    lists = ["short_factor=[1,1]", "long_factor=[1,1]"]
    assert run_cli(ev.main, ev.parser(), [*argv, "--extension", "longrope", "factor=2", *lists]) == 2
    assert capsys.readouterr().err == ("error: --extension longrope factor=2 short_factor=[1,1] long_factor=[1,1]: "
                                       "extension.short_factor: must have one entry per rotary frequency (8), got 2\n")
    configure_run(fake_run, **{"model.position": {"name": "alibi"}})
    assert run_cli(ev.main, ev.parser(), [*argv, "--extension", "yarn", "factor=2"]) == 2
    assert capsys.readouterr().err == ("error: --extension yarn factor=2: 'yarn' needs a RoPE model "
                                       "(model.position.name: rope); this model's encoding is 'alibi'\n")
    configure_run(fake_run, **{"eval.extension": {"name": "logn"}})
    assert run_cli(ev.main, ev.parser(), argv) == 2
    assert capsys.readouterr().err == ("error: eval.extension.name: 'logn' needs a RoPE model "
                                       "(model.position.name: rope); this model's encoding is 'alibi'\n")
    assert not [p.name for p in (fake_run / "train").iterdir() if p.name.startswith("eval")]


@pytest.mark.parametrize("name", ["longrope", "rope_scaling"])
def test_an_extension_s_lists_that_do_not_fit_the_rotary_dims_name_the_extension(corpus_setup, name):
    """--extension longrope with lists of the wrong length (checked against the model only once it is loaded) said
    model.position.scaling.short_factor, a key of the run's config the user never set; now the extension's key."""
    from minilm.positions.rotary import rotary_dim

    cfg, corpus = corpus_setup
    model, n = tiny_gpt(cfg, corpus.tokenizer.vocab_size), rotary_dim(cfg.model.d_model // cfg.model.n_heads, 1.0) // 2
    extension = {"name": name, "factor": 2.0, "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0]}
    if name == "rope_scaling":
        extension["rope_type"] = "longrope"
    with pytest.raises(ConfigError, match=rf"^extension\.short_factor: .*frequency \({n}\), got 2$"):
        apply_extension(model, cfg.model, corpus.tokenizer.vocab_size, extension, 64)
    good = {**extension, "short_factor": [1.0] * n, "long_factor": [1.0] * n}
    apply_extension(model, cfg.model, corpus.tokenizer.vocab_size, good, 64)[1]()


@pytest.mark.parametrize("extension", [{"name": "yarn", "factor": 4, "partial_rotary_factor": 0.5},
                                       {"name": "rope_scaling", "rope_type": "linear", "factor": 2,
                                        "partial_rotary_factor": 0.5}])  # fmt: skip
def test_an_extension_cannot_change_which_dimensions_rotate(corpus_setup, extension):
    """--extension yarn factor=4 partial_rotary_factor=0.5 was taken, and its results filed as YaRN's: it rotated
    half the dimensions the weights were trained to rotate (at other frequencies), another model rather than a context
    extension of this one. Its own value (1 here) is allowed."""
    cfg, corpus = corpus_setup
    V = corpus.tokenizer.vocab_size
    model = tiny_gpt(cfg, V)
    with pytest.raises(ConfigError, match=r"^extension\.partial_rotary_factor: must be the model's own \(1\), got 0\.5"):
        apply_extension(model, cfg.model, V, extension, 64)
    apply_extension(model, cfg.model, V, {**extension, "partial_rotary_factor": 1.0}, 64)[1]()


@pytest.mark.parametrize("extension", [{"name": "linear", "factor": 1}, {"name": "rope_scaling", "rope_type": "default"}])
def test_an_extension_keeps_the_dimensions_the_model_rotates(corpus_setup, eval_data, extension):
    """A model trained with model.position.scaling.partial_rotary_factor 0.5 rotated every dimension under any
    extension, whose block replaced its own: PI with factor 1, which changes nothing, changed its logits."""
    from omegaconf import OmegaConf

    cfg, corpus = corpus_setup
    V = corpus.tokenizer.vocab_size
    position = {"name": "rope", "scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}}
    model = tiny_gpt(cfg, V, seed=1, **position)
    model_cfg = OmegaConf.merge(cfg.model, {"position": position})
    x = torch.from_numpy(np.asarray(eval_data.val.tokens[:64], dtype=np.int64)).unsqueeze(0)
    with torch.no_grad():
        ref = model(x)
        scaled, undo = apply_extension(model, model_cfg, V, extension, 64)
        torch.testing.assert_close(scaled(x), ref)
        undo()


@pytest.mark.parametrize("share", [0.5, None])
def test_the_extension_as_applied_shows_the_rotary_share_the_model_carries(corpus_setup, share):
    """What results.json, the report, generate.py's line and a study's settings check show of an extension: with the
    training length filled in and, on a model whose scaling rotates part of each head, that share (applied, it was
    left out, though the extension rotated only those dimensions)."""
    from omegaconf import OmegaConf

    from minilm.eval import applied_extension

    cfg, _ = corpus_setup
    scaling = {"rope_type": "default", **({"partial_rotary_factor": share} if share else {})}
    model_cfg = OmegaConf.merge(cfg.model, {"position": {"name": "rope", "scaling": scaling}})
    got = applied_extension({"name": "yarn", "factor": 4}, model_cfg, 64)
    assert got == {"name": "yarn", "factor": 4, "original_max_position_embeddings": 64,
                   **({"partial_rotary_factor": share} if share else {})}  # fmt: skip
    assert applied_extension({"name": "logn"}, model_cfg, 64) == {"name": "logn", "train_len": 64}


def test_an_eval_extension_that_changes_which_dimensions_rotate_fails_when_the_config_loads():
    from minilm.config import load_config
    from tests.conftest import REPO

    with pytest.raises(ConfigError, match=r"^eval\.extension\.partial_rotary_factor: must be the model's own \(1\)"):
        load_config(REPO / "configs/tiny.yaml", ["eval.extension={name: yarn, factor: 2, partial_rotary_factor: 0.5}"])


def test_resolve_device(monkeypatch):
    from minilm.eval import resolve_device

    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="device: must be cpu, cuda or cuda:N, got 'xyz'"):
        resolve_device("xyz")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device(None) == "cpu"
    with pytest.raises(ConfigError, match="no usable CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="has 1 CUDA GPU"):
        resolve_device("cuda:3")


def test_evaluate_takes_the_run_first_or_as_a_flag(tmp_path, fake_run, capsys):
    """``evaluate.py runs/tiny``, as generate.py, export_hf.py and compare_runs.py take their run, said '--run is
    required'. The run comes first, after --extension's parameters (which take it), or as --run: the same
    evaluation. Two different runs, or none, is one message naming how to write it."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    flags = ["--lengths", "32", "--tasks", "ppl", "--batches", "1", "--no-tb", "--device", "cpu"]
    results = []
    for i, argv in enumerate(([str(fake_run), *flags], ["--run", str(fake_run), *flags],
                              [*flags, "--extension", "none", str(fake_run)], [str(fake_run), "--run", str(fake_run),
                                                                                *flags])):  # fmt: skip
        assert run_cli(ev.main, ev.parser(), [*argv, "--out", str(tmp_path / f"e{i}")]) == 0, capsys.readouterr().err
        results.append(json.loads((tmp_path / f"e{i}" / "results.json").read_text())["ppl"])
    assert results[0] == results[1] == results[2] == results[3] and results[0]["32"] is not None
    other = tmp_path / "other"
    assert run_cli(ev.main, ev.parser(), [str(fake_run), "--run", str(other), *flags]) == 2
    assert f"error: two runs given, {str(fake_run)!r} and --run {str(other)!r}; give one" in capsys.readouterr().err
    assert run_cli(ev.main, ev.parser(), flags) == 2
    assert "error: no run directory or checkpoint given; write: evaluate.py RUN ..." in capsys.readouterr().err
    assert run_cli(ev.main, ev.parser(), [*flags, "--extension", "yarn", "oops", str(fake_run)]) == 2
    assert "error: --extension yarn: 'oops' is not a parameter" in capsys.readouterr().err


def test_scripts_give_one_message_for_bad_input(tmp_path, fake_run, capsys):
    from minilm.cli import run_cli

    ev, gen, cmp = _script("evaluate"), _script("generate"), _script("compare_runs")
    argv = ["--run", str(fake_run), "--lengths", "32", "--tasks", "ppl", "--batches", "1", "--no-tb"]
    assert run_cli(ev.main, ev.parser(), argv + ["--device", "xyz"]) == 2
    assert "device: must be cpu, cuda or cuda:N" in capsys.readouterr().err
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert run_cli(ev.main, ev.parser(), argv + ["--out", str(not_a_dir)]) == 2
    assert f"{not_a_dir}: cannot write the evaluation output there" in capsys.readouterr().err
    assert run_cli(gen.main, gen.parser(), [str(fake_run), "--prompt", "x", "--device", "xyz"]) == 2
    assert "--device: must be cpu" in capsys.readouterr().err

    bad, listed = tmp_path / "bad.json", tmp_path / "list.json"
    bad.write_text("{bad")
    listed.write_text("[1, 2]")
    assert run_cli(cmp.main, cmp.parser(), [str(bad), "--out", str(tmp_path / "c")]) == 2
    assert f"{bad}: not a results.json of scripts/evaluate.py (invalid JSON at line 1" in capsys.readouterr().err
    assert run_cli(cmp.main, cmp.parser(), [str(listed), "--out", str(tmp_path / "c")]) == 2
    assert "a JSON object expected, got list" in capsys.readouterr().err
    assert run_cli(cmp.main, cmp.parser(), [str(fake_run / "config.yaml"), "--out", str(tmp_path / "c")]) == 2
    good = tmp_path / "results.json"
    good.write_text(json.dumps({"lengths": [32], "ppl": {"32": 10.0}}))
    assert run_cli(cmp.main, cmp.parser(), [str(good), "--out", str(not_a_dir)]) == 2
    assert "cannot write the evaluation output there" in capsys.readouterr().err


def test_extension_demo_labels_and_bad_input(capsys):
    from minilm.cli import run_cli

    demo = _script("extension_eval_demo")
    labels = list(demo.methods(32, 2))
    assert "PI (linear, factor 2)" in labels and "YaRN (factor 2)" in labels and "NTK-aware (ntk, factor 2)" in labels
    assert not any("factor 4" in label for label in labels)
    assert run_cli(demo.main, demo.parser(), ["--seq-len", "1"]) == 2
    assert "--seq-len: must be >= 2, got 1" in capsys.readouterr().err
    assert run_cli(demo.main, demo.parser(), ["model.bogus=1"]) == 2
    assert "model.bogus" in capsys.readouterr().err


def test_evaluate_s_range_errors_name_the_flag_or_the_config_key(fake_run, capsys):
    """evaluate.py --samples 0 said 'eval.samples: must be >= 1', a key the user never wrote: a value given by a flag
    is named by the flag, one from the run's config by its key (a stride the config sets, against --lengths)."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    for flags, said in ((["--samples", "0"], "--samples: must be >= 1, got 0"),
                        (["--needles", "0"], "--needles: must be >= 1, got 0"),
                        (["--batches", "0"], "--batches: must be >= 1, got 0"),
                        (["--batch-tokens", "0"], "--batch-tokens: must be >= 1, got 0"),
                        (["--stride", "0"], "--stride: must be >= 1 or null, got 0"),
                        (["--depths", "0,2"],
                         "--depths: must be a non-empty list of numbers in [0, 1], got [0.0, 2.0]"),
                        (["--lengths", "1"], "--lengths: must be integers >= 2, got [1]"),
                        (["--tasks", "ppl,kvv"], "--tasks: unknown task(s) ['kvv']; allowed: ppl, passkey, needle, kv"),
                        (["--lengths", "32,64", "--stride", "40"],
                         "--stride: must be <= the shortest of --lengths (32) for sliding windows, got 40"),
                        (["--stride", "40"],
                         "--stride: must be <= the shortest length (32) for sliding windows, got 40"),
                        (["--device", "xyz"], "--device: must be cpu, cuda or cuda:N, got 'xyz'")):  # fmt: skip
        assert run_cli(ev.main, ev.parser(), ["--run", str(fake_run), "--no-tb", *flags]) == 2
        assert capsys.readouterr().err == f"error: {said}\n"
    configure_run(fake_run, **{"eval.stride": 40})
    assert run_cli(ev.main, ev.parser(), ["--run", str(fake_run), "--no-tb", "--lengths", "32,64"]) == 2
    assert capsys.readouterr().err == ("error: eval.stride: must be <= the shortest of --lengths (32) for sliding "
                                       "windows, got 40\n")  # fmt: skip
    assert not (fake_run / "train" / "eval").exists()


# values wrong whatever the run: refused before it is loaded
BAD_FLAGS = [(["--samples", "0"], "--samples: must be >= 1, got 0"),
             (["--needles", "-1"], "--needles: must be >= 1, got -1"),
             (["--batches", "0"], "--batches: must be >= 1, got 0"),
             (["--batch-tokens", "0"], "--batch-tokens: must be >= 1, got 0"),
             (["--stride", "0"], "--stride: must be >= 1 or null, got 0"),
             (["--depths", "0,2"], "--depths: must be a non-empty list of numbers in [0, 1], got [0.0, 2.0]"),
             (["--lengths", "1"], "--lengths: must be integers >= 2, got [1]"),
             (["--lengths", "64,64"], "--lengths: has repeats: [64, 64]"),
             (["--tasks", "ppl,kvv"], "--tasks: unknown task(s) ['kvv']; allowed: ppl, passkey, needle, kv"),
             (["--lengths", "32,64", "--stride", "40"],
              "--stride: must be <= the shortest of --lengths (32) for sliding windows, got 40"),
             (["--stride", "16", "--no-sliding"],
              "--stride: sets the sliding-window perplexity's stride, which --no-sliding skips; give one of them"),
             # the keys it may be, without rope_type: the method's name is the rope_type, and rope_type=... is refused
             (["--extension", "linear", "factr=4"], "--extension linear factr=4: extension.factr: not a parameter of "
                                                    "rope_type 'linear'; it takes: factor, partial_rotary_factor"),
             (["--extension", "none", "a=1"], "--extension none takes no parameters, got a=1"),
             (["--extension", "yarn", "factor=0.5"], "--extension yarn factor=0.5: extension.factor: must be >= 1, "
                                                     "got 0.5"),
             (["--out", ""], "--out: empty; give an output directory, or leave --out out for RUN/PHASE/eval[-METHOD]/"),
             (["--device", ""], "--device: must be cpu, cuda or cuda:N, got ''")]  # fmt: skip


@pytest.mark.parametrize("flags,said", BAD_FLAGS)
def test_a_flag_wrong_whatever_the_run_is_refused_before_the_run_is_loaded(tmp_path, monkeypatch, capsys, flags,
                                                                             said):  # fmt: skip
    """--samples 0 (and every range check of the eval settings) was refused only once the run's weights and config
    were loaded, seconds to minutes for a large run; --out '' and --device '' took the default silently."""
    import minilm.runs
    from minilm.cli import run_cli

    def load_run(*args, **kwargs):
        raise AssertionError("the run was loaded before its flags were checked")

    monkeypatch.setattr(minilm.runs, "load_run", load_run)
    ev = _script("evaluate")
    assert run_cli(ev.main, ev.parser(), ["--run", str(tmp_path / "run"), "--no-tb", *flags]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"


def test_a_stride_is_checked_against_the_lengths_evaluated_not_the_configs(fake_run):
    """With eval.lengths [32] in the run's config, --lengths 128 --stride 64 was refused ('must be <= the shortest
    length (32)'): the stride was checked against the config's lengths before --lengths replaced them."""
    configure_run(fake_run, **{"eval.lengths": [32]})
    res, _ = evaluate_run(fake_run, lengths=[128], tasks=["ppl"], stride=64, batches=1, batch_tokens=128,
                          tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip
    assert res["lengths"] == [128] and res["stride"] == 64 and res["ppl_sliding"]["128"] is not None


def test_a_stride_longer_than_a_length_is_refused_up_front(fake_run):
    # it used to record ppl at that length and list ppl as skipped there too, with ppl_sliding null
    with pytest.raises(ConfigError, match=r"eval.stride: must be <= the shortest length \(32\) for sliding"):
        evaluate_run(fake_run, lengths=[32, 128], tasks=["ppl"], stride=100, tensorboard=False, device="cpu",
                     log=lambda *_: None)  # fmt: skip


def test_a_stride_with_the_sliding_windows_turned_off_is_refused(fake_run):
    """evaluate_run(sliding=False, stride=N) ignored the stride without a word (scripts/evaluate.py refuses
    --no-sliding with --stride): the contradiction is refused, naming both, before the run is read."""
    with pytest.raises(ConfigError, match=r"stride=100 sets the sliding-window .*sliding=False skips; give one"):
        evaluate_run(fake_run, lengths=[32], tasks=["ppl"], stride=100, sliding=False, batches=1, batch_tokens=64,
                     tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip


def test_a_misspelled_setting_of_evaluate_run_is_named_with_the_one_meant(fake_run):
    # (it was a TypeError from EvalSettings.__init__, after the run was loaded)
    with pytest.raises(ConfigError, match=r"evaluate_run: unknown setting 'strid'; did you mean 'stride'\? \(its "
                                          r"settings: batches, batch_tokens, sliding, stride, "):  # fmt: skip
        evaluate_run(fake_run, lengths=[32], tasks=["ppl"], strid=8, tensorboard=False, device="cpu",
                     log=lambda *_: None)  # fmt: skip


@pytest.mark.parametrize("sliding", ["no", 0])
def test_a_sliding_that_is_not_true_or_false_is_refused(fake_run, sliding):
    """evaluate_run(sliding="no") measured the sliding windows (a non-empty text is true), and sliding=0 skipped them
    and ignored a stride given with it: only true or false is taken, as eval.sliding in a config."""
    with pytest.raises(ConfigError, match=r"sliding: must be true or false, got "):
        evaluate_run(fake_run, lengths=[32], tasks=["ppl"], stride=8, sliding=sliding, batches=1, batch_tokens=64,
                     tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip


def test_a_stride_measures_the_sliding_windows_where_the_config_turns_them_off(fake_run):
    """With eval.sliding: false in the run's config, --stride 16 was ignored without a word: no ppl_sliding, and the
    script has no flag to turn the sliding windows on. A stride given asks for them (--no-sliding with it is refused)."""
    from minilm.cli import run_cli

    configure_run(fake_run, **{"eval.sliding": False})
    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--no-tb", "--device", "cpu", "--tasks", "ppl", "--lengths", "32", "--batches", "1",
            "--batch-tokens", "64", "--stride", "16"]  # fmt: skip
    assert run_cli(ev.main, ev.parser(), argv) == 0
    res = json.loads((fake_run / "train" / "eval" / "results.json").read_text())
    assert res["sliding"] is True and res["stride"] == 16 and res["ppl_sliding"]["32"] is not None
    assert res["details"]["ppl"]["32"]["sliding"]["stride"] == 16


def test_a_setting_no_chosen_task_reads_is_noted(fake_run, capsys):
    """--stride, --batches or --needles given with tasks that do not read them were accepted and unused without a
    word; each is now noted, naming the metrics that read it. A setting a task reads is not."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--no-tb", "--device", "cpu", "--tasks", "passkey", "--lengths", "128",
            "--samples", "1", "--depths", "0.5", "--stride", "8", "--needles", "3"]  # fmt: skip
    assert run_cli(ev.main, ev.parser(), argv) == 0
    out = capsys.readouterr().out
    assert "note: --stride 8 has no effect: it is read by ppl_sliding, and the tasks measured are passkey" in out
    assert "note: --needles 3 has no effect: it is read by needle" in out
    assert "--samples" not in out.split("note:", 1)[-1] and "--depths" not in out.split("note:", 1)[-1]


def test_results_name_the_run_by_its_absolute_path(fake_run, tmp_path, monkeypatch):
    """``scripts/evaluate.py --run runs/x`` recorded ``"run": "runs/x"`` (and the weights file) as typed: a
    results.json or compare.md read from another folder did not say which run it measured. Both are absolute, and
    the report and compare_runs.py's table say the same path."""
    from minilm.cli import run_cli

    monkeypatch.chdir(fake_run.parent)
    res, out = evaluate_run(Path(fake_run.name) / "train" / "model.safetensors", lengths=[32], tasks=["ppl"],
                            batches=1, batch_tokens=64, sliding=False, tensorboard=False, device="cpu",
                            log=lambda *_: None)  # fmt: skip
    saved = json.loads((out / "results.json").read_text())
    assert saved["run"] == res["run"] == str(fake_run.resolve())
    assert saved["weights"] == str((fake_run / "train" / "model.safetensors").resolve())
    assert f"- run: `{fake_run.resolve()}`" in (out / "report.md").read_text()
    monkeypatch.chdir(tmp_path)
    cmp = _script("compare_runs")
    assert run_cli(cmp.main, cmp.parser(), [str(fake_run), "--out", "cmp"]) == 0
    assert f"`{fake_run.resolve()}`" in (tmp_path / "cmp" / "compare.md").read_text()
