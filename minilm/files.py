"""Files written whole: a temporary file beside the target, fsynced, renamed over it, the directory synced. A
crash leaves the old file or the new one, never half of one. (No torch or Lightning here: the evaluation report
and studies write through it without importing the trainer.)"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any, Callable, Optional


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
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_path(path.parent)


TEMPORARY = re.compile(r"^\..+\.(\d+)\.tmp$")  # atomic_write's temporary file: .<name>.<pid>.tmp


def remove_stale_temporaries(directory: Path) -> None:
    """Delete the temporary files that ``atomic_write`` left in ``directory`` when a kill cut its write short (the
    ``finally`` that removes them never ran): nothing reads them, and a run's weights or report stayed beside its
    outputs for good. Only those of processes that no longer exist on this machine: another process may be writing
    its file there now (an evaluation of a finished phase)."""
    for path in directory.iterdir() if directory.is_dir() else []:
        if (m := TEMPORARY.match(path.name)) and not pid_alive(int(m.group(1))):
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


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; the user's disk quota exhausted


def disk_full(e: Optional[BaseException]) -> Optional[OSError]:
    """The ``OSError`` saying the disk (or the quota) is full that ``e`` is or was raised from, else None. Libraries
    wrap it (datasets: ``DatasetGenerationError`` from pyarrow's ``OSError``), and that is still a full disk."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # (``raise ... from None``: not)
    return None
