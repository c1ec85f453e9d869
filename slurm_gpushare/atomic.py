"""The one atomic file write: temporary file, fsync, rename, fsync the directory.

A reader sees the old file or the new one, never half of either. No imports
beyond the standard library, so the node hooks can use it cheaply.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically with permissions ``mode`` (mkstemp alone makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new file next to ``path``, as tempfile.mkstemp makes it (O_EXCL, O_NOFOLLOW, mode 0600, a random
    name), without importing tempfile: the node hooks write journals on every job."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(path.parent, f".{path.name}.{os.urandom(6).hex()}")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path} after 100 tries")


@contextmanager
def flocked(lock_file: Path):
    """Hold an exclusive flock on ``lock_file`` (created 0600, its directory too) for the ``with`` block."""
    import fcntl

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
