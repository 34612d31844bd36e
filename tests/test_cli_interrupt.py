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
