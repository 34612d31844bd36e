"""scripts/gpu_session.sh, the runner of the GPU measurements: its `check` part runs on CPU as well (one short
step of a config), so the plumbing a GPU session depends on — wheels, PYTHONPATH, the log and the tarball left
in $OUT for the device tool to bring back — is exercised on every test run."""

import os
import subprocess
import sys
import tarfile

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_session.sh"


def _run(parts, tmp_path, **env):
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "no-wheels"), "TMPDIR": str(tmp_path),
           **env}  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT), *parts.split()], env=env, capture_output=True, text=True, timeout=300)


def test_check_part_leaves_its_log_and_results_in_out(tmp_path):
    out = tmp_path / "out"
    proc = _run("check", tmp_path, OUT=str(out), GPU_CONFIG="configs/tiny.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu-results.tgz", "gpu-session.log"]
    log = (out / "gpu-session.log").read_text()
    assert "=== gpu_session check (" in log and "tok/s" in log and "gpu_session check: exit 0" in log
    assert f"· torch {torch.__version__}" in log and "· lightning " in log  # the versions, from the benchmark
    with tarfile.open(out / "gpu-results.tgz") as tar:
        names = tar.getnames()
    assert "docs/performance.md" in names and "benchmarks/results" in names
    assert list((tmp_path / "minilm-check").glob("*.json")), "the check's results go to TMPDIR, not the repo"


@pytest.mark.slow  # two parts: ~25 s
def test_parts_leave_one_log_and_one_tarball_in_out(tmp_path):
    """However many parts run, $OUT holds two files — the device tool brings back at most 8, and a log and a
    tarball per part lost files from the fifth part on: the log of every part, and the tarball of the results so
    far (rewritten whole after each part)."""
    out = tmp_path / "out"
    proc = _run("check check", tmp_path, OUT=str(out), GPU_CONFIG="configs/tiny.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu-results.tgz", "gpu-session.log"]
    log = (out / "gpu-session.log").read_text()
    assert log.count("=== gpu_session check (") == 2 and log.count("tok/s") == 2
    assert log.count("gpu_session check: exit 0; results in") == 2


def test_unknown_part_is_refused_with_usage_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    proc = _run("check everything", tmp_path, OUT=str(out))
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "long-ckpt" in proc.stderr and "'everything'" in proc.stderr
    assert not out.exists()
    assert _run("", tmp_path).returncode == 2


def test_parts_past_the_time_budget_are_skipped_and_say_so(tmp_path):
    """A part that would start with under a minute of BUDGET left is skipped (exit 124), not started and killed."""
    proc = _run("check tests", tmp_path, BUDGET="30", OUT=str(tmp_path / "out"))
    assert proc.returncode == 124
    assert "gpu_session check: skipped" in proc.stderr and "gpu_session tests: skipped" in proc.stderr
    assert not (tmp_path / "out").exists()
    bad = _run("check", tmp_path, BUDGET="ten minutes")
    assert bad.returncode == 2 and "BUDGET must be a whole number of seconds" in bad.stderr


def test_parts_can_be_narrowed_to_what_is_left_to_measure(tmp_path):
    """ENCODINGS, LONG_LENGTHS and PYTEST_ARGS narrow the parts to what a session still needs (on the H100, FIRE
    alone after a fix): the commands, printed by DRY_RUN, carry them; by default every encoding and length."""
    env = {"DRY_RUN": "1", "ENCODINGS": "rope,fire", "LONG_LENGTHS": "131072", "PYTEST_ARGS": "-k fire -x"}
    proc = _run("enc-8k long attn tests", tmp_path, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("would run: ")]
    assert len(lines) == 4, proc.stdout
    enc, long, attn, tests = lines
    assert "scripts/benchmark.py" in enc and "--lengths 8192 --encodings rope,fire" in enc
    assert "--lengths 131072 --batch-size 1" in long
    assert "scripts/bench_attention.py" in attn and "--encodings rope,fire" in attn
    assert tests.endswith("-m pytest -m gpu -q --log-level=WARNING -k fire -x")
    # a -k expression with spaces stays one argument (PYTEST_ARGS would split it at the spaces)
    tests = _run("tests", tmp_path, DRY_RUN="1", PYTEST_K="fire or copies", PYTEST_ARGS="-x").stdout
    assert tests.strip().endswith("--log-level=WARNING -k 'fire or copies' -x"), tests
    copies, profile = (_run(part, tmp_path, DRY_RUN="1", COPIES="16").stdout for part in ("attn-copies", "profile"))
    assert "--encodings rope,t5,kerple,fire --flex-table-copies 16 --tag copies16" in copies
    assert [line.count("--profile") for line in profile.splitlines()] == [1, 1], profile
    assert "--lengths 8192 --encodings rope,alibi,t5" in profile and "--update-docs" not in profile
    assert "train.compile_mode=max-autotune-no-cudagraphs" in _run("autotune", tmp_path, DRY_RUN="1").stdout
    tuned = _run("autotune-8k", tmp_path, DRY_RUN="1").stdout
    assert "--lengths 8192 --encodings rope,alibi " in tuned
    assert "train.compile_mode=max-autotune-no-cudagraphs" in tuned
    assert "--encodings rope,t5 --flex-split --tag split" in _run("attn-split", tmp_path, DRY_RUN="1").stdout
    forwards = _run("attn-forwards", tmp_path, DRY_RUN="1").stdout
    assert "--encodings rope,kerple --kerple-forwards --tag forwards" in forwards
    batch = _run("batch", tmp_path, DRY_RUN="1", BATCH_SIZES="8,48").stdout.splitlines()
    assert [line.split("--batch-size ")[1].split()[0] for line in batch] == ["8", "48"], batch
    bad = _run("attn-copies", tmp_path, DRY_RUN="1", COPIES="0")
    assert bad.returncode == 2 and "COPIES must be a whole number >= 1, got '0'" in bad.stderr
    default = _run("enc-1k long", tmp_path, DRY_RUN="1").stdout
    assert "--encodings rope,alibi,t5,kerple,fire" in default and "--lengths 16384,32768,65536,131072" in default


def test_the_sdpa_part_measures_each_kernel_and_a_bad_one_is_refused_before_any_install(tmp_path):
    """sdpa: the attention core at 1K and 8K, then the step at 1K, with each of SDPA_KERNELS first. A bad setting
    is refused (exit 2) before the wheels are installed: a broken wheel here would fail the install (exit 1)."""
    lines = _run("sdpa", tmp_path, DRY_RUN="1").stdout.splitlines()
    assert len(lines) == 4, lines
    assert ["bench_attention.py" in line for line in lines] == [True, True, False, False]
    assert [line.split("model.sdpa_kernel=")[1] for line in lines] == ["flash", "cudnn", "flash", "cudnn"]
    assert all("--lengths 1024,8192 --encodings rope" in line for line in lines[:2])
    assert all("--lengths 1024 " in line and "--tag sdpa-" in line for line in lines[2:])
    one = _run("sdpa", tmp_path, DRY_RUN="1", SDPA_KERNELS="efficient").stdout
    assert one.count("model.sdpa_kernel=efficient") == 2 and "flash" not in one
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_text("not a wheel")
    bad = _run("sdpa", tmp_path, DRY_RUN="1", SDPA_KERNELS="fa3", WHEELS=str(wheels))
    assert bad.returncode == 2 and "SDPA_KERNELS must be flash, cudnn or efficient" in bad.stderr, bad.stderr
    assert _run("sdpa", tmp_path, DRY_RUN="1", WHEELS=str(wheels)).returncode == 1  # (the wheel does fail)


@pytest.mark.slow  # waits out a budget: ~50 s
def test_a_part_past_its_budget_skips_its_remaining_commands(tmp_path):
    """``batch`` and ``sdpa`` run several commands: one that starts after the budget is spent is skipped with a
    message. It was given ``timeout`` a negative limit ("timeout: invalid option -- '1'", exit 125), in the first
    GPU session of 2026-11-24."""
    fake = tmp_path / "fake-python"  # a "benchmark" that outlives the budget: the first command is stopped
    fake.write_text("#!/usr/bin/env bash\nsleep 120\n")
    fake.chmod(0o755)
    proc = _run("batch", tmp_path, PYTHON=str(fake), BUDGET="61", BATCH_SIZES="1,2")
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert "invalid option" not in proc.stderr
    assert "gpu_session batch: skipped" in proc.stderr and "the 61 s budget is spent" in proc.stderr
