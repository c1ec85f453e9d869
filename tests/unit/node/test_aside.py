"""What a job leaves in its own directories never fails, drains or blocks a root hook (issue 31, class 1).

The removal of a tree a job wrote (node/aside.py), on the real filesystem: it never raises, never follows a
link, never opens anything but a directory, keeps its descriptors bounded whatever the depth, reports what it
could not do with the path, and finishes on a later run. The hooks that use it: test_pipe_dir_contents.py.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
import subprocess
import sys

import pytest

from slurm_gpushare.node import aside
from slurm_gpushare.node.aside import Budget, remove_tree, set_aside, sweep
from tests.unit.node.test_pipe_dir_contents import deep, hostile_tree


def test_a_tree_deeper_than_the_recursion_limit_and_path_max_goes_with_few_descriptors(tmp_path):
    root = tmp_path / "mps"
    key = root / "g0-u1-p50"
    (key / "pipe").mkdir(parents=True)
    deep(key / "pipe", sys.getrecursionlimit() + 500)
    set_aside(str(key), str(root))
    assert [p.name for p in root.iterdir()] == [".aside"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (held + 8, hard))  # a walk holding a descriptor per level fails
    try:
        notes = sweep(str(root))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert notes == [] and list((root / ".aside").iterdir()) == []


def test_every_kind_of_entry_is_removed_without_following_or_opening_it(tmp_path, outside, monkeypatch):
    top = tmp_path / "aside-me"
    hostile_tree(top, outside)
    opened = []
    real_open = os.open

    def watching_open(path, flags, *args, dir_fd=None, **kw):
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        opened.append(stat.S_IFMT(st.st_mode))
        assert flags & os.O_NOFOLLOW and (flags & os.O_DIRECTORY or flags & os.O_PATH)
        return real_open(path, flags, *args, dir_fd=dir_fd, **kw)

    monkeypatch.setattr(os, "open", watching_open)
    fd = real_open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_tree(fd, "aside-me", Budget(10_000, 60.0), str(top)) is None
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert not os.path.lexists(top)
    assert set(opened) == {stat.S_IFDIR}  # no FIFO, socket, device or link was ever opened
    assert (outside / "keep").read_text() == "root's" and sorted(p.name for p in outside.iterdir()) == ["keep"]


def test_a_budget_spent_is_a_note_with_the_path_and_the_next_run_finishes(tmp_path):
    root = tmp_path / "mps"
    key = root / "g0-u1-p50"
    (key / "pipe" / "many").mkdir(parents=True)
    for i in range(3000):
        (key / "pipe" / "many" / f"f{i}").touch()
    set_aside(str(key), str(root))
    notes = sweep(str(root), Budget(1000, 60.0))
    assert len(notes) == 1 and "not removed within this run's budget" in notes[0]
    assert f"{root}/.aside/g0-u1-p50." in notes[0]
    assert sweep(str(root), Budget(10_000, 60.0)) == [] and list((root / ".aside").iterdir()) == []


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENOSPC, errno.EIO])
def test_an_oserror_in_the_walk_is_a_note_naming_the_path_never_raised(tmp_path, monkeypatch, err):
    root = tmp_path / "mps"
    (root / "g0-u1-p50" / "pipe" / "sub").mkdir(parents=True)
    (root / "g0-u1-p50" / "pipe" / "sub" / "f").touch()
    set_aside(str(root / "g0-u1-p50"), str(root))
    real_scandir = os.scandir
    calls = []

    def failing_scandir(path):
        calls.append(path)
        if len(calls) == 2:  # the first directory of the tree
            raise OSError(err, os.strerror(err))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", failing_scandir)
    notes = sweep(str(root))
    assert len(notes) == 1 and os.strerror(err) in notes[0] and f"{root}/.aside/g0-u1-p50." in notes[0]
    monkeypatch.undo()
    assert sweep(str(root)) == [] and list((root / ".aside").iterdir()) == []


def test_a_file_another_process_keeps_open_in_the_tree_does_not_stop_the_removal(tmp_path):
    root = tmp_path / "mps"
    pipe = root / "g0-u1-p50" / "pipe"
    (pipe / "busy").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open('held', 'w'); print('ready', flush=True); sys.stdin.read()"],
        cwd=pipe / "busy",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        set_aside(str(root / "g0-u1-p50"), str(root))
        assert sweep(str(root)) == [] and list((root / ".aside").iterdir()) == []
    finally:
        holder.stdin.close()
        holder.wait()


def test_a_tree_moved_out_while_it_is_walked_is_left_not_followed(tmp_path, monkeypatch):
    """The walk goes back up only to the directory it came down from: a job that moves the tree meanwhile
    leaves it for the next run, and nothing outside .aside is removed."""
    root = tmp_path / "mps"
    (root / "g0-u1-p50" / "pipe" / "a" / "b").mkdir(parents=True)
    (root / "g0-u1-p50" / "pipe" / "a" / "b" / "f").touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    target = set_aside(str(root / "g0-u1-p50"), str(root))
    real_down = aside._Walk.down

    def down_then_move(walk, name):
        real_down(walk, name)
        if name == "b":  # the job renames the directory holding b, under its own directory elsewhere
            os.rename(f"{target}/pipe/a", elsewhere / "a")

    monkeypatch.setattr(aside._Walk, "down", down_then_move)
    notes = sweep(str(root))
    assert len(notes) == 1 and "moved while it was removed" in notes[0]
    assert (elsewhere / "keep").exists()
    monkeypatch.undo()
    assert sweep(str(root)) == []
