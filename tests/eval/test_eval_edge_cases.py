"""Evaluation edge cases a user runs into: needles in long-line text, a model whose outputs are not finite, where
an evaluation of a config's own ``eval.extension`` is written, compare_runs on files that are not evaluations,
empty CLI lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from minilm.data.synthetic import MAX_LINE_TOKENS
from minilm.eval import EvalSettings, evaluate, write_report
from minilm.eval.retrieval import make_needle_sample

from tests.conftest import load_script

from .conftest import make_cfg, tiny_gpt



def _script(name: str):
    return load_script(f"scripts/{name}.py")


def test_needle_depths_stay_apart_in_long_lines(eval_data):
    """A needle goes to the start of the line its depth falls in, but (as the passkey) never further back than one
    line's worth of tokens: in text with long lines (prose paragraphs) every depth used to collapse onto the one
    newline before it, so the needle grid's depth axis measured one position."""
    tok = eval_data.tokenizer
    nl = tok.encode("\n")
    assert len(nl) == 1
    word = next(t for t in range(3, tok.vocab_size) if t != nl[0] and t not in tok.encode('key_ = "0123456789"'))
    filler = [word] * 5 + nl + [word] * 2000
    starts = []
    for depth in (0.25, 0.5, 0.75, 1.0):
        p, a = make_needle_sample(tok, filler, 1024, depth, np.random.default_rng(0), needles=1)
        n_fill = p.count(word) + 1  # the filler tokens used: all of them `word` but one newline
        at = next(i for i, (x, y) in enumerate(zip(p, filler)) if x != y)  # where the needle starts
        starts.append(at)
        assert 0 <= round(depth * n_fill) - at <= MAX_LINE_TOKENS, (depth, at)
    assert starts == sorted(set(starts)), starts


class NaNModel(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, idx, positions=None, doc_ids=None, cache=None):
        return torch.full((*idx.shape, self.vocab), float("nan")) + self.p


def test_a_model_with_non_finite_outputs_is_reported_not_crashed(tmp_path, eval_data):
    """NaN logits (a diverged checkpoint, an overflow at long lengths) used to run the whole evaluation and then
    fail writing results.json (strict JSON has no NaN), losing everything; now each task is reported skipped."""
    V = eval_data.tokenizer.vocab_size
    settings = EvalSettings(lengths=[64], tasks=["ppl", "passkey"], batches=1, batch_tokens=128, samples=1,
                            depths=[0.5], seed=0)  # fmt: skip
    res = evaluate(NaNModel(V), eval_data, settings, log=lambda *_: None)
    assert res["ppl"]["64"] is None and res["ppl_sliding"]["64"] is None and res["passkey"]["64"] is None
    assert "non-finite" in res["skipped"]["ppl"]["64"] and "non-finite" in res["skipped"]["passkey"]["64"]
    write_report(res, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["ppl"]["64"] is None and "non-finite" in (tmp_path / "report.md").read_text()


class HugeLogitsModel(torch.nn.Module):
    """Finite logits, but so large that a wrong guess costs 10⁴ nats: exp(mean loss) overflows a float."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, idx, positions=None, doc_ids=None, cache=None):
        logits = torch.zeros(*idx.shape, self.vocab)
        logits[..., 0] = 1e4  # token 0 (unk) never occurs in the text
        return logits + self.p


def test_a_perplexity_that_overflows_is_reported_not_a_traceback(tmp_path, eval_data):
    """A mean loss above ~709 nats is finite, but exp() of it overflowed: math.exp raised OverflowError and the
    whole evaluation died with a traceback, losing every length already measured."""
    V = eval_data.tokenizer.vocab_size
    settings = EvalSettings(lengths=[64], tasks=["ppl"], batches=1, batch_tokens=128, seed=0)
    res = evaluate(HugeLogitsModel(V), eval_data, settings, log=lambda *_: None)
    assert res["ppl"]["64"] is None and res["ppl_sliding"]["64"] is None
    assert "perplexity overflows" in res["skipped"]["ppl"]["64"]
    write_report(res, tmp_path)  # strict JSON: no inf written
    assert json.loads((tmp_path / "results.json").read_text())["ppl"]["64"] is None


def test_a_finite_model_is_not_flagged(eval_data, corpus_setup):
    cfg, corpus = corpus_setup
    settings = EvalSettings(lengths=[64], tasks=["ppl", "passkey"], batches=1, batch_tokens=128, samples=1,
                            depths=[0.5], seed=0)  # fmt: skip
    res = evaluate(tiny_gpt(cfg, corpus.tokenizer.vocab_size), eval_data, settings, log=lambda *_: None)
    assert res["ppl"]["64"] is not None and res["passkey"]["64"] is not None and not any(res["skipped"].values())


def test_the_configs_own_extension_is_written_where_the_end_of_phase_evaluation_is(fake_run):
    """A run with ``eval.extension`` in its config: the end of the phase writes RUN/PHASE/eval/; scripts/evaluate.py
    without --extension used to write the same evaluation to eval-METHOD/ instead, so the phase had two reports
    and compare_runs (which reads eval/) showed the stale one. --extension still writes beside it."""
    from omegaconf import OmegaConf

    from minilm.cli import run_cli

    for path in (fake_run / "config.yaml", fake_run / "train" / "config.yaml"):
        cfg = OmegaConf.load(path)
        cfg.eval.extension = {"name": "rerope", "window": 16}
        path.write_text(OmegaConf.to_yaml(cfg))
    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--lengths", "32", "--tasks", "ppl", "--batches", "1", "--batch-tokens", "64",
            "--no-sliding", "--device", "cpu", "--no-tb"]  # fmt: skip
    assert run_cli(ev.main, ev.parser(), argv) == 0
    saved = json.loads((fake_run / "train" / "eval" / "results.json").read_text())
    assert saved["extension"] == {"name": "rerope", "window": 16}
    assert not (fake_run / "train" / "eval-rerope").exists()
    assert run_cli(ev.main, ev.parser(), argv + ["--extension", "rerope", "window=8"]) == 0
    assert json.loads((fake_run / "train" / "eval-rerope" / "results.json").read_text())["extension"]["window"] == 8
    assert json.loads((fake_run / "train" / "eval" / "results.json").read_text())["extension"]["window"] == 16
    # --extension none: the plain model, without the config's extension, beside the phase's own evaluation
    assert run_cli(ev.main, ev.parser(), argv + ["--extension", "none"]) == 0
    assert json.loads((fake_run / "train" / "eval-none" / "results.json").read_text())["extension"] is None
    assert run_cli(ev.main, ev.parser(), argv + ["--extension", "none", "window=8"]) == 2


@pytest.mark.parametrize("content,key", [({"ppl": 3}, "'ppl' must map lengths"), ({"passkey": {"64": "high"}},
                                         "'passkey' must map lengths"), ({"lengths": 64}, "'lengths' must be a list"),
                                         ({"ppl": {"abc": 5}}, "'ppl' must map lengths"),  # a ValueError traceback
                                         ({"foo": 1}, "none of ppl")])  # an empty table and figure, exit 0
def test_compare_runs_on_a_json_that_is_not_an_evaluation(tmp_path, capsys, content, key):
    from minilm.cli import run_cli

    bad = tmp_path / "results.json"
    bad.write_text(json.dumps(content))
    cmp = _script("compare_runs")
    assert run_cli(cmp.main, cmp.parser(), [str(bad), "--out", str(tmp_path / "c")]) == 2  # was a traceback
    err = capsys.readouterr().err
    assert f"{bad}: not a results.json of scripts/evaluate.py" in err and key in err


def test_compare_writes_its_files_whole(tmp_path, monkeypatch):
    """compare.png and compare.md go through minilm.files.atomic_write like the report (a crash while writing
    leaves the old file or the new one)."""
    import minilm.eval.report as report

    written = []

    def spy(real):
        def write(path, *args, **kwargs):
            written.append(Path(path).name)
            return real(path, *args, **kwargs)

        return write

    monkeypatch.setattr(report, "atomic_write", spy(report.atomic_write))
    monkeypatch.setattr(report, "atomic_write_text", spy(report.atomic_write_text))
    run = {"lengths": [32, 64], "ppl": {"32": 10.0, "64": 12.0}, "passkey": {"32": 1.0, "64": None}}
    fig, table = report.compare([run, run], ["a", "b"], tmp_path)
    assert sorted(written) == ["compare.md", "compare.png"]
    assert fig.stat().st_size > 1000 and "| a | 10.00 | 12.00 |" in table.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("flag", ["--lengths", "--tasks"])
@pytest.mark.parametrize("value", ["", ","])
def test_an_empty_list_on_the_command_line_is_an_error_not_the_default(fake_run, capsys, flag, value):
    # `--lengths ''` used to evaluate at the default lengths (L/2 .. 8L) and `--tasks ''` the config's tasks
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--device", "cpu", "--no-tb", flag, value]
    with pytest.raises(SystemExit) as e:
        run_cli(ev.main, ev.parser(), argv)
    assert e.value.code == 2
    assert f"argument {flag}: expected comma-separated" in capsys.readouterr().err
    assert not (fake_run / "train" / "eval").exists()


@pytest.mark.parametrize("item", ["window=[", "window=: 4", "window={"])
def test_an_extension_value_that_is_not_yaml_is_one_message(fake_run, capsys, item):
    # `--extension rerope window=[` (a typo) used to end in a yaml.parser.ParserError traceback, exit code 1
    from minilm.cli import run_cli

    ev = _script("evaluate")
    argv = ["--run", str(fake_run), "--device", "cpu", "--no-tb", "--lengths", "64", "--extension", "rerope", item]
    assert run_cli(ev.main, ev.parser(), argv) == 2
    err = capsys.readouterr().err
    assert f"--extension rerope: parameter '{item}': the value does not parse as YAML" in err
    assert "Traceback" not in err and not (fake_run / "train" / "eval-rerope").exists()


@pytest.mark.parametrize("flag,value,message", [("--lengths", "64,64", "error: --lengths: has repeats: [64, 64]"),
                                                  ("--depths", "0,0.5,0.50", "error: --depths: has repeats"),
                                                  ("--tasks", "passkey,passkey", "error: --tasks: has repeats")])
def test_a_repeated_length_depth_or_task_is_refused(fake_run, capsys, flag, value, message):
    # a repeated length was evaluated twice (two summary rows); a repeated depth overwrote the first one's cell in
    # the passkey / needle grid, whose numbers then disagreed with the per-length mean next to them; a repeated task
    # ran twice
    from minilm.cli import run_cli

    ev = _script("evaluate")
    given = {"--tasks": "passkey", "--lengths": "64", flag: value}
    argv = ["--run", str(fake_run), "--device", "cpu", "--no-tb", *(x for kv in given.items() for x in kv)]
    assert run_cli(ev.main, ev.parser(), argv) == 2
    assert message in capsys.readouterr().err
    assert not (fake_run / "train" / "eval" / "results.json").exists()


def test_the_rope_scaling_method_takes_the_training_length_as_its_original_length(corpus_setup):
    """docs/evaluation.md: original_max_position_embeddings defaults to the training length for scalings; the
    training-free `rope_scaling` method (rope_type as a parameter) used to require it while `dynamic` did not."""
    from minilm.eval import apply_extension, check_extension

    cfg, corpus = corpus_setup
    V = corpus.tokenizer.vocab_size
    model = tiny_gpt(cfg, V)
    check_extension({"name": "rope_scaling", "rope_type": "dynamic", "factor": 2}, "eval.extension")
    same, undo = apply_extension(model, cfg.model, V, {"name": "rope_scaling", "rope_type": "dynamic", "factor": 2},
                                 64)  # fmt: skip
    try:
        assert model.blocks[0].attn.extension.params["original_max_position_embeddings"] == 64
        x = torch.randint(0, V, (1, 100))
        rebuilt, _ = apply_extension(model, cfg.model, V, {"name": "dynamic", "factor": 2}, 64)
        with torch.no_grad():
            torch.testing.assert_close(same(x), rebuilt(x), rtol=1e-4, atol=1e-4)  # the two spellings agree
    finally:
        undo()


def test_heatmaps_show_lengths_that_were_not_measured(tmp_path):
    """docs: 'accuracy, length × depth (grey = not measured)'; a skipped length used to be left out of the heatmap
    and its table, so a reader could not tell it from one never asked for."""
    results = {"lengths": [64, 128], "depths": [0.0, 1.0], "tasks": ["needle"], "needle": {"64": None, "128": 0.5},
               "needle_grid": {"128": {"0": 0.0, "1": 1.0}},
               "skipped": {"needle": {"64": "a needle sample with 4 needles needs at least 88 tokens"}}}  # fmt: skip
    write_report(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| 64 | — | — |" in report and "| 128 | 0.00 | 1.00 |" in report
    from minilm.eval.report import _heatmap_figure

    fig = _heatmap_figure(results, "needle")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("n/a") == 2 and [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["64", "128"]


def test_a_greedy_continuation_with_a_pipe_keeps_the_examples_table_intact(tmp_path):
    # a '|' in a model's output split its table row into extra cells (GitHub tables split on it even in code)
    results = {"lengths": [64], "depths": [0.5], "tasks": ["passkey"], "passkey": {"64": 0.0},
               "examples": {"passkey": [{"length": 64, "depth": 0.5, "answer": '12345"', "greedy": "a | b `c`"}]}}
    write_report(results, tmp_path)
    row = next(line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| passkey | 64"))
    cells = [c for c in row.replace("\\|", "").split("|")[1:-1]]
    assert len(cells) == 5 and "`` 'a \\| b `c`' ``" in row


def test_retrieval_beyond_the_held_out_text_is_skipped_not_a_repeated_haystack(corpus_setup, eval_data):
    """docs: a task with too little held-out text is listed in skipped. The haystack used to wrap around the
    held-out split, so at such a length the prompt repeated the same text and was scored as usual."""
    cfg, corpus = corpus_setup
    n = int(eval_data.val.tokens.shape[0])
    L = n + 64
    settings = EvalSettings(lengths=[L], tasks=["passkey", "kv"], batches=1, batch_tokens=L, samples=1,
                            depths=[0.5], seed=0)  # fmt: skip
    res = evaluate(tiny_gpt(cfg, corpus.tokenizer.vocab_size), eval_data, settings, log=lambda *_: None)
    for task in ("passkey", "kv"):
        assert res[task][str(L)] is None
        assert f"the held-out split has {n} tokens, fewer than one haystack of {L}" in res["skipped"][task][str(L)]


def _evaluate_argv(path, lengths="32"):
    return ["--run", str(path), "--lengths", lengths, "--tasks", "ppl", "--batches", "1", "--batch-tokens", "64",
            "--no-sliding", "--device", "cpu", "--no-tb"]  # fmt: skip


def test_a_step_checkpoint_is_evaluated_into_its_own_folder_at_its_own_step(fake_run):
    """A step checkpoint's evaluation went to RUN/PHASE/eval/, replacing the evaluation of the phase's final weights,
    said the phase's last step, and did not say which weights it measured."""
    from safetensors.torch import load_file

    from minilm.cli import run_cli

    ev = _script("evaluate")
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(fake_run)) == 0
    final = json.loads((fake_run / "train" / "eval" / "results.json").read_text())
    ckpt = fake_run / "train" / "checkpoints" / "step-00000003.ckpt"
    ckpt.parent.mkdir()
    state = load_file(str(fake_run / "train" / "model.safetensors"))
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}, "global_step": 3}, ckpt)
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(ckpt)) == 0
    saved = json.loads((fake_run / "train" / "eval-step-00000003" / "results.json").read_text())
    assert saved["step"] == 3 and saved["weights"] == str(ckpt) and saved["label"] == "run/train @ step 3"
    assert saved["ppl"] == final["ppl"]  # the same weights
    assert json.loads((fake_run / "train" / "eval" / "results.json").read_text()) == final
    assert final["step"] > 3 and final["label"] == "run/train"


def test_a_later_phases_step_checkpoint_is_labelled_by_its_step_in_the_phase(fake_run):
    """A checkpoint of the second phase, step-00000003.ckpt, was labelled '.../b @ step 10' (the global step: 7 steps
    of the first phase before it) in its report, every figure and compare_runs' legend, beside its folder
    eval-step-00000003. The global step stays the results' step (TensorBoard's axis)."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from minilm.config import save_config
    from minilm.eval import evaluate_run

    cfg = OmegaConf.load(fake_run / "config.yaml")
    cfg.phases = {"train": {"steps": 7}, "b": {"steps": 5}}
    save_config(cfg, fake_run / "config.yaml")
    ckpt = fake_run / "b" / "checkpoints" / "step-00000003.ckpt"
    ckpt.parent.mkdir(parents=True)
    state = load_file(str(fake_run / "train" / "model.safetensors"))
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}, "global_step": 3}, ckpt)
    res, out = evaluate_run(ckpt, lengths=[32], tasks=["ppl"], batches=1, batch_tokens=64, sliding=False,
                            tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip
    assert out == fake_run / "b" / "eval-step-00000003"
    assert res["label"] == "run/b @ step 3" and res["step"] == 10 and res["phase_step"] == 3
    assert "phase: `b`, step 10 (step 3 of the phase)" in (out / "report.md").read_text()


def test_a_renamed_step_checkpoint_is_read_once_and_evaluated_at_its_step(fake_run, monkeypatch):
    """A .ckpt not named step-N.ckpt says its step inside: evaluate_run loaded the whole file (weights and optimizer
    state) a second time only to read it. Its folder, label and step are those of a step checkpoint."""
    from safetensors.torch import load_file

    from minilm.eval import evaluate_run

    ckpt = fake_run / "train" / "best.ckpt"
    state = load_file(str(fake_run / "train" / "model.safetensors"))
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}, "global_step": 3}, ckpt)
    loads, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loads.append(a[0]) or load(*a, **kw))
    res, out = evaluate_run(ckpt, lengths=[32], tasks=["ppl"], batches=1, batch_tokens=64, sliding=False,
                            tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip
    assert loads == [ckpt]
    assert out == fake_run / "train" / "eval-best" and res["step"] == 3 and res["label"] == "run/train @ step 3"


def test_weights_trained_with_another_encoding_are_refused_not_read_under_it(fake_run, corpus_setup, capsys):
    """RoPE and ALiBi weights have the same tensors: a RoPE phase's model.safetensors in an ALiBi run loaded silently
    and was evaluated as ALiBi. Weights now record the model section they trained with; another one is refused,
    naming both. A file without the record (older) loads as before, and so do kernel settings that compute alike."""
    from omegaconf import OmegaConf

    from minilm.cli import run_cli
    from minilm.config import save_config
    from minilm.errors import MinilmError
    from minilm.runs import load_run
    from minilm.training.checkpoint import save_weights

    cfg, corpus = corpus_setup
    weights = fake_run / "train" / "model.safetensors"
    save_weights(tiny_gpt(cfg, corpus.tokenizer.vocab_size), weights, cfg.model)
    load_run(fake_run, "train")  # the config it trained with

    def configure(**model):
        changed = OmegaConf.merge(cfg, {"model": model})
        for path in (fake_run / "config.yaml", fake_run / "train" / "config.yaml"):
            save_config(changed, path)

    configure(position={"name": "alibi"}, activation_checkpointing=True)
    says = (r"train/model.safetensors: these weights were trained with another model config than .*config.yaml "
            r"\(phase 'train'\):\n  model.position: trained with \{\"name\": \"rope\"\}, the config says "
            r"\{\"name\": \"alibi\"\}\n[^\n]*copied from another run")
    with pytest.raises(MinilmError, match=says):
        load_run(fake_run, "train")
    gen = _script("generate")
    assert run_cli(gen.main, gen.parser(), [str(weights), "--prompt", "x", "--device", "cpu"]) == 2
    assert "model.position: trained with" in capsys.readouterr().err
    configure(activation_checkpointing=True, loss_chunk_size=16)  # how it is computed, not what: the same outputs
    load_run(fake_run, "train")
    configure(position={"name": "alibi"})
    save_weights(tiny_gpt(cfg, corpus.tokenizer.vocab_size), weights)  # no record: as before
    load_run(fake_run, "train")


def test_init_std_counts_as_what_weights_compute_dropout_does_not():
    """A sinusoidal table's default scale is √2 · model.init_std: weights trained at one init_std compute otherwise
    under another. Dropout acts in training alone."""
    from pathlib import Path

    from minilm.errors import MinilmError
    from minilm.training.checkpoint import check_trained_with

    trained = {"position": {"name": "sinusoidal"}, "init_std": 0.02, "dropout": 0.1}
    check_trained_with(trained, {**trained, "dropout": 0.0}, Path("w"), "c")
    with pytest.raises(MinilmError, match="model.init_std: trained with 0.02, the config says 0.05"):
        check_trained_with(trained, {**trained, "init_std": 0.05}, Path("w"), "c")


def test_weights_read_with_a_model_default_spelled_out_are_the_same_model():
    """n_kv_heads null is n_heads, d_ff null is the MLP's default width: weights trained with the nulls were refused
    under a config that wrote the same values out ("trained with another model config"). Other values still are."""
    from pathlib import Path

    from minilm.errors import MinilmError
    from minilm.training.checkpoint import check_trained_with

    trained = {"position": {"name": "rope"}, "d_model": 64, "n_heads": 4, "n_kv_heads": None, "d_ff": None,
               "mlp": "swiglu"}  # fmt: skip
    check_trained_with(trained, {**trained, "n_kv_heads": 4, "d_ff": 192}, Path("w"), "c")
    check_trained_with(trained, {**trained, "position": {"name": "rope", "fraction": 1.0}}, Path("w"), "c")
    with pytest.raises(MinilmError, match="model.n_kv_heads: trained with null, the config says 2"):
        check_trained_with(trained, {**trained, "n_kv_heads": 2}, Path("w"), "c")
    with pytest.raises(MinilmError, match="model.d_ff: trained with null, the config says 256"):
        check_trained_with(trained, {**trained, "d_ff": 256}, Path("w"), "c")


def test_an_evaluation_that_measures_nothing_writes_nothing(fake_run, capsys):
    """Every length unsupported: results.json with nulls and a new report replaced the folder's earlier evaluation
    and its figures, and only then was the command refused (exit 2)."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(fake_run)) == 0
    folder = fake_run / "train" / "eval"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(fake_run, lengths="100000000")) == 2
    err = capsys.readouterr().err
    assert "nothing could be measured at any length, so nothing was written" in err and "at 100000000: skipped" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    # nor a folder made for it: an empty eval-logn/ beside the phase's eval/ read as an evaluation with logn
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(fake_run, lengths="100000000") + ["--extension", "logn"]) == 2
    assert not (fake_run / "train" / "eval-logn").exists()


@pytest.mark.parametrize("script, argv, said", [
    ("evaluate", ["--lengths", "64", "--lengths", "128"], "--lengths given twice"),
    ("evaluate", ["--extension", "rerope", "window=64", "--extension", "logn"], "--extension given twice"),
    ("evaluate", ["--extension", "rerope", "window=64", "window=32"], "parameter 'window' given twice"),
    ("generate", ["--prompt", "a", "--max-new-tokens", "5", "--max-new-tokens", "7"], "--max-new-tokens given twice"),
])  # fmt: skip
def test_an_option_given_twice_is_refused_not_the_last_one_taken(fake_run, capsys, script, argv, said):
    """argparse keeps the last of a repeated option: --lengths 64 --lengths 128 evaluated 128 alone, exit 0."""
    from minilm.cli import run_cli

    mod = _script(script)
    head = ["--run", str(fake_run), "--no-tb"] if script == "evaluate" else [str(fake_run)]
    try:  # argparse's own error (SystemExit 2), or ours (run_cli's exit code 2)
        code = run_cli(mod.main, mod.parser(), [*head, "--device", "cpu", *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2 and said in capsys.readouterr().err


def test_a_study_runs_report_and_every_figure_name_its_variant_and_seed(fake_run, tmp_path):
    """A study's runs with seeds sit in folders named seed<S> (yarn/seed1, pi/seed1): their report.md was titled
    'Evaluation: seed1/train' and their figures 'Per-position loss' alike, so two opened side by side could not be
    told apart. The label is the run's name, which a study sets to '<variant>-seed<S>'."""
    import shutil

    from minilm.config import load_config, save_config
    from minilm.eval import evaluate_run
    from minilm.eval import report as rep

    run = tmp_path / "study" / "yarn" / "seed1"
    shutil.copytree(fake_run, run)
    for path in (run / "config.yaml", run / "train" / "config.yaml"):
        save_config(load_config(path, ["run.name=yarn-seed1", f"run.dir={run}"]), path)
    res, out = evaluate_run(run, lengths=[32], tasks=["ppl", "passkey"], batches=1, batch_tokens=64, samples=1,
                            depths=[0.5], tensorboard=False, device="cpu", log=lambda *_: None)  # fmt: skip
    assert res["label"] == "yarn-seed1/train" and res["name"] == "yarn-seed1"
    assert (out / "report.md").read_text().startswith("# Evaluation: yarn-seed1/train\n")
    figures = [rep._ppl_figure(res), rep._position_figure(res), rep._heatmap_figure(res, "passkey"),
               rep._retrieval_figure(res)]  # fmt: skip
    for fig in figures:
        assert fig.axes[0].get_title().endswith("\nyarn-seed1/train"), fig.axes[0].get_title()


@pytest.mark.parametrize("where", ["", "train"])
def test_out_into_a_run_or_phase_directory_is_refused(fake_run, capsys, where):
    """--out RUN wrote results.json, report.md and the figures among the run's files and the side evaluation's
    scalars into the run's own tb/ (OUT/tb), and compare_runs.py RUN then read RUN/results.json in place of its
    last phase's evaluation; --out RUN/PHASE likewise, with a tb/ inside the phase."""
    from minilm.cli import run_cli

    ev = _script("evaluate")
    out = fake_run / where if where else fake_run
    before = sorted(p.name for p in out.iterdir())
    assert run_cli(ev.main, ev.parser(), ["--run", str(fake_run), "--device", "cpu", "--lengths", "64", "--tasks",
                                          "ppl", "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"error: --out: {out} is a minilm run or phase directory (it holds config.yaml)" in err
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_corpus_prepared_again_for_an_evaluation_is_said(corpus_setup, tmp_path, capsys):
    """data.cache_dir is relative to the working directory: evaluate.py run from another directory than training
    (or after the cache was deleted) prepared the whole corpus again there — minutes for a large one, and a new
    data/cache/ in that directory — without a word."""
    from minilm.eval import eval_data

    cfg, _ = corpus_setup
    moved = make_cfg(tmp_path / "elsewhere", Path(cfg.data.sources.tiny.paths[0]).parent)
    eval_data(moved)
    assert f"prepared {tmp_path / 'elsewhere'}" in capsys.readouterr().out
    eval_data(moved)  # (from the cache: nothing to say)
    assert capsys.readouterr().out == ""


def test_out_with_an_unexpanded_tilde_is_refused(fake_run, tmp_path, monkeypatch, capsys):
    """evaluate.py ... --out=~/evals (after '=' no shell expands it) wrote into a folder called '~' in the working
    directory and said 'report: ~/evals/report.md', as if in the home directory."""
    from minilm.cli import run_cli

    monkeypatch.chdir(tmp_path)
    ev = _script("evaluate")
    assert run_cli(ev.main, ev.parser(), _evaluate_argv(fake_run) + ["--out=~/evals"]) == 2
    err = capsys.readouterr().err
    assert "error: --out '~/evals': '~' is not expanded" in err and err.strip().endswith("e.g. --out $HOME/evals")
    assert not (tmp_path / "~").exists()


def test_an_empty_list_of_tasks_is_refused_in_the_config_and_from_python(fake_run):
    """eval.tasks: [] passed the config: the end of a phase wrote an empty report ('evaluating at lengths [64] ()'),
    and evaluate.py said 'nothing could be measured at any length' with no reason; evaluate_run(tasks=[]) evaluated
    the config's tasks without a word."""
    from minilm.config import load_config
    from minilm.errors import ConfigError
    from minilm.eval import evaluate_run

    with pytest.raises(ConfigError, match=r"^eval\.tasks: must name at least one task; allowed: ppl, passkey, needle, "
                                          r"kv \(set on the command line\)"):  # fmt: skip
        load_config(overrides=["eval.lengths=[64]", "eval.tasks=[]"])
    with pytest.raises(ConfigError, match=r"eval\.tasks: must name at least one task"):
        evaluate_run(fake_run, lengths=[64], tasks=[], device="cpu", tensorboard=False, log=lambda _: None)
    assert not (fake_run / "train" / "eval").exists()
