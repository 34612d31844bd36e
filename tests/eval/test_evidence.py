"""Evaluation outputs as evidence: what results.json, report.md and compare.md say about a number must be what was
measured — the extension's parameters as applied, how many prompts a retrieval accuracy rests on."""

from __future__ import annotations

import json

import pytest
import torch

from minilm.eval import evaluate_run

QUICK = dict(lengths=[32], tasks=["ppl"], batches=1, batch_tokens=64, sliding=False, tensorboard=False, device="cpu",
             log=lambda *_: None)  # fmt: skip


@pytest.mark.parametrize("extension,filled", [
    ({"name": "dynamic", "factor": 2}, {"original_max_position_embeddings": 64}),
    ({"name": "logn"}, {"train_len": 64}),
    ({"name": "rope_scaling", "rope_type": "dynamic", "factor": 2}, {"original_max_position_embeddings": 64}),
])  # fmt: skip
def test_the_report_names_the_extension_parameters_taken_from_the_training_length(fake_run, tmp_path, extension,
                                                                                  filled):  # fmt: skip
    """``--extension dynamic factor=2`` on a phase trained at 64 runs dynamic NTK with original length 64; results.json
    and report.md used to record only ``{name: dynamic, factor: 2}``, so a reader could not tell which original
    length the numbers were measured with (a later phase's training length, not the pretraining length)."""
    res, out = evaluate_run(fake_run, extension=extension, out=tmp_path / "ev", **QUICK)
    assert res["extension"] == {**extension, **filled}
    assert json.loads((out / "results.json").read_text())["extension"] == {**extension, **filled}
    key, value = next(iter(filled.items()))
    assert f'"{key}": {value}' in (out / "report.md").read_text()


def test_the_evaluation_s_first_line_names_the_extension_as_applied(fake_run, tmp_path):
    """``--extension dynamic factor=2`` printed the same first line as the plain model's evaluation: which method ran,
    and with which original length, was said only in the report written at the end."""
    lines = []
    quick = {**QUICK, "log": lines.append}
    evaluate_run(fake_run, extension={"name": "dynamic", "factor": 2}, out=tmp_path / "ev", **quick)
    assert lines[0].startswith("evaluating ")
    assert 'with extension {"name": "dynamic", "factor": 2, "original_max_position_embeddings": 64}' in lines[0]
    lines.clear()
    evaluate_run(fake_run, out=tmp_path / "plain", **quick)
    assert "extension" not in lines[0]


def _retrieval_results(passkey: dict, samples: int = 2, depths=(0.0, 1.0)) -> dict:
    """A results dict as the suite writes it: passkey accuracy per length over samples × depths prompts."""
    n = samples * len(depths)
    return {"lengths": [int(L) for L in passkey], "depths": list(depths), "samples": samples, "tasks": ["passkey"],
            "train_seq_len": 64, "run": "r", "phase": "p", "label": "r/p", "passkey": passkey,
            "passkey_grid": {L: {f"{d:g}": v for d in depths} for L, v in passkey.items()},
            "details": {"passkey": {L: {"samples": n} for L in passkey}}}  # fmt: skip


def test_wilson_interval_known_values():
    from minilm.eval.report import wilson_interval

    lo, hi = wilson_interval(0.0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)  # 0 of 10 does not rule out 28 %
    assert wilson_interval(0.4, 10) == pytest.approx((0.1682, 0.6873), abs=1e-4)
    assert wilson_interval(1.0, 100) == pytest.approx((0.9630, 1.0), abs=1e-4)


def test_the_report_says_how_many_prompts_an_accuracy_counts_and_its_interval(tmp_path):
    """Passkey 0.40 from 10 prompts used to be reported as a bare 0.40 (the report's header named the prompts per
    (length, depth) cell, not per length, and compare.md nothing at all): a reader could not tell it from 0.40 of
    1000. The summary and compare.md now give each accuracy its 95 % interval and say n."""
    from minilm.eval import compare, write_report

    res = _retrieval_results({"64": 0.4, "128": 0.0}, samples=5)
    write_report(res, tmp_path / "ev")
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "| 64 | 0.40 [0.17, 0.69] |" in report and "| 128 | 0.00 [0.00, 0.28] |" in report
    assert "over n prompts per length (passkey 10)" in report
    assert "Exact-match accuracy over 5 prompts per cell." in report
    _, table = compare([res], ["rope"], tmp_path / "cmp")
    text = table.read_text()
    assert "| rope | 0.40 [0.17, 0.69] | 0.00 [0.00, 0.28] |" in text and "prompts per length: rope 10." in text


def test_the_report_says_which_perplexities_read_the_packed_stream(corpus_setup, eval_data):
    """Past the longest held-out document perplexity reads the packed stream, across document boundaries; only
    results.json's details said so, and report.md's table showed those lengths as any other."""
    from minilm.eval import EvalSettings, evaluate
    from minilm.eval.report import markdown

    from .conftest import tiny_gpt

    cfg, corpus = corpus_setup
    longest = int(max(eval_data.val.doc_lengths))
    lengths = [32, longest + 8]  # (the second longer than any held-out document, shorter than the stream)
    settings = EvalSettings(lengths=lengths, tasks=["ppl"], batches=1, batch_tokens=64, sliding=True)
    res = evaluate(tiny_gpt(cfg, corpus.tokenizer.vocab_size), eval_data, settings, log=lambda *_: None)
    assert res["details"]["ppl"][str(lengths[1])]["windows"]["source"] == "packed"
    report = markdown(res, {})
    assert f"Perplexity at {lengths[1]}: no held-out document holds L + 1 tokens" in report
    assert "Perplexity at 32" not in report


def test_the_retrieval_figure_draws_intervals_and_the_heatmap_marks_the_training_length():
    """The heatmap used to have no mark of the training length (the other figures do), so the columns beyond it
    could not be told from those within; the retrieval curves had no error bars and no n."""
    from minilm.eval.report import _heatmap_figure, _retrieval_figure

    res = _retrieval_results({"32": 1.0, "64": 0.4, "128": 0.0})
    ax = _heatmap_figure(res, "passkey").axes[0]
    dashed = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed == [1.5]  # between column 1 (64, the training length) and column 2 (128)
    assert "trained at 64" in ax.get_xlabel() and "4 prompts per cell" not in ax.get_title()
    assert "2 prompts per cell" in ax.get_title()
    ax = _retrieval_figure(res).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train length 64", "passkey (n=4)"]
    assert ax.containers, "no error bars"


def test_one_prompt_is_one_prompt_and_every_title_and_axis_label_fits_its_figure():
    """With 2 lengths the heatmap was 3 inches wide: its title and axis label were cut at both edges. The
    perplexity figure's title ran off with a long label; and one sample read "1 prompts"."""
    from minilm.eval.report import _heatmap_figure, _position_figure, _ppl_figure, _retrieval_figure, markdown

    res = _retrieval_results({"64": 1.0, "128": 0.5}, samples=1)
    res.update(label="rope_yarn_tiny/extend_512 @ step 200 + self_extend", ppl={"64": 30.0, "128": 40.0})
    # (every figure's title names the run under it: the heatmap, narrower, is widened for it)
    for fig in (_heatmap_figure(res, "passkey"), _ppl_figure(res), _position_figure(res), _retrieval_figure(res)):
        fig.canvas.draw()
        ax = fig.axes[0]
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
            box = text.get_window_extent()
            assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0 and box.y1 <= fig.bbox.y1, text.get_text()
    assert "(1 prompt per cell)" in _heatmap_figure(res, "passkey").axes[0].get_title()
    report = markdown(res, {})
    assert "1 sample per retrieval cell" in report and "over 1 prompt per cell." in report
    assert " 1 prompts" not in report


@pytest.mark.parametrize("extension,said", [
    ({"name": "dca", "chunk_size": 48, "local_window": 4}, ["chunk_size=48, local_window=4"]),
    ({"name": "rope_scaling", "rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 256,
      "short_factor": [1.0] * 32, "long_factor": [2.0] * 32, "attention_factor": 1.2},
     ["rope_type=longrope", "short_factor=[32 values]", "attention_factor=1.2"]),
])  # fmt: skip
def test_every_figure_names_the_extension_parameters(extension, said):
    """The figures' titles named the method alone (the label, "r/p + dca"): two evaluations of one method with other
    parameters (--out) drew figures titled alike. Its parameters are under the label, and fit the figure."""
    from minilm.eval.report import _heatmap_figure, _position_figure, _ppl_figure, _retrieval_figure

    res = _retrieval_results({"64": 1.0, "128": 0.5})
    res.update(label=f"r/p + {extension['name']}", extension=extension, ppl={"64": 30.0, "128": 40.0})
    for fig in (_heatmap_figure(res, "passkey"), _ppl_figure(res), _position_figure(res), _retrieval_figure(res)):
        fig.canvas.draw()
        title = fig.axes[0].title
        assert all(words in title.get_text() for words in said), title.get_text()
        box = title.get_window_extent()
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0 and box.y1 <= fig.bbox.y1, title.get_text()


def test_the_report_explains_the_columns_it_shows_and_the_settings_of_the_tasks_it_ran():
    """A perplexity-only report explained retrieval accuracy and said how many prompts per depth it had not run; one
    without sliding windows (--no-sliding), or of retrieval alone, explained a ppl_sliding column it did not have."""
    from minilm.eval.report import markdown

    base = {"lengths": [64], "depths": [0.0, 1.0], "samples": 3, "train_seq_len": 64}
    ppl_only = markdown({**base, "tasks": ["ppl"], "sliding": False, "ppl": {"64": 30.0}}, {})
    assert "ppl: non-overlapping windows" in ppl_only
    assert "ppl_sliding" not in ppl_only and "retrieval" not in ppl_only and "depths" not in ppl_only
    retrieval = markdown({**base, **_retrieval_results({"64": 0.5}, samples=3), "tasks": ["passkey"]}, {})
    assert "retrieval: exact-match accuracy" in retrieval and "3 samples per retrieval cell" in retrieval
    assert "ppl" not in retrieval.split("## Summary")[1]


class _SmallMemory(torch.nn.Module):
    """A model that runs out of (GPU) memory on more than ``most`` sequences per forward, else is ``model``."""

    def __init__(self, model, most: int, error=None):
        super().__init__()
        self.inner, self.most = model, most
        self.lm_head = model.lm_head
        self.error = error or torch.OutOfMemoryError("CUDA out of memory (simulated)")

    def _check(self, idx):
        if idx.shape[0] > self.most:
            raise self.error

    def hidden(self, idx, *args, **kw):
        self._check(idx)
        return self.inner.hidden(idx, *args, **kw)

    def forward(self, idx, *args, **kw):
        self._check(idx)
        return self.inner(idx, *args, **kw)


def test_out_of_memory_retries_with_smaller_chunks_and_measures_the_same(corpus_setup, eval_data):
    """Out of GPU memory at a length used to skip it ('lower eval.batch_tokens'); lowering batch_tokens also draws
    fewer perplexity windows, so the re-run measured other text than the runs it is compared with. The suite now
    retries with half as many sequences per forward: the same windows and prompts, the same numbers."""
    from minilm.eval import EvalSettings, evaluate

    from .conftest import tiny_gpt

    cfg, corpus = corpus_setup
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size)
    settings = EvalSettings(lengths=[64, 128], tasks=["ppl", "passkey"], batches=1, batch_tokens=512, samples=3,
                            depths=[0.0, 1.0], seed=0)  # 8 and 4 sequences per forward  # fmt: skip
    logs = []
    want = evaluate(model, eval_data, settings, log=lambda *_: None)
    got = evaluate(_SmallMemory(model, 2), eval_data, settings, log=logs.append)
    assert not any(got["skipped"].values()) and got["passkey"]["128"] is not None, got["skipped"]
    for key in ("ppl", "loss", "ppl_sliding", "passkey"):
        assert got[key] == pytest.approx(want[key], rel=1e-5), key
    assert got["passkey_grid"] == want["passkey_grid"]
    for L in ("64", "128"):  # the same prompts: the answers' log-probabilities too
        assert got["details"]["passkey"][L] == pytest.approx(want["details"]["passkey"][L], rel=1e-5)
    assert got["details"]["ppl"]["64"]["windows"]["windows"] == want["details"]["ppl"]["64"]["windows"]["windows"] == 8
    assert any("again with 2 sequence(s) per forward" in m for m in logs)
    # one sequence at a time still too much: skipped, saying so
    got = evaluate(_SmallMemory(model, 0), eval_data, replace_tasks(settings, ["ppl"]), log=lambda *_: None)
    assert got["skipped"]["ppl"]["64"] == "out of memory, even one sequence at a time"
    # the CPU allocator's failure (a RuntimeError) alike; any other RuntimeError is not taken for one
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: (simulated)")
    got = evaluate(_SmallMemory(model, 2, cpu), eval_data, replace_tasks(settings, ["ppl"]), log=lambda *_: None)
    assert got["ppl"] == pytest.approx(want["ppl"], rel=1e-5)
    with pytest.raises(RuntimeError, match="shapes"):
        evaluate(_SmallMemory(model, 2, RuntimeError("shapes cannot be multiplied")), eval_data,
                 replace_tasks(settings, ["ppl"]), log=lambda *_: None)  # fmt: skip


def replace_tasks(settings, tasks):
    from dataclasses import replace

    return replace(settings, tasks=tasks)


def test_a_run_whose_tokenizer_the_prepared_corpus_lacks_names_both_causes(fake_run, corpus_setup):
    """After an upgrade of minilm's data preparation (a new held-out split retrains the tokenizer) every earlier run
    was refused with 'were the source files changed since training?' alone, which sent the user looking for a
    change they had not made."""
    from minilm.errors import MinilmError
    from minilm.eval import eval_data

    cfg, _ = corpus_setup
    (fake_run / "tokenizer.model").write_bytes(b"the tokenizer of an older preparation")
    with pytest.raises(MinilmError) as err:
        eval_data(cfg, fake_run)
    assert "source files changed" in str(err.value) and "FORMAT_VERSION" in str(err.value)
    assert "data.tokenizer.model_file" in str(err.value)


def test_a_training_length_past_the_evaluated_lengths_does_not_stretch_a_reports_figures():
    """Trained at 4096, evaluated at 128..2048: the dashed training-length line stretched the length axis of the
    perplexity, retrieval and per-position figures to 4096. Drawn only within the lengths shown; the legend says so."""
    from minilm.eval.report import _position_figure, _ppl_figure, _retrieval_figure

    res = _retrieval_results({"128": 1.0, "2048": 0.5}, samples=1)
    res.update(train_seq_len=4096, ppl={"128": 30.0, "2048": 40.0},
               per_position_loss={"2048": {"positions": [0.0, 1024.0, 2047.0], "loss": [5.0, 4.0, 4.0]}})
    for fig in (_ppl_figure(res), _retrieval_figure(res), _position_figure(res)):
        ax = fig.axes[0]
        assert ax.get_xlim()[1] < 3000, ax.get_title()
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "train length 4096\n(past the lengths shown: no line)" in texts, texts
    res["train_seq_len"] = 1024  # within: drawn, as before
    ax = _ppl_figure(res).axes[0]
    assert 1024 in [line.get_xdata()[0] for line in ax.get_lines()]
    assert "train length 1024" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_perplexity_axes_are_labelled_with_plain_numbers(tmp_path, monkeypatch):
    """Perplexity within less than a decade (a trained model's 52..66) was labelled 5.2×10¹, 5.4×10¹, ... on the log
    axis of a report's figure and of compare.png; the labels are now the numbers themselves."""
    from minilm.eval import report

    res = {"lengths": [128, 512], "ppl": {"128": 52.0, "512": 66.0}, "train_seq_len": 128, "run": "r", "phase": "p"}
    drawn, plain_axis = [], report._ppl_axis
    monkeypatch.setattr(report, "_ppl_axis", lambda ax: drawn.append(ax) or plain_axis(ax))
    report._compare_figure([res], ["r"], ["ppl"], tmp_path / "compare.png")
    report._ppl_figure(res)
    assert len(drawn) == 2  # compare.png's panel and the report's figure
    for ax in drawn:
        ax.figure.canvas.draw()
        labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels() if t.get_text()]
        assert "60" in labels and not any("times" in t or "^" in t for t in labels), labels


def test_a_document_masked_run_s_packed_perplexity_is_measured_within_documents(corpus_setup, eval_data):
    """A run trained with data.document_mask scored the packed held-out stream without masks, meeting attention across
    documents it never saw in training; it is now scored as its packed rows were trained, and results.json and
    report.md say so. A run trained without masks measures what it did."""
    from dataclasses import replace

    from minilm.eval import EvalSettings, evaluate
    from minilm.eval.report import markdown

    from .conftest import tiny_gpt

    cfg, corpus = corpus_setup
    L = int(max(eval_data.val.doc_lengths)) + 8  # longer than any held-out document: the packed stream
    settings = EvalSettings(lengths=[L], tasks=["ppl"], batches=1, batch_tokens=2 * L, sliding=True)
    model = tiny_gpt(cfg, corpus.tokenizer.vocab_size, name="sinusoidal")  # (absolute: restarted positions tell)
    plain = evaluate(model, eval_data, settings, log=lambda *_: None)
    masked = evaluate(model, replace(eval_data, document_mask=True), settings, log=lambda *_: None)
    restarted = evaluate(model, replace(eval_data, document_mask=True, restart_positions=True), settings,
                         log=lambda *_: None)  # fmt: skip
    key = str(L)
    for mode in ("windows", "sliding"):
        assert "document_mask" not in plain["details"]["ppl"][key][mode]
        assert masked["details"]["ppl"][key][mode]["document_mask"] is True
        assert restarted["details"]["ppl"][key][mode]["restart_positions"] is True
    assert len({plain["ppl"][key], masked["ppl"][key], restarted["ppl"][key]}) == 3
    report = markdown(masked, {})
    assert f"Perplexity at {L}: no held-out document holds L + 1 tokens" in report
    assert "with attention masked within each document" in report and "cross document" not in report
    assert "positions restarting" in markdown(restarted, {})


def test_evaluate_run_reads_the_phase_s_document_mask(fake_run, tmp_path, corpus_setup):
    """scripts/evaluate.py on a run trained with data.document_mask: results.json says its packed perplexity was
    measured within documents."""
    cfg, corpus = corpus_setup
    from .conftest import configure_run

    configure_run(fake_run, **{"data.document_mask": True, "data.restart_positions": True})
    L = int(max(corpus.val.only(["tiny"]).doc_lengths)) + 8
    res, _ = evaluate_run(fake_run, out=tmp_path / "ev", **{**QUICK, "lengths": [L], "batch_tokens": L})
    assert res["details"]["ppl"][str(L)]["windows"]["document_mask"] is True
    assert res["details"]["ppl"][str(L)]["windows"]["restart_positions"] is True
