"""Files written whole: a temporary file beside the target, fsynced, renamed over it, the directory synced. A
crash leaves the old file or the new one, never half of one. (No torch or Lightning here: the evaluation report
and studies write through it without importing the trainer.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable


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


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")
