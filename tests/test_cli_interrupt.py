"""Ctrl-C in an entry point: exit code 130, and the '--resume' hint only from commands that have --resume."""

import argparse

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
