"""scripts/bench_data.py: runs on a small corpus; bad input -> message and exit code 2 (it had no error handling)."""

from __future__ import annotations

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
    assert script.main(["--config", _yaml(tmp_path, tmp_path / "few")]) == 0
    out = capsys.readouterr().out
    assert "corpus: 6 docs" in out
    assert out.count("skipped, the corpus does not fit it (the corpus has") == 3


@pytest.mark.parametrize("args, message", [
    (["--config", "no_such.yaml"], "config file not found"),
    (["data.no_such_key=1"], "data.no_such_key"),
    (["--num-proc", "0"], "data.num_proc: must be >= 1"),  # was silently ignored (0 is falsy)
])  # fmt: skip
def test_bad_input_exits_2_with_a_message(script, capsys, args, message):
    assert script.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_cpus_reported_are_those_the_process_may_run_on_as_nproc_counts(script, monkeypatch):
    """The report said "N CPUs visible (nproc)" with os.cpu_count(), the machine's count: under taskset, or in a SLURM
    job or a container given a few cores of a large machine, not the cores the measurement ran on."""
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert script.cpus_visible() == 1
