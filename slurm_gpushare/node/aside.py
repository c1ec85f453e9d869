"""Trees a job's user wrote, taken out of the way in one step and removed later, within a budget.

A job owns its MPS pipe directory and may leave anything in it: a tree
deeper than any recursion or path limit, millions of entries, FIFOs,
sockets, device nodes, links, names that are not UTF-8, directories it made
unreadable, files a second job of the same user keeps open. So a root hook
never walks such a tree while it holds the node's locks: ``set_aside``
renames it, in one step, into ``<root>/.aside`` (root 0700, on the same
filesystem as the tree), and ``sweep`` removes what is there later, after
the locks are released (the epilog) or in the health check:

- iteratively, one directory open at a time (a descriptor of the directory
  being cleared, relative to which every entry is removed: no path is ever
  built, so no depth or length limit applies, and the descriptors used stay
  below five whatever the depth);
- opening nothing but directories, with ``O_NOFOLLOW | O_DIRECTORY |
  O_NONBLOCK`` (a link is removed, never followed; a FIFO or device is
  unlinked, never opened), never crossing into another filesystem;
- going back up through ``..`` only to the directory it came down from
  (device and inode checked), so a tree the job moves meanwhile is left
  for the next run, never followed out of ``.aside``;
- within a budget of entries and seconds: what is left waits for the next
  run.

Errors are never raised: each tree not removed is one note naming its path
and why. Imports only what the interpreter has loaded already (the epilog
runs this on every MPS job's end).
"""

from __future__ import annotations

import os
import stat
import time

ASIDE = ".aside"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SHOW_MAX = 240  # characters of a path in a note
EPILOG_BUDGET = (20_000, 1.0)  # entries, seconds: an epilog is on the job's critical path
HEALTH_BUDGET = (500_000, 20.0)


def aside_dir(root: str) -> str:
    return root.rstrip("/") + "/" + ASIDE


def ensure_aside(root: str) -> int:
    """``<root>/.aside`` as root's own directory (0700, not a link), opened; OSError if it cannot be."""
    path = aside_dir(root)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = os.open(path, _DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to root: remove it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


def set_aside(path: str, root: str, clock=time.time_ns) -> str:
    """Rename ``path`` (an entry of a root-owned directory, on the filesystem of ``root``) into
    ``<root>/.aside`` in one step; return its new path. OSError (the path in it) when that fails: then
    ``path`` is where it was."""
    fd = ensure_aside(root)
    os.close(fd)
    target = f"{aside_dir(root)}/{os.path.basename(path.rstrip('/'))}.{clock()}"
    os.rename(path, target)
    return target


class Budget:
    """Entries and seconds a sweep may spend."""

    def __init__(self, entries: int, seconds: float, clock=time.monotonic):
        self.left, self.deadline, self.clock = entries, clock() + seconds, clock
        self.entries, self.seconds = entries, seconds

    def take(self) -> None:
        self.left -= 1
        if self.spent():
            raise _Spent()

    def spent(self) -> bool:
        return self.left <= 0 or self.clock() > self.deadline

    def __str__(self) -> str:
        return f"{self.entries} entries, {self.seconds:g} s"


class _Spent(Exception):
    pass


def sweep(root: str, budget: Budget | None = None) -> list[str]:
    """Remove what ``set_aside`` put under ``<root>/.aside``, within ``budget``; return notes (never raises)."""
    budget = budget or Budget(*HEALTH_BUDGET)
    aside = aside_dir(root)
    try:
        fd = os.open(aside, _DIR_FLAGS)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [_note(aside, exc)]
    notes: list[str] = []
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return [f"{show(aside)} is not root's: left alone"]
        with os.scandir(fd) as listing:
            names = [entry.name for _, entry in zip(range(10_000), listing, strict=False)]
        for index, name in enumerate(names):
            if budget.spent():
                notes.append(
                    f"{show(aside)}: {len(names) - index} set-aside trees left for the next run (budget {budget})"
                )
                break
            why = remove_tree(fd, name, budget, f"{aside}/{name}")
            if why:
                notes.append(why)
    except OSError as exc:
        notes.append(_note(aside, exc))
    finally:
        os.close(fd)
    return notes


def remove_tree(parent_fd: int, name: str, budget: Budget, label: str) -> str | None:
    """Remove the entry ``name`` of the directory open on ``parent_fd`` and everything under it; None when it
    is gone, else a note naming ``label`` (its path) and why."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return None
        fd = _open_dir(parent_fd, name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _note(label, exc)
    walk = _Walk(fd, st)
    try:
        return walk.run(parent_fd, name, budget, label)
    finally:
        walk.close()


class _Walk:
    """Depth-first removal holding one directory open: ``path`` is (name, inode) of each directory from the
    top of the tree down to the one open."""

    def __init__(self, fd: int, top: os.stat_result):
        self.fd, self.dev, self.path = fd, top.st_dev, [("", top.st_ino)]

    def run(self, parent_fd: int, name: str, budget: Budget, label: str) -> str | None:
        try:
            while True:
                budget.take()  # a pass that finds nothing to remove still counts (a writer racing the walk)
                sub = _clear_flat(self.fd, self.dev, budget)
                if sub is not None:
                    self.down(sub)
                elif len(self.path) == 1:
                    if _rmdir(name, parent_fd):
                        return None
                else:
                    self.up()
        except _Spent:
            return (
                f"{show(label)}: not removed within this run's budget ({budget}; at depth {len(self.path)}): "
                "left for the next run"
            )
        except OSError as exc:
            return _note(label + (f" (at depth {len(self.path)})" if len(self.path) > 1 else ""), exc)

    def down(self, name: str) -> None:
        child = _open_dir(self.fd, name)
        st = os.fstat(child)
        if st.st_dev != self.dev:
            os.close(child)
            raise OSError(18, "another filesystem is mounted there: not entered", name)
        os.close(self.fd)
        self.fd = child
        self.path.append((name, st.st_ino))

    def up(self) -> None:
        parent = os.open("..", _DIR_FLAGS, dir_fd=self.fd)
        st = os.fstat(parent)
        if (st.st_dev, st.st_ino) != (self.dev, self.path[-2][1]):
            os.close(parent)
            raise OSError(16, "moved while it was removed: left for the next run", self.path[-1][0])
        os.close(self.fd)
        self.fd = parent
        _rmdir(self.path.pop()[0], self.fd)  # written to meanwhile: the next pass goes down again

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _clear_flat(fd: int, dev: int, budget: Budget) -> str | None:
    """Unlink every entry of the directory open on ``fd`` that is not a directory and remove its empty
    directories; return the name of the first directory that is not empty (None: none left)."""
    with os.scandir(fd) as listing:
        for entry in listing:
            budget.take()
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:  # replaced by a directory since the listing: the next pass
                    return entry.name
                continue
            if not _rmdir(entry.name, fd):
                return entry.name
    return None


def _rmdir(name: str, dir_fd: int) -> bool:
    """Remove the empty directory ``name``; False when it is not empty."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (39, 17):  # ENOTEMPTY, EEXIST
            return False
        raise
    return True


def _open_dir(parent_fd: int, name: str) -> int:
    """Open the directory ``name`` (no link followed, nothing but a directory opened); one its owner made
    unreadable or unsearchable is given back its owner's rwx first (it is being removed)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)  # the directory open on handle, never a name
        finally:
            os.close(handle)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    mode = os.fstat(fd).st_mode
    if mode & 0o700 != 0o700:  # unwritable: its entries could not be removed
        os.fchmod(fd, 0o700)
    return fd


def show(path: str) -> str:
    """``path`` for a one-line note: control characters and undecodable bytes escaped, the middle of a long
    path cut."""
    text = path.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
    text = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= _SHOW_MAX else text[: _SHOW_MAX // 2] + "..." + text[-_SHOW_MAX // 2 :]


def _note(path: str, exc: OSError) -> str:
    where = f" ({show(str(exc.filename))})" if exc.filename not in (None, path) else ""
    return f"{show(path)}: not removed: {exc.strerror or exc}{where}; left for the next run"
