"""Ctrl-C in an entry point: exit code 130, and the '--resume' hint only from commands that have --resume. SIGTERM:
the same, exit code 143."""

import argparse
import os
import signal
import time

import pytest

from minilm.cli import run_cli


def interrupted(args):
    raise KeyboardInterrupt


@pytest.mark.parametrize("resumable", [True, False])
def test_interrupt_hints_resume_only_where_it_exists(resumable, capsys):
    """generate.py and export_hf.py said 'continue with --resume' on Ctrl-C, a flag they do not have."""
    parser = argparse.ArgumentParser()
    if resumable:
        parser.add_argument("--resume", action="store_true")
    assert run_cli(interrupted, parser, []) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and ("--resume" in err) == resumable


def test_interrupt_while_torch_is_imported_is_the_same_message(monkeypatch, capsys):
    """The first second of every command imports torch (flush_denormals, before main): a Ctrl-C there printed a
    KeyboardInterrupt traceback instead of 'interrupted', exit code 130."""
    import minilm.cli as cli

    monkeypatch.setattr(cli, "flush_denormals", lambda: interrupted(None))
    assert run_cli(lambda args: 0, argparse.ArgumentParser(), []) == 130
    assert "interrupted" in capsys.readouterr().err


def test_sigterm_stops_like_ctrl_c_runs_the_finally_blocks_and_is_put_back(capsys):
    """SIGTERM (a scheduler preempting the job) ended the process at once without a word outside Lightning's loop:
    during data preparation or an evaluation, and a preparation's temporary directory stayed behind."""
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []

    def preempted(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # (the handler runs at the next bytecode: this sleep is cut short)
            return 0
        finally:
            cleaned.append(True)

    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    t0 = time.monotonic()
    assert run_cli(preempted, parser, []) == 143
    assert time.monotonic() - t0 < 4 and cleaned == [True]
    assert "terminated (SIGTERM); continue with the same command plus --resume" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before
    assert run_cli(interrupted, parser, []) == 130  # a Ctrl-C after it is still "interrupted"
    assert "interrupted; continue" in capsys.readouterr().err


def test_interrupt_is_reported_by_the_first_rank_only(monkeypatch, capsys):
    """Ctrl-C of a DDP run reaches every rank, and each printed 'interrupted; continue with --resume'. Every rank
    still exits 130; only the first one says so."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    assert run_cli(interrupted, parser, []) == 130
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert run_cli(interrupted, parser, []) == 130
    assert "interrupted; continue with the same command plus --resume" in capsys.readouterr().err
