"""Files written whole: a temporary file beside the target, fsynced, renamed over it, the directory synced. A
crash leaves the old file or the new one, never half of one. Lock files that die with their process (``lock_file``:
the run lock, the corpus preparation lock). (No torch or Lightning here: the evaluation report and studies write
through it without importing the trainer.)"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any, Callable, Collection, Optional, Tuple

try:
    import fcntl
except ImportError:  # (Windows: no flock; lock_file says so and the callers decide by other means)
    fcntl = None


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (its entries: a rename in it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Call ``write(fileobj)`` on a temporary file next to ``path``, then atomically rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a write's error names no file, and the temporary's name is not the one the user knows:
        if e.errno is not None and e.filename in (None, str(tmp)) and e.filename2 is None:  # (not the rename's)
            raise OSError(e.errno, e.strerror, str(path)) from e  # say which (a full disk: ``cannot_write``)
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_path(path.parent)


TEMPORARY = re.compile(r"^\.(.+)\.(\d+)\.tmp$")  # atomic_write's temporary file: .<name>.<pid>.tmp


def remove_stale_temporaries(directory: Path, names: Optional[Collection[str]] = None) -> None:
    """Delete the temporary files that ``atomic_write`` left in ``directory`` when a kill cut its write short (the
    ``finally`` that removes them never ran): nothing reads them, and a run's weights or report stayed beside its
    outputs for good. Only those of processes that no longer exist on this machine: another process may be writing
    its file there now (an evaluation of a finished phase). With ``names``, only those written for these file names
    (a folder that holds other things too: ``evaluate.py --out`` may name any folder)."""
    for path in directory.iterdir() if directory.is_dir() else []:
        if (m := TEMPORARY.match(path.name)) and (names is None or m.group(1) in names):
            if not pid_alive(int(m.group(2))):
                path.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists; True where that cannot be told (a leftover too many is kept,
    never a live write removed; a stale lock respected, never a live one taken over). One test for the temporary
    files here, the corpus builds of minilm.data.prepare and the run lock of minilm.training.phases."""
    if pid == os.getpid():
        return True
    if os.name != "posix" or pid <= 0:  # (on Windows os.kill(pid, 0) would end the process)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def same_bytes(a: str | Path, b: str | Path) -> bool:
    """Whether two files hold the same bytes (a tokenizer.model against another: the same token ids); an OSError
    where one cannot be read, for the caller to say what that means."""
    return Path(a).read_bytes() == Path(b).read_bytes()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; the user's disk quota exhausted


def disk_full(e: Optional[BaseException]) -> Optional[OSError]:
    """The ``OSError`` saying the disk (or the quota) is full that ``e`` is or was raised from, else None. Libraries
    wrap it (datasets: ``DatasetGenerationError`` from pyarrow's ``OSError``), and that is still a full disk."""
    return _raised_from(e, DISK_FULL)


def cannot_write(e: Optional[BaseException]) -> Optional[OSError]:
    """The ``OSError`` that ``e`` is or was raised from when it says that nothing can be written where the command
    writes: a full disk or quota (``disk_full``), or a read-only file system (one remounted so after a disk error).
    Not a bug to show as a traceback: the user frees space or writes elsewhere (minilm.cli.run_cli says so)."""
    return _raised_from(e, (*DISK_FULL, errno.EROFS))


def _raised_from(e: Optional[BaseException], errnos: Collection[int]) -> Optional[OSError]:
    """The first ``OSError`` with one of ``errnos`` along ``e`` and the exceptions it was raised from."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in errnos:
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # (``raise ... from None``: not)
    return None


# ------------------------------------------------------------------------------------------------ lock files


class LockHeld(Exception):
    """``lock_file`` found the lock held by another process; ``text`` is what its file says (the holder, where it
    wrote itself there)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def lock_file(path: Path, wait: bool = False, on_wait: Optional[Callable[[], None]] = None,
              mode: int = 0o666) -> Tuple[int, bool]:
    """Open ``path`` (created if absent) and take an exclusive ``flock`` on it: returns (fd, True). The kernel drops
    the lock when its process dies, however it dies, so a lock of a killed process is never stale.

    Held by another process: raises ``LockHeld`` with the file's text or, with ``wait``, calls ``on_wait`` and
    blocks until it is released. The lock is taken through the descriptor and then checked to be still the file at
    ``path``: its holder removes the file when done, while holding it, and a process that opened the file just
    before would otherwise lock one that is gone while a third creates the next. Then the next one is tried.
    Where flock cannot work (no fcntl; ENOLCK or EOPNOTSUPP from a network file system): (fd, False), the file open
    and unlocked, for the caller to decide by other means. The caller closes fd (and removes the file when done).
    An ``OSError`` opening the file propagates."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            locked = fcntl is not None and _flock(fd, wait, on_wait)
        except BaseException:
            os.close(fd)
            raise
        if is_file_at(fd, path):
            return fd, locked
        os.close(fd)  # removed (or replaced) by its holder since it was opened: the one there now


def _flock(fd: int, wait: bool, on_wait: Optional[Callable[[], None]]) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not wait:
            raise LockHeld(lock_text(fd)) from None
        if on_wait is not None:
            on_wait()
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # ENOLCK and kin: a file system without flock
        return False
    return True


def is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed, nor replaced by another)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def lock_text(fd: int) -> str:
    """What the lock file ``fd`` says (``lock_file``'s callers write their holder there), stripped."""
    return os.pread(fd, 4096, 0).decode(errors="replace").strip()


def is_locked(path: Path) -> bool:
    """Whether a process holds a ``flock`` on the file ``path``; False where there is no such file or it cannot be
    told. (A shared lock, taken and dropped at once: it never keeps a waiting ``lock_file`` out for long.)"""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # (releases the shared lock, if taken)
