"""A full disk (or quota) or a read-only file system while a command writes: one message naming the file and what to
do, exit code 2, no traceback; the file it was writing stays as it was."""

import argparse
import errno
import os

import pytest

from minilm.cli import run_cli
from minilm.files import atomic_write, atomic_write_text


def parser(resumable: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--debug", action="store_true")
    if resumable:
        p.add_argument("--resume", action="store_true")
    return p


def writing(target, code):
    """A command's main that writes ``target`` through atomic_write on a device answering ``code``."""

    def write(f):
        f.write("half of it")
        raise OSError(code, os.strerror(code))

    def main(args):
        atomic_write(target, write, mode="w")

    return main


@pytest.mark.parametrize("code, why", [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "quota is exhausted"),
                                       (errno.EROFS, "read-only")])  # fmt: skip
@pytest.mark.parametrize("resumable", [True, False])
def test_a_write_that_cannot_be_made_names_the_file_and_exits_2(tmp_path, capsys, code, why, resumable):
    """train.py with its disk filling up at a phase's end (its weights, a checkpoint, complete.json), evaluate.py
    writing a figure: an OSError traceback without the file's name ("[Errno 28] No space left on device"), exit 1,
    where the error contract is one message and exit 2."""
    target = tmp_path / "train" / "model.safetensors"
    atomic_write_text(target, "old")
    assert run_cli(writing(target, code), parser(resumable), []) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {target}: ") and why in err and "Traceback" not in err
    assert ("--resume" in err) == resumable and (resumable or "run the command again" in err)
    assert target.read_text() == "old" and [p.name for p in target.parent.iterdir()] == ["model.safetensors"]


def test_a_full_disk_wrapped_by_a_library_is_said_alike_and_other_os_errors_stay_tracebacks(tmp_path, capsys):
    def wrapped(args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("writer failed") from e

    assert run_cli(wrapped, parser(True), []) == 2
    assert "the disk is full; free some space, then continue" in capsys.readouterr().err

    def broken(args):  # a bug, or an error no user setting explains: the traceback is what helps
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        run_cli(broken, parser(True), [])
