"""The Makefile's set-up does what its comment says: keep an installed torch, else install the CPU build of
TORCH_VERSION where one is offered, else the plain version. Run with a stand-in python that records each call."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

STUB = """#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  "-c import torch") exit {has_torch} ;;
  *"+cpu"*) exit {cpu_missing} ;;
esac
exit 0
"""


@pytest.fixture(autouse=True)
def _dirs(tmp_path):
    for name in "abc":
        (tmp_path / name).mkdir()


def _torch_installs(tmp_path: Path, has_torch: bool, cpu_offered: bool) -> list[str]:
    log = tmp_path / "calls.log"
    stub = tmp_path / "python"
    stub.write_text(STUB.format(log=log, has_torch=0 if has_torch else 1, cpu_missing=0 if cpu_offered else 1))
    stub.chmod(0o755)
    subprocess.run(["make", "-s", "setup", f"PYTHON={stub}", "TORCH_VERSION=9.9.9"], cwd=REPO, check=True,
                   capture_output=True, text=True)
    return [line for line in log.read_text().splitlines() if "torch==" in line]


def test_setup_installs_the_cpu_build_where_one_is_offered_else_the_plain_version(tmp_path):
    """The comment said "the CPU build where one is offered" over a plain `pip install torch==X`, which takes the
    default (CUDA) build on Linux wherever the CPU one is offered too."""
    assert _torch_installs(tmp_path / "a", has_torch=False, cpu_offered=True) == ["-m pip install torch==9.9.9+cpu"]
    assert _torch_installs(tmp_path / "b", has_torch=False, cpu_offered=False) == [
        "-m pip install torch==9.9.9+cpu", "-m pip install torch==9.9.9"]
    assert _torch_installs(tmp_path / "c", has_torch=True, cpu_offered=True) == []  # an installed torch is kept
