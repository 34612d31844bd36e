"""minilm.cli: what every entry point shares."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# In a fresh process (torch's worker threads not started yet), as train.py, evaluate.py and generate.py run.
SUBNORMALS_AFTER_RUN_CLI = """
import argparse, torch
from minilm.cli import run_cli
torch.set_num_threads(2)

def main(args):
    x = torch.full((4_000_000,), 2.0) * 5e-40  # subnormal in fp32 (below 1.2e-38), on both threads
    print("nonzero", int((x * 1.0).count_nonzero()))

raise SystemExit(run_cli(main, argparse.ArgumentParser()))
"""


def test_entry_points_flush_subnormals_on_every_cpu_thread():
    """Subnormal floats (a softmax over logits far below the row's maximum: ALiBi's bias at long T) make x86
    arithmetic many times slower; run_cli flushes them to zero before torch starts its worker threads, so
    every thread of an intra-op parallel region does (a thread started earlier would keep them)."""
    proc = subprocess.run([sys.executable, "-c", SUBNORMALS_AFTER_RUN_CLI], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "nonzero 0" in proc.stdout, proc.stdout


# Page faults over 20 rounds of a step's pattern of large tensors after run_cli's set-up (two 4 MB fp32 tensors at
# once; bf16 logits, their fp32 copy and its log-softmax, 2-4 MB each), on 2 threads: glibc's default malloc hands
# such memory back to the kernel on free and faults it in again, 4 KB at a time (10,000-50,000 faults measured over
# the 20 rounds), where the kept freed memory serves them again (0-2,000, the more with 1 thread).
FAULTS_AFTER_RUN_CLI = """
import argparse, resource, torch
from minilm.cli import run_cli
torch.set_num_threads(2)

def main(args):
    def round():
        x = torch.ones(1 << 20)
        (x * 2).sum()
        h, w = torch.ones(512, 128).bfloat16(), torch.ones(2048, 128).bfloat16()
        torch.log_softmax((h @ w.T).float(), -1)

    for _ in range(10):  # (the heap grows to its working size over the first few)
        round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        round()
    print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

raise SystemExit(run_cli(main, argparse.ArgumentParser()))
"""


def _faults(env: dict) -> int:
    proc = subprocess.run([sys.executable, "-c", FAULTS_AFTER_RUN_CLI], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split("faults")[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
def test_entry_points_keep_freed_memory_for_the_next_tensor():
    """run_cli keeps the memory freed tensors held for the next ones (minilm.cli.keep_freed_memory): glibc's default
    hands it back to the kernel, and every 4 KB of the next tensors faults in again, which cost the tiny config's CPU
    training run about an eighth of its time. Where the user set glibc's malloc variables, theirs stand."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    kept = _faults(env)
    users = _faults({**env, "MALLOC_TOP_PAD_": str(128 * 1024)})  # glibc's default pad, set by the user: untouched
    assert kept < 4000, f"{kept} page faults in 20 rounds of large tensors: freed memory was not kept"
    assert users > 8000, f"only {users} page faults with the user's own malloc settings: they were overridden"


def test_evaluation_generation_and_export_load_runs_without_lightning():
    """Lightning's import takes seconds (torchmetrics imports transformers and scipy through it): generate.py spent
    ~7 of its ~11 s there, for a CheckpointIO class it never used. Only training imports it."""
    code = ("import sys, minilm.runs, minilm.eval, minilm.export, minilm.model.generate, minilm.training.checkpoint; "
            "print(sorted(m for m in ('lightning', 'torchmetrics') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_overrides_may_follow_flags():
    """`train.py --config X --resume train.steps=9`: argparse's plain parse_args rejects positionals after a flag
    once the (empty) positional list was consumed; run_cli parses them intermixed."""
    import argparse

    from minilm.cli import add_config_args, run_cli

    seen = {}
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    parser.add_argument("--resume", action="store_true")
    argv = ["--config", "c.yaml", "--resume", "a.b=1", "c=2"]
    assert run_cli(lambda args: seen.update(vars(args)), parser, argv) == 0
    assert seen["overrides"] == ["a.b=1", "c=2"] and seen["resume"]


def test_prepare_data_takes_overrides_after_flags():
    proc = subprocess.run([sys.executable, "scripts/prepare_data.py", "--quiet", "data.num_proc=0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "data.num_proc: must be >= 1" in proc.stderr, proc.stderr


def test_a_single_valued_option_given_twice_is_an_error(capsys):
    """argparse keeps the last of a repeated option silently: `--config a.yaml ... --config b.yaml` trained b."""
    import pytest

    from tests.conftest import load_script

    train_py = load_script("train.py")
    for argv, flag in ((["--config", "a.yaml", "x.y=1", "--config", "b.yaml"], "--config"),
                       (["--config", "a.yaml", "--phase", "p", "--phase", "q"], "--phase"),
                       (["--config", "a.yaml", "--init", "w1", "--init", "w2"], "--init")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            train_py.parser().parse_intermixed_args(argv)
        assert exit_.value.code == 2 and f"{flag} given twice" in capsys.readouterr().err
    args = train_py.parser().parse_intermixed_args(["--config", "a.yaml", "--phase", "p", "k=v", "--resume"])
    assert (args.config, args.phase, args.overrides, args.resume) == ("a.yaml", "p", ["k=v"], True)


def test_a_config_file_given_without_config_says_how_to_give_it():
    proc = subprocess.run([sys.executable, "scripts/prepare_data.py", "configs/tiny.yaml"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "override 'configs/tiny.yaml' must look like key.sub=value" in proc.stderr
    assert "(a config file is given with --config FILE)" in proc.stderr and "Traceback" not in proc.stderr


def test_a_failure_recorded_by_an_earlier_torchrun_attempt_is_not_this_ones(monkeypatch):
    """torchrun --max-restarts keeps its agent's store across attempts: the first failure of attempt 0 read as attempt
    1's, so a new bug lost its traceback (another rank 'had failed first') and a message went unsaid. The key is the
    attempt's (TORCHELASTIC_RESTART_COUNT); within an attempt another rank's failure is still found."""
    import torch.distributed as dist

    import minilm.cli as cli

    store = dist.HashStore()
    monkeypatch.setattr(cli, "_run_store", lambda: (store, 0, lambda: None))
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)  # (the ending process's SIGTERM: not this test's)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    store.compare_set(cli._first_failure_key(), "", "1\nerror: rank 1's")
    assert cli._failed_rank(None) == (1, "error: rank 1's")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert cli._failed_rank(None) is None
    assert cli._failed_rank("error: mine") is None  # this attempt's first failure: this rank's, to print
