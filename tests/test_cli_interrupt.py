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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (what Python reports)
def test_a_ctrl_c_lost_in_a_finalizer_still_stops_the_command(capsys):
    """A Ctrl-C that arrives while Python runs a finalizer (garbage collection) raises its KeyboardInterrupt there,
    where Python prints 'Exception ignored in: <finalize object ...>' and goes on: a study so interrupted trained to
    its end and exited 0. The signal's flag outlives the exception: the command stops at its next check (each
    training step's end, each phase, each study run) or, at the latest, when it returns, as interrupted."""
    import gc
    import weakref

    class Held:
        pass

    def lost_in_a_finalizer(args):
        held = Held()
        weakref.finalize(held, lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.5)))
        del held
        gc.collect()  # (the finalizer runs, the handler raises inside it, Python reports it and carries on)
        reached.append(True)
        return 0

    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    before, reached = signal.getsignal(signal.SIGINT), []
    assert run_cli(lost_in_a_finalizer, parser, []) == 130
    assert reached == [True]  # the interrupt was lost where it arrived
    assert "interrupted; continue with the same command plus --resume" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) == before
    assert run_cli(lambda args: 0, parser, []) == 0  # the flag ends with the command
