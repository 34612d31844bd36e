"""scripts/compare_runs.py: every line of the figure and row of the table names one run, told apart from the others."""

import json
from pathlib import Path

from conftest import load_script


def _evaluation(run_dir: Path, phase: str, ppl: float, name: str | None = None) -> Path:
    """A results.json as scripts/evaluate.py writes it for ``run_dir``'s ``phase`` (label: run.name/phase); without
    ``name`` as an older minilm wrote it (label: run dir name/phase, no "name")."""
    out = run_dir / phase / "eval"
    out.mkdir(parents=True)
    results = {"run": str(run_dir), "phase": phase, "label": f"{name or run_dir.name}/{phase}", "lengths": [64],
               "train_seq_len": 64, "position": {"name": "rope"}, "ppl": {"64": ppl}}  # fmt: skip
    if name:
        results["name"] = name
    (out / "results.json").write_text(json.dumps(results))
    return out


def test_runs_of_one_name_get_labels_that_tell_them_apart(tmp_path, capsys):
    """A study's runs are <variant>/seed<S>/: every one's own label is 'seed<S>/<phase>'. Compared across variants they
    were two lines named alike (the legend could not say which was which); the variant now names each."""
    study = tmp_path / "runs" / "studies" / "ext"
    a = _evaluation(study / "yarn" / "seed1", "extend", 50.0)
    b = _evaluation(study / "alibi" / "seed1", "extend", 40.0)
    c = _evaluation(tmp_path / "other", "extend", 60.0)  # a name of its own keeps its short label
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(a), str(b), str(c), "--out", str(tmp_path / "cmp")])) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| yarn/seed1/extend | 50.00 |" in table
    assert "| alibi/seed1/extend | 40.00 |" in table
    assert "| other/extend | 60.00 |" in table
    assert "seed1/extend |" not in table.replace("yarn/seed1/extend |", "").replace("alibi/seed1/extend |", "")


def test_given_labels_are_kept(tmp_path):
    study = tmp_path / "s"
    a, b = _evaluation(study / "x" / "seed1", "p", 5.0), _evaluation(study / "y" / "seed1", "p", 6.0)
    cmp = load_script("scripts/compare_runs.py")
    args = cmp.parser().parse_args([str(a), str(b), "--label", "first", "second", "--out", str(tmp_path / "cmp")])
    assert cmp.main(args) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| first | 5.00 |" in table and "| second | 6.00 |" in table


def test_an_evaluation_or_a_label_given_twice_exits_2_before_anything_is_written(tmp_path, capsys):
    """The same run twice (or a run and its phase directory), and --label a a, drew two lines and two rows of one
    name that a reader could not tell apart, without a word."""
    from minilm.cli import run_cli

    run = tmp_path / "run"
    a, b = _evaluation(run, "p", 5.0), _evaluation(tmp_path / "other", "p", 6.0)
    cmp = load_script("scripts/compare_runs.py")
    out = tmp_path / "cmp"
    for argv, said in (([a, a], f"{a}: the same evaluation ({a / 'results.json'}) given twice; give each run once"),
                       ([a, run / "p"], f"given twice, also as {a}; give each run once"),
                       ([a, b, "--label", "x", "x"], "--label: 'x' given twice (x x); each run needs its own label")):
        assert run_cli(cmp.main, cmp.parser(), [*map(str, argv), "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
    assert not out.exists()


def test_perplexities_of_tokenizers_of_other_sizes_are_named_in_a_warning():
    from minilm.eval.report import setting_differences

    runs = [{"vocab_size": v, "ppl": {"64": 5.0}, "seed": 1, "batches": 1, "batch_tokens": 64, "stride": None}
            for v in (4096, 8192)]  # fmt: skip
    [warning] = setting_differences(runs, ["a", "b"])
    assert warning.startswith("tokenizers of different vocabulary sizes: 4096 (a); 8192 (b)")
    assert setting_differences([runs[0], {**runs[1], "vocab_size": 4096}], ["a", "b"]) == []


def test_perplexities_of_other_tokenizers_of_one_size_or_other_held_out_documents_are_named_in_a_warning():
    """Only the vocabulary sizes were compared: two runs of tokenizers trained on other corpora (of one size), or of
    one tokenizer evaluated on other held-out documents, compared perplexities of other units or other text without a
    word. results.json records the digests of both (tokenizer_sha256, val_sha256)."""
    from minilm.eval.report import setting_differences

    base = {"vocab_size": 4096, "ppl": {"64": 5.0}, "seed": 1, "batches": 1, "batch_tokens": 64, "stride": None,
            "tokenizer_sha256": "a" * 64, "val_sha256": "c" * 64}  # fmt: skip
    [warning] = setting_differences([base, {**base, "tokenizer_sha256": "b" * 64}], ["x", "y"])
    assert warning.startswith("different tokenizers (of one vocabulary size): sha256 aaaaaaaaaaaa (x); sha256 "
                              "bbbbbbbbbbbb (y)")  # fmt: skip
    [warning] = setting_differences([base, {**base, "val_sha256": "d" * 64}], ["x", "y"])
    assert warning.startswith("evaluated on different held-out documents: sha256 cccccccccccc (x); sha256 dddd")
    assert setting_differences([base, dict(base)], ["x", "y"]) == []
    kv = {**base, "ppl": {}, "kv": {"64": 1.0}, "samples": 8, "depths": [0.5], "val_sha256": "d" * 64}
    assert setting_differences([base, kv], ["x", "y"]) == []  # (no perplexity in y: nothing to compare)


def test_labels_given_before_the_runs_say_where_the_runs_went(tmp_path, capsys):
    """--label takes every word after it: 'compare_runs.py --label a b RUN RUN' said only that runs were required."""
    from minilm.cli import run_cli

    cmp = load_script("scripts/compare_runs.py")
    assert run_cli(cmp.main, cmp.parser(), ["--label", "a", "b", "runs/x", "runs/y"]) == 2
    err = capsys.readouterr().err
    assert "--label took all of: a b runs/x runs/y" in err and "compare_runs.py RUN RUN ... --label A B" in err


def test_the_figure_says_which_run_each_training_length_line_belongs_to(tmp_path, monkeypatch):
    """Comparing a phase trained at 64 with one trained at 256 drew two unlabelled grey lines: a reader could not
    tell which length was whose, so not which points lie beyond a run's training length."""
    import matplotlib.pyplot as plt

    from minilm.eval import compare

    short, long = _evaluation(tmp_path / "a", "pre", 5.0), _evaluation(tmp_path / "b", "ext", 6.0)
    runs = [json.loads((d / "results.json").read_text()) for d in (short, long)]
    runs[1]["train_seq_len"] = 256
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figure to read its legend
    compare(runs, ["a/pre", "b/ext"], tmp_path / "cmp")
    legend = [t.get_text() for t in closed[0].axes[-1].get_legend().get_texts()]
    assert "trained at 64 (a/pre)" in legend  # (both were evaluated at 64 alone: 256 lies past it)
    assert "trained at 256 (b/ext)\n(past the lengths shown: no line)" in legend


def test_a_training_length_past_the_evaluated_lengths_does_not_stretch_the_axis_and_the_legend_says_so(
        tmp_path, monkeypatch):  # fmt: skip
    """Trained at 4096, evaluated at 128..2048: the training length's line stretched every panel's length axis to
    4096, crowding the curves into its left part. The axis spans the evaluated lengths; the line is drawn only where
    it falls within them, and the legend says where it is not."""
    import matplotlib.pyplot as plt

    from minilm.eval import compare

    lengths = [128, 512, 2048]
    run = {"run": "r", "phase": "p", "lengths": lengths, "train_seq_len": 4096, "position": {"name": "rope"},
           "ppl": {str(L): 5.0 + i for i, L in enumerate(lengths)}}  # fmt: skip
    inside = {**run, "run": "s", "train_seq_len": 512}
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    compare([run, inside], ["long", "short"], tmp_path / "cmp")
    fig = closed[0]
    assert fig.axes[0].get_xlim()[1] < 3000
    assert [line.get_xdata()[0] for line in fig.axes[0].get_lines() if line.get_color() == "grey"] == [512]
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert "trained at 4096 (long)\n(past the lengths shown: no line)" in legend and "trained at 512 (short)" in legend


def test_the_legend_of_compare_png_lies_outside_every_panel(tmp_path, monkeypatch):
    """The legend sat inside the first panel, over the curves it names."""
    import matplotlib.pyplot as plt

    from minilm.eval import compare

    runs = [json.loads((_evaluation(tmp_path / n, "p", 5.0) / "results.json").read_text()) for n in "abc"]
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    compare(runs, ["a/p", "b/p", "c/p"], tmp_path / "cmp")
    fig = closed[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1 and [t.get_text() for t in legends[0].get_texts()][:3] == ["a/p", "b/p", "c/p"]
    box = legends[0].get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_each_run_has_one_colour_in_every_panel_and_a_legend_entry(tmp_path, monkeypatch):
    """A panel took the colours of its own lines in turn: where the first run had no needle scores, the second run's
    needle line was drawn in the first run's colour, which the legend gave the first run; and a run without
    perplexity (retrieval alone) had no legend entry at all."""
    import matplotlib.pyplot as plt

    from minilm.eval import compare

    base = {"lengths": [64, 128], "train_seq_len": 64, "position": {"name": "rope"}}
    runs = [{**base, "run": "a", "ppl": {"64": 5.0, "128": 6.0}},
            {**base, "run": "b", "ppl": {"64": 5.5, "128": 6.5}, "needle": {"64": 0.5, "128": 0.25}},
            {**base, "run": "c", "needle": {"64": 1.0, "128": 0.75}}]  # fmt: skip
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    compare(runs, ["a/p", "b/p", "c/p"], tmp_path / "cmp")
    fig = closed[0]
    legend = fig.axes[-1].get_legend()
    named = {t.get_text(): (h.get_color(), h.get_marker()) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert {"a/p", "b/p", "c/p"} <= set(named)
    assert len({named[label] for label in ("a/p", "b/p", "c/p")}) == 3
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() in named:
                assert (line.get_color(), line.get_marker()) == named[line.get_label()], (ax.get_title(), line)


def test_evaluations_made_with_different_settings_are_named_in_a_warning(tmp_path, capsys):
    """results.json did not record batches / batch_tokens (nor run.seed, stride, needles): two runs evaluated with
    --batches 4 and --batches 1 were overlaid as if measured alike. Each differing setting is now named with its
    values and the runs of each, on stderr and atop compare.md; settings that change no metric shown are not."""
    a, b = _evaluation(tmp_path / "a", "pre", 5.0), _evaluation(tmp_path / "b", "pre", 6.0)
    for folder, batches, needles in ((a, 4, 4), (b, 1, 2)):
        results = json.loads((folder / "results.json").read_text())
        results.update(seed=1, batches=batches, batch_tokens=8192, stride=None, needles=needles)  # no needle scores
        (folder / "results.json").write_text(json.dumps(results))
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(a), str(b), "--out", str(tmp_path / "cmp")])) == 0
    err = capsys.readouterr().err
    assert "warning: evaluated with different batches: 4 (a/pre); 1 (b/pre)." in err and "--batches" in err
    assert err.count("warning:") == 1  # batch_tokens, stride, seed alike; needles differ, but no needle scores
    assert "evaluated with different batches: 4 (a/pre); 1 (b/pre)" in (tmp_path / "cmp" / "compare.md").read_text()


def test_an_evaluation_from_before_the_settings_were_recorded_still_compares_and_says_so(tmp_path, capsys):
    old, new = _evaluation(tmp_path / "old", "pre", 5.0), _evaluation(tmp_path / "new", "pre", 6.0)
    results = json.loads((new / "results.json").read_text())
    results.update(seed=1, batches=4, batch_tokens=8192, stride=None)
    (new / "results.json").write_text(json.dumps(results))
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(old), str(new), "--out", str(tmp_path / "cmp")])) == 0
    out, err = capsys.readouterr()
    assert "| old/pre | 5.00 |" in out and "| new/pre | 6.00 |" in out
    assert err == ("warning: old/pre: its results.json does not record seed, batches, batch_tokens (written by an "
                   "older minilm), so whether the others were evaluated alike cannot be checked; evaluate it again\n")


def _finished(run_dir: Path, phase: str) -> None:
    """Mark ``phase`` of ``run_dir`` finished, as training leaves it (its weights and complete.json)."""
    (run_dir / phase).mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "complete.json"):
        (run_dir / phase / name).write_text("{}")


def _study(tmp_path) -> Path:
    """A study's folder with seeds: its study.json lists the runs; yarn/seed2 has no evaluation yet."""
    from minilm.config import load_config, save_config

    study = tmp_path / "ext"
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "rope_yarn_tiny.yaml")
    for label in ("yarn/seed1", "yarn/seed2", "alibi/seed2"):
        save_config(cfg, study / label / "config.yaml")
    for label, ppl in (("yarn/seed1", 50.0), ("alibi/seed2", 40.0)):
        _evaluation(study / label, "extend_2k", ppl)
        _finished(study / label, "extend_2k")
    runs = {"yarn": ["yarn/seed1", "yarn/seed2"], "alibi": ["alibi/seed2"]}
    variants = [{"variant": v, "runs": {label: {} for label in labels}} for v, labels in runs.items()]
    (study / "study.json").write_text(json.dumps({"variants": variants}))
    return study


def test_a_run_of_a_study_is_labelled_by_its_variant_even_alone(tmp_path):
    """A study run compared with runs of other names kept its folder's name alone, 'seed2/extend': which variant it
    was could not be read from the legend. Its study names it."""
    study = _study(tmp_path)
    c = _evaluation(tmp_path / "other", "extend", 60.0)
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(study / "alibi" / "seed2"), str(c), "--out", str(tmp_path)])) == 0
    table = (tmp_path / "compare.md").read_text()
    assert "| alibi/seed2/extend_2k | 40.00 |" in table and "| other/extend | 60.00 |" in table


def test_runs_labelled_by_their_run_name_keep_the_study_label_and_tell_alike_names_apart(tmp_path):
    """An evaluation is labelled by run.name (a study's run: 'yarn-seed1/extend_2k'): compared, a study's run is still
    named as in its study, and two runs of one run.name in other folders by their folders."""
    study = tmp_path / "study"
    run = _evaluation(study / "yarn" / "seed1", "extend_2k", 50.0, name="yarn-seed1")
    variants = [{"variant": "yarn", "runs": {"yarn/seed1": {}}}]
    (study / "study.json").write_text(json.dumps({"variants": variants}))
    a = _evaluation(tmp_path / "a", "train", 60.0, name="tiny")
    b = _evaluation(tmp_path / "b", "train", 70.0, name="tiny")
    cmp = load_script("scripts/compare_runs.py")
    args = [str(run), str(a), str(b), "--out", str(tmp_path / "cmp")]
    assert cmp.main(cmp.parser().parse_args(args)) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| yarn/seed1/extend_2k | 50.00 |" in table
    assert "| a/train | 60.00 |" in table and "| b/train | 70.00 |" in table


def test_a_studys_folder_compares_its_evaluated_runs(tmp_path, capsys):
    study = _study(tmp_path)
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(study), "--out", str(tmp_path / "cmp")])) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| yarn/seed1/extend_2k | 50.00 |" in table and "| alibi/seed2/extend_2k | 40.00 |" in table
    assert "yarn/seed2 has no evaluation yet; left out" in capsys.readouterr().err


def test_a_studys_folder_leaves_out_a_run_without_an_evaluation_of_its_last_evaluating_phase(tmp_path, capsys):
    """A run stopped during its last phase (or whose end-of-phase evaluation failed) stood, in compare_runs.py STUDY,
    for its earlier phase's evaluation beside the other variants' last ones, though the study's own compare.md leaves
    such a run out."""
    study = _study(tmp_path)
    _evaluation(study / "yarn" / "seed2", "extend_512", 70.0)  # finished and evaluated; extend_2k interrupted
    _finished(study / "yarn" / "seed2", "extend_512")
    (study / "yarn" / "seed2" / "extend_2k" / "checkpoints").mkdir(parents=True)
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(study), "--out", str(tmp_path / "cmp")])) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| yarn/seed1/extend_2k | 50.00 |" in table and "| alibi/seed2/extend_2k | 40.00 |" in table
    assert "extend_512" not in table and "70.00" not in table
    assert "its run yarn/seed2 has not finished phase 'extend_2k' yet; left out" in capsys.readouterr().err
    _finished(study / "yarn" / "seed2", "extend_2k")  # finished, but its evaluation failed
    (study / "yarn" / "seed2" / "extend_2k" / "eval").mkdir()
    (study / "yarn" / "seed2" / "extend_2k" / "eval" / "error.txt").write_text("boom\n")
    assert cmp.main(cmp.parser().parse_args([str(study), "--out", str(tmp_path / "cmp")])) == 0
    assert "70.00" not in (tmp_path / "cmp" / "compare.md").read_text()
    assert (f"its run yarn/seed2 has no evaluation of phase 'extend_2k' (scripts/evaluate.py --run "
            f"{study / 'yarn' / 'seed2'} --phase extend_2k); left out") in capsys.readouterr().err


def test_evaluate_py_on_a_studys_folder_says_what_to_give_instead(tmp_path):
    import pytest

    from minilm.errors import MinilmError
    from minilm.runs import resolve_run

    study = _study(tmp_path)
    with pytest.raises(MinilmError, match=rf"{study} is a study's folder \(study.json\), not a run: give one of its "
                                          rf"runs \(yarn/seed1, yarn/seed2, alibi/seed2\), e.g. {study}/yarn/seed1; "
                                          rf"scripts/compare_runs.py {study} compares them all"):
        resolve_run(study)
    with pytest.raises(MinilmError, match=rf"{study}/yarn is a folder of runs \(seed1, seed2\), not a run"):
        resolve_run(study / "yarn")


def test_a_run_whose_last_phase_has_no_evaluation_says_which_phase_it_stands_for(tmp_path, capsys):
    """A run directory whose last phase was not evaluated (or whose end-of-phase evaluation failed, eval/error.txt)
    stood silently for an earlier phase's evaluation, beside other runs' last phases trained at other lengths."""
    from minilm.config import load_config, save_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "rope_yarn_tiny.yaml")
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        save_config(cfg, run / "config.yaml")
        _evaluation(run, "extend_512", 50.0)
    _evaluation(a, "extend_2k", 40.0)
    (b / "extend_2k" / "eval").mkdir(parents=True)
    (b / "extend_2k" / "eval" / "error.txt").write_text("boom\n")
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(a), str(b), "--out", str(tmp_path / "cmp")])) == 0
    err = capsys.readouterr().err
    assert f"note: {b}: its last phase 'extend_2k' is not compared: its evaluation failed" in err
    assert "compared instead: phase 'extend_512'" in err and f"note: {a}" not in err


def test_a_run_whose_last_phase_has_not_finished_is_told_to_finish_it_not_to_evaluate_it(tmp_path, capsys):
    """A run stopped during its last phase stood for an earlier phase's evaluation, and the note advised
    'scripts/evaluate.py --run RUN evaluates <last phase>', which evaluates the newest finished phase again."""
    from minilm.config import load_config, save_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "rope_yarn_tiny.yaml")
    run = tmp_path / "run"
    save_config(cfg, run / "config.yaml")
    _evaluation(run, "extend_512", 50.0)
    for name in ("complete.json", "model.safetensors"):
        (run / "extend_512" / name).write_text("{}")
    (run / "extend_2k" / "checkpoints").mkdir(parents=True)  # interrupted: a checkpoint, no complete.json
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(run), "--out", str(tmp_path / "cmp")])) == 0
    err = capsys.readouterr().err
    assert f"note: {run}: its last phase 'extend_2k' is not compared: it has not finished training" in err
    assert "compared instead: phase 'extend_512'" in err and f"run.dir={run} --resume" in err
    assert "evaluate.py" not in err


def test_evaluate_py_on_a_studys_folder_names_only_runs_that_exist(tmp_path):
    """study.json lists every variant's runs, also those a study run with --only has not trained: the message
    offered them (ntk/seed1, ...) as runs to give, and each was 'no such run directory'."""
    import shutil

    import pytest

    from minilm.errors import MinilmError
    from minilm.runs import resolve_run

    study = _study(tmp_path)
    summary = json.loads((study / "study.json").read_text())
    summary["variants"].insert(0, {"variant": "ntk", "runs": {"ntk/seed1": {}, "ntk/seed2": {}}})
    (study / "study.json").write_text(json.dumps(summary))
    with pytest.raises(MinilmError, match=rf"give one of its runs \(yarn/seed1, yarn/seed2, alibi/seed2\), e.g. "
                                          rf"{study}/yarn/seed1;"):
        resolve_run(study)
    for label in ("yarn/seed1", "yarn/seed2", "alibi/seed2"):  # none begun (a summary left by a study that failed)
        shutil.rmtree(study / label)
    with pytest.raises(MinilmError, match=rf"{study} is a study's folder \(study.json\) whose runs have not begun: run "
                                          rf"or --resume the study first"):
        resolve_run(study)


def test_a_phase_directory_stands_for_its_own_evaluation_without_a_note(tmp_path, capsys):
    """A phase directory holds a config.yaml (its phase's): compare_runs.py took it for a run whose last phase is
    'train', and said 'its last phase 'train' is not compared: it has no evaluation' of every phase directory given."""
    from minilm.config import load_config, phase_config, save_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "rope_yarn_tiny.yaml")
    run = tmp_path / "run"
    save_config(cfg, run / "config.yaml")
    for phase in ("pretrain", "extend_512"):
        _evaluation(run, phase, 50.0)
        save_config(phase_config(cfg, phase), run / phase / "config.yaml")
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(run / "pretrain"), str(run), "--out", str(tmp_path / "c")])) == 0
    err = capsys.readouterr().err
    assert f"note: {run / 'pretrain'}" not in err and "'train'" not in err
    assert f"note: {run}: its last phase 'extend_2k' is not compared" in err  # (the run itself: its extend_512)


def test_a_label_with_a_pipe_keeps_the_table_rows_intact(tmp_path):
    """compare.md's rows split on '|': --label 'rope | 128' (or a run.name with one) gave the row a column too many,
    its numbers shifted under the wrong lengths."""
    run = tmp_path / "r"
    _evaluation(run, "train", 10.0, name="r")
    cmp = load_script("scripts/compare_runs.py")
    argv = [str(run / "train"), "--label", "rope | 128", "--out", str(tmp_path / "c")]
    assert cmp.main(cmp.parser().parse_args(argv)) == 0
    rows = [line for line in (tmp_path / "c" / "compare.md").read_text().splitlines() if line.startswith("| rope")]
    assert rows == ["| rope \\| 128 | 10.00 |"]


def test_an_out_with_an_unexpanded_tilde_is_refused(tmp_path, monkeypatch, capsys):
    """compare_runs.py ... --out=~/cmp (after '=' no shell expands it) wrote into a folder called '~' in the working
    directory and said 'table: ~/cmp/compare.md', as if in the home directory."""
    from minilm.cli import run_cli

    monkeypatch.chdir(tmp_path)
    _evaluation(tmp_path / "r", "train", 10.0, name="r")
    cmp = load_script("scripts/compare_runs.py")
    assert run_cli(cmp.main, cmp.parser(), [str(tmp_path / "r" / "train"), "--out=~/cmp"]) == 2
    assert "error: --out '~/cmp': '~' is not expanded" in capsys.readouterr().err
    assert not (tmp_path / "~").exists()


def test_a_run_given_with_its_studys_folder_is_named_with_the_folder_it_came_from(tmp_path, capsys):
    """compare_runs.py STUDY STUDY/alibi/seed2 said 'STUDY/alibi/seed2: the same evaluation (...) given twice': the
    user had typed it once, and the message did not say that the study's folder stood for it too."""
    from minilm.cli import run_cli

    study = _study(tmp_path)
    run = study / "alibi" / "seed2"
    cmp = load_script("scripts/compare_runs.py")
    assert run_cli(cmp.main, cmp.parser(), [str(study), str(run), "--out", str(tmp_path / "cmp")]) == 2
    assert f"given twice, also as {run} (of study {study}); give each run once" in capsys.readouterr().err


def test_many_long_labels_do_not_narrow_the_panels_and_the_legend_is_in_the_image(tmp_path, monkeypatch):
    """tight_layout fitted the legend (outside the panels, right of the last) into the figure's width: with a study's
    folder of runs at two training lengths every panel became a sliver, its length ticks written over each other."""
    import matplotlib.image
    import matplotlib.pyplot as plt

    from minilm.eval import compare

    runs = [{"run": f"r{i}", "phase": "p", "lengths": [128, 512], "train_seq_len": (128, 512)[i % 2],
             "position": {"name": "rope"}, "ppl": {"128": 50.0 + i, "512": 60.0 + i},
             "ppl_sliding": {"128": 40.0 + i, "512": 45.0 + i}, "passkey": {"128": 0.5, "512": 0.0}}
            for i in range(8)]  # fmt: skip
    labels = [f"a_long_variant_name_{i}/seed{i}/extend_2k" for i in range(8)]
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    fig_path, _ = compare(runs, labels, tmp_path / "cmp")
    fig = closed[0]
    assert all(ax.get_position().width > 0.15 for ax in fig.axes)  # (three panels in the figure: ~0.28 each)
    width, panels = matplotlib.image.imread(fig_path).shape[1], fig.get_figwidth() * 110
    assert width > panels * 1.15  # the legend, right of the panels, widens the saved image


def test_the_legend_entry_naming_the_runs_trained_at_a_length_is_wrapped(tmp_path):
    """compare_runs.py STUDY OTHER_RUN: 'trained at 2048 (...)' named a study's 30 runs on one line, which made the
    legend, and the saved image, thousands of pixels wide."""
    import matplotlib.image

    from minilm.eval import compare

    runs = [{"run": f"r{i}", "phase": "p", "lengths": [128, 2048], "train_seq_len": 2048 if i else 128,
             "position": {"name": "rope"}, "ppl": {"128": 50.0 + i, "2048": 60.0 + i}} for i in range(30)]  # fmt: skip
    labels = [f"variant_{i}/seed{1337 + i % 3}/extend_2k" for i in range(30)]
    fig_path, _ = compare(runs, labels, tmp_path / "cmp")
    assert matplotlib.image.imread(fig_path).shape[1] < 4.5 * 110 + 700  # one panel, and a legend of ~60 characters


def test_an_out_that_is_a_studys_folder_is_refused_before_its_compare_png_is_replaced(tmp_path, capsys):
    """compare_runs.py STUDY --out STUDY replaced the study's own compare.png and compare.md (each variant's mean, shown
    in its study.md) with one line per run, without a word."""
    from minilm.cli import run_cli

    study = _study(tmp_path)
    (study / "compare.md").write_text("the study's own\n")
    cmp = load_script("scripts/compare_runs.py")
    assert run_cli(cmp.main, cmp.parser(), [str(study), "--out", str(study)]) == 2
    assert f"--out {study}: a study's folder (study.json)" in capsys.readouterr().err
    assert (study / "compare.md").read_text() == "the study's own\n" and not (study / "compare.png").exists()


def test_a_moved_studys_runs_keep_their_labels_and_are_listed_where_they_are(tmp_path):
    """A study copied from the machine that trained it: each results.json records the run's old path, so compare.md
    listed paths that were gone and the runs, not found in their study, lost their labels ('yarn-seed1/extend_2k')."""
    study = _study(tmp_path)
    for label in ("yarn/seed1", "alibi/seed2"):
        (study / label / "tokenizer.model").write_text("")
        path = study / label / "extend_2k" / "eval" / "results.json"
        results = json.loads(path.read_text())
        name = label.replace("/", "-")  # (run.name of a study's run: yarn-seed1)
        results.update(run=f"/gone/ext/{label}", name=name, label=f"{name}/extend_2k")
        path.write_text(json.dumps(results))
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args([str(study), "--out", str(tmp_path / "cmp")])) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| yarn/seed1/extend_2k | 50.00 |" in table and "| alibi/seed2/extend_2k | 40.00 |" in table
    assert f"`{study / 'yarn' / 'seed1'}` phase" in table and "/gone/" not in table



def test_every_run_compare_md_lists_is_an_absolute_path(tmp_path, monkeypatch):
    """A results.json of an older minilm records its run as typed (``runs/a``), and a moved run's was replaced by
    the run directory as compare_runs.py's argument gave it (``b``): compare.md listed relative paths beside the
    absolute ones a results.json records now, which, read from elsewhere, named no run."""
    runs = tmp_path.resolve() / "runs"
    for name in ("a", "b"):
        _evaluation(runs / name, "p", 5.0, name=name)
        (runs / name / "config.yaml").write_text("")
        (runs / name / "tokenizer.model").write_text("")
    for name, recorded in (("a", "runs/a"), ("b", "/gone/b")):
        path = runs / name / "p" / "eval" / "results.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "run": recorded}))
    monkeypatch.chdir(runs)
    cmp = load_script("scripts/compare_runs.py")
    assert cmp.main(cmp.parser().parse_args(["a/p/eval", "b/p/eval", "--out", str(tmp_path / "cmp")])) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert f"- **a/p**: `{runs / 'a'}` phase" in table and f"- **b/p**: `{runs / 'b'}` phase" in table
