"""atomic_write: a file is replaced whole or not at all. lock_file: one holder at a time, even across removal."""

import errno
import os
import threading

import pytest

from minilm import files
from minilm.files import LockHeld, atomic_write, atomic_write_text, is_locked, lock_file

needs_flock = pytest.mark.skipif(files.fcntl is None, reason="no flock on this platform")


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    atomic_write_text(target, "old")

    def fail_midway(f):
        f.write("half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fail_midway, mode="w")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_write_creates_missing_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "out.bin"
    atomic_write(target, lambda f: f.write(b"\x00\x01"))
    assert target.read_bytes() == b"\x00\x01" and [p.name for p in target.parent.iterdir()] == ["out.bin"]


@needs_flock
def test_a_held_lock_refuses_with_its_text_and_is_free_once_closed(tmp_path):
    path = tmp_path / "x.lock"
    fd, locked = lock_file(path)
    os.pwrite(fd, b"123 host", 0)
    assert locked and is_locked(path)
    with pytest.raises(LockHeld) as e:
        lock_file(path)  # flock binds an open file, not a process: a second open in this process is refused too
    assert e.value.text == "123 host"
    os.close(fd)
    assert not is_locked(path)
    fd2, locked2 = lock_file(path)
    assert locked2
    os.close(fd2)


@needs_flock
def test_a_waiter_says_so_and_takes_the_next_file_after_the_holder_removes_its_own(tmp_path):
    """The holder removes the file while holding it; a waiter that opened it before then wakes holding a lock on a
    file that is gone, and must take the one at the path instead, or two processes would hold "the" lock."""
    path = tmp_path / "x.lock"
    fd, _ = lock_file(path)
    waited, got = threading.Event(), []

    def waiter():
        got.append(lock_file(path, wait=True, on_wait=waited.set))

    t = threading.Thread(target=waiter)
    t.start()
    assert waited.wait(10)
    path.unlink()  # the holder's cleanup: remove, then release
    os.close(fd)
    t.join(10)
    (fd2, locked2), = got
    assert locked2 and files.is_file_at(fd2, path) and is_locked(path)
    os.close(fd2)


def test_without_flock_the_file_is_open_and_unlocked(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    fd, locked = lock_file(tmp_path / "x.lock")
    assert not locked and files.is_file_at(fd, tmp_path / "x.lock")
    os.close(fd)
    assert not is_locked(tmp_path / "x.lock") and not is_locked(tmp_path / "absent.lock")
