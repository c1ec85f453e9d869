"""What a job leaves in its own MPS pipe dir never fails, drains or blocks a root hook (issue 31, class 1).

A job owns its MPS pipe dir and may fill it with anything: a tree deeper than Python's recursion limit and
PATH_MAX, FIFOs, sockets, device nodes, links to root's files, names that are not UTF-8, directories it made
unreadable or unwritable. The epilog of such a job and the health check after a job whose epilog never ran
succeed, drain nothing and leave nothing (the tree is set aside under the locks and removed after them,
node/aside.py, tested on its own in test_aside.py); a key dir that cannot be set aside is a note; and the
daemon whose pipe dir is handed over is identified by its pid file and executable as well as its socket.

Where the hooks can mount (as root), each daemon's key dir is a size-capped tmpfs of its own
(node.mps.PIPE_TMPFS): a job that fills its pipe dir fills that tmpfs only (another user's daemon still
starts), cannot hard-link a file from outside it, and all it wrote goes with the mount when its daemon
quits. The set-aside tests run on a node that cannot mount (``shared_node``), as the fallback.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the pipe dirs are handed to other uids")
USER = 4103  # a job's user (no passwd entry needed)


def deep(top: Path, depth: int, name: str = "d" * 40) -> None:
    """A chain of ``depth`` directories under ``top``, made by descriptor (its path is far beyond PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as fh:
            fh.write("x")
    finally:
        os.close(fd)


def hostile_tree(top: Path, outside: Path) -> None:
    """Every kind of entry a user can make, and names no path-based walk handles."""
    top.mkdir()
    os.mkfifo(top / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(top / "sock"))
    sock.close()
    (top / "to-outside").symlink_to(outside)
    (top / "to-file").symlink_to(outside / "keep")
    try:
        os.link(outside / "keep", top / "hardlink")
    except OSError as exc:  # the key dir's own tmpfs (node.mps.PIPE_TMPFS): no hard link to a file outside it
        assert exc.errno == errno.EXDEV, exc
    os.mkdir(os.fsencode(top) + b"/\xff\xfe-not-utf8")
    (top / "new\nline").write_text("x")
    (top / ("n" * 255)).write_text("x")
    (top / "locked" / "inner").mkdir(parents=True)
    (top / "locked" / "inner" / "f").write_text("x")
    os.chmod(top / "locked" / "inner", 0o000)
    os.chmod(top / "locked", 0o000)
    (top / "readonly").mkdir()
    (top / "readonly" / "f").write_text("x")
    os.chmod(top / "readonly", 0o500)
    if os.geteuid() == 0:
        os.mknod(top / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def shared_node(tmp_path):
    """A test MPS node whose hooks cannot mount: the key dirs share ``<state_dir>/mps`` and are set aside."""
    from tests.unit.hooks_support import HookNode

    node = HookNode(tmp_path, "lab-mps01")
    node.mps.cap = None
    return node


def fill_until_full(top: Path) -> int:
    """Empty files in a new directory ``top`` until the filesystem refuses one (ENOSPC); how many were made."""
    top.mkdir()
    for made in range(1_000_000):
        try:
            (top / f"f{made}").touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return made
    raise AssertionError(f"{top}: a million files and no ENOSPC: the pipe dir has no cap of its own")


@pytest.fixture
def outside(tmp_path):
    out = tmp_path / "outside"
    out.mkdir()
    (out / "keep").write_text("root's")
    return out


def fill(pipe: Path, outside: Path) -> None:
    """What the job leaves in its pipe dir, owned by its user."""
    hostile_tree(pipe / "junk", outside)
    deep(pipe, sys.getrecursionlimit() + 200)
    for dirpath, dirnames, filenames in os.walk(pipe / "junk"):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), USER, USER, follow_symlinks=False)


@as_root
def test_epilog_of_a_job_that_filled_its_pipe_dir_succeeds_and_leaves_nothing(tmp_path, outside, monkeypatch):
    # The epilog's budget has a wall-clock second: on a loaded machine the sweep of this tree can outlast it (what
    # is left waits for the health check, tested below). This test is about what is removed, not how fast: the
    # entries budget stays, the seconds are not the test's to race.
    from slurm_gpushare.node import aside

    monkeypatch.setattr(aside, "EPILOG_BUDGET", (aside.EPILOG_BUDGET[0], 600.0))
    from slurm_gpushare.hooks import epilog as epilog_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.node.journal import JournalStore
    from tests.unit.hooks_support import stop_daemons

    node = shared_node(tmp_path)
    drains = []

    def scontrol(argv, **_kw):
        from slurm_gpushare.proc import Result

        drains.append(argv)
        return Result(tuple(argv), 0, "", "")

    try:
        assert prolog_hook.main(node.env(91, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
        daemon = JournalStore(node.state_dir).read(91).mps
        fill(Path(daemon.pipe_dir), outside)
        assert epilog_hook.main(node.env(91, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
    finally:
        stop_daemons(node.state_dir)
    assert drains == [] and node.journals() == []
    assert [p.name for p in (node.state_dir / "mps").iterdir()] == [".aside"]
    assert list((node.state_dir / "mps" / ".aside").iterdir()) == []
    assert (outside / "keep").read_text() == "root's"


@as_root
def test_health_cleans_up_after_a_job_whose_epilog_never_ran_without_a_drain_or_a_crash(tmp_path, outside):
    """An orphan daemon dir (no journal names it) whose pipe dir the job filled: the health check stops the
    daemon, sets the dir aside and removes it, reports notes, never drains; a second run is clean."""
    from slurm_gpushare.hooks import health as health_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.node.journal import JournalStore
    from tests.unit.hooks.test_repair import FakeSlurm
    from tests.unit.hooks_support import no_scontrol, stop_daemons

    node = shared_node(tmp_path)
    try:
        assert prolog_hook.main(node.env(92, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0
        store = JournalStore(node.state_dir)
        daemon = store.read(92).mps
        fill(Path(daemon.pipe_dir), outside)
        slurm = FakeSlurm("lab-mps01", "gpu:a30:1,mps:a30:100")  # job 92 ended; its epilog never ran
        env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config)}
        for _ in range(2):
            lines: list[str] = []
            assert health_hook.main(env, runner=slurm, mps=node.mps, is_device=lambda p: True) == 0
            report = health_hook.health(env, runner=slurm, mps=node.mps, is_device=lambda p: True, out=lines.append)
            assert report.findings.problems() == [] and "DRAIN" not in slurm.flags
    finally:
        stop_daemons(node.state_dir)
    assert node.journals() == [] and not os.path.lexists(Path(daemon.pipe_dir).parent)
    assert list((node.state_dir / "mps" / ".aside").iterdir()) == []
    assert (outside / "keep").read_text() == "root's"
    assert any("on the filesystem of" in line and "tmpfs" in line for line in lines)  # no tmpfs on this test node


@as_root
def test_a_key_dir_that_cannot_be_set_aside_is_a_note_not_a_failed_epilog(tmp_path, monkeypatch):
    from slurm_gpushare.hooks import epilog as epilog_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from tests.unit.hooks_support import no_scontrol, stop_daemons

    node = shared_node(tmp_path)
    try:
        assert prolog_hook.main(node.env(93, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0

        def full(src, dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src)

        monkeypatch.setattr(os, "rename", full)
        assert epilog_hook.main(node.env(93, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0
        assert any("not set aside for removal" in note for note in node.mps.notes)
        monkeypatch.undo()
    finally:
        stop_daemons(node.state_dir)
    assert node.journals() == []


@as_root
def test_a_filled_pipe_dir_fills_its_own_tmpfs_only_and_goes_with_it(tmp_path, outside):
    """One user fills their pipe dir until the node says no room: that is their daemon's own tmpfs; another
    user's daemon then starts on the same node and GPU, and the first job's epilog detaches the tmpfs with all it
    held (nothing walked, nothing set aside), drains nothing and leaves no mount."""
    from slurm_gpushare.hooks import epilog as epilog_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.node.journal import JournalStore
    from slurm_gpushare.node.mps import is_mount
    from tests.unit.hooks_support import HookNode, key_dir_mounts, no_scontrol, stop_daemons

    node = HookNode(tmp_path, "lab-mps01")
    store = JournalStore(node.state_dir)
    try:
        assert prolog_hook.main(node.env(96, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0
        full = store.read(96).mps
        assert is_mount(str(Path(full.pipe_dir).parent)), node.mps.notes
        fill(Path(full.pipe_dir), outside)
        assert 0 < fill_until_full(Path(full.pipe_dir) / "flood") < 4096  # PIPE_TMPFS's nr_inodes
        assert prolog_hook.main(node.env(97, "0", 25, uid=USER + 1), runner=no_scontrol, mps=node.mps) == 0
        other = store.read(97).mps
        assert other.key != full.key and node.mps.alive(other) and "GPUSHARE_REFUSE" not in store.read(97).env
        assert epilog_hook.main(node.env(96, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0
        assert not os.path.lexists(Path(full.pipe_dir).parent) and node.mps.alive(other)
        assert key_dir_mounts(node.state_dir) == [str(Path(other.pipe_dir).parent.resolve())]
        assert list((node.state_dir / "mps" / ".aside").iterdir()) == []
        assert epilog_hook.main(node.env(97, "0", 25, uid=USER + 1), runner=no_scontrol, mps=node.mps) == 0
    finally:
        stop_daemons(node.state_dir)
    assert node.journals() == [] and key_dir_mounts(node.state_dir) == []
    assert (outside / "keep").read_text() == "root's"


@as_root
def test_the_daemon_is_identified_by_its_pid_file_and_executable(tmp_path, monkeypatch, capsys):
    """The pipe dir is handed over once the daemon's pid file names the process listening on its control socket,
    and that process runs the control program root started; any other program is refused."""
    import shutil

    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.node import mps as mps_mod
    from slurm_gpushare.node.journal import JournalStore
    from tests.unit.hooks_support import FAKES, HookNode, no_scontrol, stop_daemons

    stub = str(FAKES / "nvidia-cuda-mps-control")  # a script: the kernel runs its interpreter
    assert mps_mod.command_executables((stub,)) == {
        os.path.realpath(stub),
        os.path.realpath(shutil.which("python3", path=mps_mod.SAFE_PATH)),
    }
    node = HookNode(tmp_path, "lab-mps01")
    try:
        assert prolog_hook.main(node.env(94, "0", 25, uid=USER), runner=no_scontrol, mps=node.mps) == 0
        daemon = JournalStore(node.state_dir).read(94).mps
        record = mps_mod.read_record(daemon.pipe_dir)
        assert int((Path(daemon.pipe_dir).parent / "root" / mps_mod.PID_FILE).read_text()) == record["pid"]
        assert record["exe"] == os.path.realpath(sys.executable)
        capsys.readouterr()
        monkeypatch.setattr(mps_mod, "command_executables", lambda command: frozenset({"/usr/bin/true"}))
        assert prolog_hook.main(node.env(95, "0", 50, uid=USER + 1), runner=no_scontrol, mps=node.mps) == 1
        assert "not the control program started (/usr/bin/true)" in capsys.readouterr().err
    finally:
        stop_daemons(node.state_dir)


def test_pid_file_is_read_only_from_a_regular_root_file_no_link_followed(tmp_path):
    from slurm_gpushare.node.mps import PID_FILE, read_pid_file

    (tmp_path / "elsewhere").write_text("123\n")
    (tmp_path / PID_FILE).symlink_to(tmp_path / "elsewhere")
    assert read_pid_file(str(tmp_path)) is None
    (tmp_path / PID_FILE).unlink()
    os.mkfifo(tmp_path / PID_FILE)  # never opened for reading in a way that blocks
    assert read_pid_file(str(tmp_path)) is None
    (tmp_path / PID_FILE).unlink()
    (tmp_path / PID_FILE).write_text("123\n")
    assert read_pid_file(str(tmp_path)) == (123 if os.geteuid() == os.stat(tmp_path / PID_FILE).st_uid else None)


@as_root
def test_a_full_mps_directory_refuses_the_job_not_the_node(tmp_path, monkeypatch):
    """Another job filled ``<state_dir>/mps`` (its tmpfs): the next MPS prolog cannot make its pipe dir. The job
    is refused (its tasks fail with the reason in their output), the node is not drained, and its epilog, with
    no daemon to stop, succeeds; once there is room the next job's daemon starts."""
    from slurm_gpushare.hooks import epilog as epilog_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.hooks import taskprolog as task_hook
    from slurm_gpushare.node import mps as mps_module
    from slurm_gpushare.node.journal import JournalStore
    from tests.unit.hooks_support import stop_daemons

    node = shared_node(tmp_path)
    drains = []

    def scontrol(argv, **_kw):
        from slurm_gpushare.proc import Result

        drains.append(argv)
        return Result(tuple(argv), 0, "", "")

    real_mkdir = os.mkdir

    def full(path, mode=0o777, *a, **kw):
        if str(path).endswith("/pipe"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_mkdir(path, mode, *a, **kw)

    try:
        monkeypatch.setattr(mps_module.os, "mkdir", full)
        assert prolog_hook.main(node.env(94, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
        monkeypatch.undo()
        journal = JournalStore(node.state_dir).read(94)
        assert journal.mps is None and journal.state == "ready"
        import io

        out, err = io.StringIO(), io.StringIO()
        assert task_hook.main(node.env(94, "0", 25, uid=USER), out=out, err=err) == 1
        assert out.getvalue().startswith(
            "print gpushare-task-prolog: job 94 is not run on this node: there was no room"
        )
        assert "export" not in out.getvalue()
        assert epilog_hook.main(node.env(94, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
        assert prolog_hook.main(node.env(95, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
        assert JournalStore(node.state_dir).read(95).mps is not None
        assert epilog_hook.main(node.env(95, "0", 25, uid=USER), runner=scontrol, mps=node.mps) == 0
    finally:
        stop_daemons(node.state_dir)
    assert drains == [] and node.journals() == []


def test_a_node_that_cannot_mount_starts_the_daemon_and_says_so(tmp_path, capsys):
    """No CAP_SYS_ADMIN (mount fails): the daemon still starts, in a key dir on <state_dir>/mps shared with the
    other daemons'; the prolog notes it in slurmd's log and the health check notes it on every run."""
    from slurm_gpushare.hooks import epilog as epilog_hook
    from slurm_gpushare.hooks import prolog as prolog_hook
    from slurm_gpushare.node.health import check_mps
    from slurm_gpushare.node.journal import JournalStore
    from slurm_gpushare.node.mps import MpsControl, answers
    from slurm_gpushare.proc import CommandError, Result, run
    from tests.unit.hooks_support import FAKE_MPS, HookNode, key_dir_mounts, no_scontrol, stop_daemons

    def no_mount(argv, **kw):
        if os.path.basename(argv[0]) == "mount":
            raise CommandError(Result(tuple(argv), 32, "", "mount: permission denied"))
        return run(argv, **kw)

    node = HookNode(tmp_path, "lab-mps01")
    node.mps = MpsControl(no_mount, FAKE_MPS, quit_wait=5)
    try:
        assert prolog_hook.main(node.env(98, "0", 25), runner=no_scontrol, mps=node.mps) == 0
        err = capsys.readouterr().err
        assert "not given its own tmpfs" in err and "permission denied" in err, err
        journals = JournalStore(node.state_dir).all()
        notes = check_mps(journals, answers)
        assert len(notes) == 1 and "has no tmpfs of its own" in notes[0], notes
        assert key_dir_mounts(node.state_dir) == []
        assert epilog_hook.main(node.env(98, "0", 25), runner=no_scontrol, mps=node.mps) == 0
    finally:
        stop_daemons(node.state_dir)
    assert node.journals() == []
