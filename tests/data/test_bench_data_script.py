"""scripts/bench_data.py: runs on a small corpus; bad input -> message and exit code 2 (it had no error handling)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from tests.conftest import load_script


@pytest.fixture
def script():
    return load_script("scripts/bench_data.py")


def _yaml(tmp_path, corpus_dir) -> str:
    path = tmp_path / "bench.yaml"
    path.write_text(f"""
data:
  num_proc: 1
  tokenizer: {{vocab_size: 270, sample_chars: 100000}}
  sources:
    embedded: null
    few: {{kind: files, paths: ["{corpus_dir}/*.txt"]}}
""")
    return str(path)


def test_a_corpus_too_small_for_the_sampler_lengths_is_reported_not_a_traceback(script, tmp_path, capsys):
    """A few short documents: tokenizing takes 0.00 s (a ZeroDivisionError before) and no batch of 16 x 256 fits
    (a DataError traceback before): the rates say n/a and the sampler lines say skipped."""
    (tmp_path / "few").mkdir()
    for i in range(6):
        (tmp_path / "few" / f"d{i}.txt").write_text(f"word{i} " * 40 + "\n")
    assert script.main(["--config", _yaml(tmp_path, tmp_path / "few"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "corpus: 6 docs" in out
    assert out.count("skipped, the corpus does not fit it (the corpus has") == 3


def _few_docs(tmp_path) -> str:
    (tmp_path / "few").mkdir()
    for i in range(6):
        (tmp_path / "few" / f"d{i}.txt").write_text(f"word{i} " * 40 + "\n")
    return _yaml(tmp_path, tmp_path / "few")


def test_the_measurements_are_written_with_date_machine_and_versions(script, tmp_path, capsys):
    """The script printed its numbers only (no torch version, no date, no file: docs/data.md's table was copied from
    the terminal by hand): they go to <out>/<date>-cpu-<run.name>-data[-<tag>].json and .md, as benchmark.py's do."""
    import json

    import sentencepiece
    import torch

    out = tmp_path / "out"
    assert script.main(["--config", _few_docs(tmp_path), "--out", str(out), "--tag", "v1.5"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 2 and files[0].endswith("-cpu-run-data-v1.5.json") and files[1].endswith("-data-v1.5.md")
    saved = json.loads((out / files[0]).read_text())
    assert saved["torch"] == torch.__version__ and saved["sentencepiece"] == sentencepiece.__version__
    assert files[0].startswith(saved["date"][:10]) and saved["date"].endswith("UTC") and saved["cpus_visible"] >= 1
    assert saved["docs"] == 6 and saved["overrides"] == [] and saved["tokens"] > 0
    assert [r["status"] for r in saved["sampler"]] == ["skipped"] * 3
    md = (out / files[1]).read_text()
    assert f"torch {torch.__version__}" in md and "| measurement (6 docs, " in md and saved["date"] in md
    assert f"wrote {out / files[0][:-5]}.json and .md" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--config", "no_such.yaml"], "config file not found"),
    (["data.no_such_key=1"], "data.no_such_key"),
    (["--num-proc", "0"], "data.num_proc: must be >= 1"),  # was silently ignored (0 is falsy)
])  # fmt: skip
def test_bad_input_exits_2_with_a_message(script, capsys, args, message):
    assert script.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("bad, message", [
    (["--out", "{afile}"], "error: --out {afile} is not writable"),
    (["--tag", "a/b"], "argument --tag: letters, digits, '.', '_' and '-'"),
])  # fmt: skip
def test_a_bad_out_or_tag_stops_before_anything_is_measured(script, tmp_path, capsys, bad, message):
    afile = tmp_path / "afile"
    afile.write_text("")
    argv = ["--config", _few_docs(tmp_path), *[b.format(afile=afile) for b in bad]]
    with pytest.raises(SystemExit) if "--tag" in bad else nullcontext() as stop:
        assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(afile=afile) in err and "Traceback" not in err and "corpus:" not in capsys.readouterr().out
    assert stop is None or stop.value.code == 2


def test_the_cpus_reported_are_those_the_process_may_run_on_as_nproc_counts(script, monkeypatch):
    """The report said "N CPUs visible (nproc)" with os.cpu_count(), the machine's count: under taskset, or in a SLURM
    job or a container given a few cores of a large machine, not the cores the measurement ran on."""
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert script.cpus_visible() == 1
