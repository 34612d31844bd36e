"""A study killed with SIGKILL part-way through a variant and continued with --resume ends as the uninterrupted
study: the same weights bitwise, the same evaluations and summary, nothing half-written left beside them."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from minilm.cli import run_cli
from tests.conftest import local_data_yaml, load_script
from tests.test_study import BASE, STUDY

REPO = Path(__file__).resolve().parents[1]
LONGER = ["phases.long.steps=30"]  # pi's second phase runs long enough after its first checkpoint to be killed in


def _study(argv) -> int:
    mod = load_script("scripts/study.py")
    return run_cli(mod.main, mod.parser(), [str(a) for a in argv])


def _without(text: str, out: Path) -> str:
    return text.replace(str(out), "<out>")


@pytest.mark.slow
def test_a_study_killed_mid_variant_and_resumed_equals_the_uninterrupted_one(tmp_path, tiny_text_dir):
    (tmp_path / "base.yaml").write_text(BASE.format(data=local_data_yaml(tiny_text_dir, tmp_path / "cache")))
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _study([study, "--out", straight, *LONGER]) == 0

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "study.py"), str(study), "--out", str(killed),
                             *LONGER], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    t0 = time.time()
    while not list((killed / "pi" / "long" / "checkpoints").glob("step-*.ckpt")):  # pi: after its copied phase
        assert proc.poll() is None, "the study ended before pi's second phase wrote a checkpoint"
        assert time.time() - t0 < 300, "pi's second phase never wrote a checkpoint"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "pi" / "long" / "complete.json").exists(), "killed too late: the phase had finished"

    assert _study([study, "--out", killed, *LONGER]) == 2  # refused: it says --resume
    assert _study([study, "--out", killed, "--resume", *LONGER]) == 0
    for variant in ("yarn", "pi", "alibi"):
        for weights in sorted((straight / variant).rglob("model.safetensors")):
            a, b = load_file(weights), load_file(killed / weights.relative_to(straight))
            assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), weights.relative_to(straight)
        for results in sorted((straight / variant).rglob("eval/results.json")):
            twin = killed / results.relative_to(straight)
            assert _without(twin.read_text(), killed) == _without(results.read_text(), straight)
    a, b = (json.loads(_without((out / "study.json").read_text(), out)) for out in (straight, killed))
    assert a["variants"] == b["variants"]  # every variant counted once, with the same numbers
    left = [p for p in killed.rglob("*") if p.name.endswith((".tmp", ".copying", ".lock"))]
    assert left == []
