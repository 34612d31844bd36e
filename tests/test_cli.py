"""minilm.cli: what every entry point shares."""

import subprocess
import sys

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
