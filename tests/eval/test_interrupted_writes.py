"""A killed evaluation, evaluated again: nothing it left half-written stays beside the new outputs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minilm.eval import write_report
from minilm.eval.report import compare

RESULTS = {"lengths": [64, 128], "depths": [0.5], "tasks": ["ppl", "passkey"], "ppl": {"64": 9.0, "128": 10.0},
           "passkey": {"64": 0.5, "128": 0.0}, "passkey_grid": {"64": {"0.5": 0.5}, "128": {"0.5": 0.0}}}  # fmt: skip


@pytest.fixture
def pids():
    """(the pid of a process that no longer exists — the killed evaluation —, the pid of a live one)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield dead.pid, live.pid
    live.kill()
    live.wait()


@pytest.mark.parametrize("write, left", [
    (lambda out: write_report(RESULTS, out), ["passkey_heatmap.png", "results.json", "report.md"]),
    (lambda out: compare([RESULTS], ["a"], out), ["compare.png", "compare.md"]),
], ids=["write_report", "compare"])  # fmt: skip
def test_writing_again_removes_what_a_killed_write_left_and_nothing_else(tmp_path, pids, write, left):
    """A SIGKILL while scripts/evaluate.py --out DIR saved a figure left DIR/.passkey_heatmap.png.<pid>.tmp, and the
    rerun that wrote the evaluation whole left it there for good (a run's --resume removes those in its phases'
    eval/, but --out is any folder and compare_runs.py's output no run at all). Another process's write in progress
    and files that are not the evaluation's are kept."""
    dead, live = pids
    stale = [tmp_path / f".{name}.{dead}.tmp" for name in left]
    kept = [tmp_path / f".results.json.{live}.tmp", tmp_path / f".notes.txt.{dead}.tmp"]
    for path in stale + kept:
        path.write_bytes(b"half")
    write(tmp_path)
    assert [p.name for p in stale if p.exists()] == [] and all(p.exists() for p in kept)
