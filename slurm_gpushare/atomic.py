"""The one atomic file write: temporary file, fsync, rename, fsync the directory.

A reader sees the old file or the new one, never half of either. No imports
beyond the standard library, so the node hooks can use it cheaply.
"""

from __future__ import annotations

import os
import stat  # loaded by os already: free
from contextlib import contextmanager


def atomic_write(path: str | os.PathLike[str], text: str | bytes, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8; bytes as they are) to ``path`` atomically with permissions ``mode`` (mkstemp
    alone makes 0600).

    The mode is set on the open descriptor (``fchmod``), not by name: a name swapped for a link between the
    write and the chmod would lend the mode to the link's target. Before the rename the name must still be
    the file written (same device and inode, not a link), else nothing is renamed and OSError says why."""
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)  # on the file written, never on whatever the name points to now
            _still_ours(fh.fileno(), tmp)
            os.replace(tmp, path)
    except BaseException:
        _remove_temp(tmp)
        raise
    dir_fd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_KINDS = {"socket": stat.S_ISSOCK, "directory": stat.S_ISDIR}


def entry_problem(path: str, kind: str, owner: int, label: str = "") -> str | None:
    """Why root must not act on ``path`` (None: it may): it must exist, be no link, be a ``kind`` (socket,
    directory) and belong to uid ``owner``; checked with lstat, never followed. ``label`` names it in the
    reason (e.g. "the job's cgroup")."""
    name = f"{label} {path}".strip()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{name} does not exist"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} is a symbolic link"
    if not _KINDS[kind](st.st_mode):
        return f"{name} is not a {kind}"
    if st.st_uid != owner:
        return f"{name} is owned by uid {st.st_uid}, not {_owner(owner)}"
    return None


def _owner(uid: int) -> str:
    return "root" if uid == 0 else f"uid {uid}"


def trust_problem(st: os.stat_result, path: str, owner: int) -> str | None:
    """Why root must not trust what ``st`` (a stat of ``path``) holds (None: it may): it must be uid ``owner``'s,
    and writable by nobody else (a symbolic link's own mode means nothing and is not checked)."""
    if st.st_uid != owner:
        return f"{path} is owned by uid {st.st_uid}, not {_owner(owner)}"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
        return f"{path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _still_ours(fd: int, tmp: str) -> None:
    """The temporary's name still names the file open on ``fd``: not replaced, not a link."""
    mine, there = os.fstat(fd), os.lstat(tmp)
    if stat.S_ISLNK(there.st_mode) or (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
        raise OSError(
            f"{tmp}: replaced while it was written (now {_kind(there.st_mode)}, not the file written): not renamed"
        )


def _remove_temp(tmp: str) -> None:
    """Remove the temporary a failed write left (a link put in its place is removed, never followed)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def _kind(mode: int) -> str:
    return "a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else "another file"


def _create_temp(path: str) -> tuple[int, str]:
    """A new file next to ``path``, as tempfile.mkstemp makes it (O_EXCL, O_NOFOLLOW, mode 0600, a random
    name), without importing tempfile: the node hooks write journals on every job."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        parent, name = os.path.split(path)
        tmp = os.path.join(parent or ".", f".{name}.{os.urandom(6).hex()}")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path} after 100 tries")


@contextmanager
def flocked(lock_file: str | os.PathLike[str]):
    """Hold an exclusive flock on ``lock_file`` (created 0600, its directory too) for the ``with`` block."""
    import fcntl

    lock_file = os.fspath(lock_file)
    os.makedirs(os.path.dirname(lock_file) or ".", exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
