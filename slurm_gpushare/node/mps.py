"""MPS control daemons for jobs: start, configure, probe, quit (legacy v2 interface).

Every command goes through the runner, never a shell, with an environment
built here (slurmd gives hooks no PATH): the daemon's GPUs as UUIDs in
CUDA_VISIBLE_DEVICES (indices are remapped under MPS), its pipe and log
directories. Commands are written to the control client's stdin, as NVIDIA
documents (``echo quit | nvidia-cuda-mps-control``), one per line.

One daemon serves one GPU set for one user at one thread percentage (the
``MpsDaemon`` key): its *default* active thread percentage and pinned memory
limit are set before its server starts, so they bind every client of that
server and are enforced by the server, not by variables the job could unset.
Jobs that agree on all three share the daemon; the journals count them.

Root never acts on a daemon through a name the job's user can write
(docs/admins/mps-security.md). Per key, under ``<state_dir>/mps`` (root, 0711:
no user can list the keys)::

    <key>/            root 0711, the daemon's own size-capped tmpfs (``PIPE_TMPFS``,
                      mounted by the prolog that starts it, detached when it
                      quits): a job's user can fill their own daemon's, never
                      the one another user's daemon starts in
    <key>/pipe/       the daemon's CUDA_MPS_PIPE_DIRECTORY: root 0700 while the
                      daemon starts, then the job user's (0700)
    <key>/root/       root 0700: hard links to what the daemon created in its
                      pipe dir at start (its control socket), made while only
                      root could write there; root's own client sessions
                      (configure, start_server, quit) connect through these
    <key>/daemon.json root 0600: the daemon's pid, start time and executable,
                      taken from the control socket's peer credentials, the
                      pid file it writes there and the program root started
    .aside/           root 0700: key dirs taken out of the way in one rename
                      (``node/aside.py``), removed after the locks are released

``<state_dir>/mps`` holds everything a job's user can write (its pipe dir):
a size-capped tmpfs mounted there keeps a job from filling the filesystem of
the journals (docs/reference/node-files.md); the health check notes a node
without one. Each key dir is a tmpfs of its own within it, so one user
cannot fill it for the others. Nothing the user wrote is walked under the
locks: a key dir's tmpfs is detached (``umount --lazy``) when its daemon
quits; a key dir that is no mount of its own (a node that cannot mount) is
renamed into ``.aside`` in one step and removed, within a budget, by the
epilog after its locks or by the health check.

A daemon is stopped by that pid (a pidfd, after checking the start time and
executable), never through ``pipe/control``; a probe connects only to a
socket it ``lstat``ed as a socket owned by root (no link followed), with a
short timeout, and checks the peer is the recorded daemon.

Deciding to start or quit a daemon (from the journals and whether it
answers) and doing it happen under ``mps_lock``, one flock per node on
``<state_dir>/mps.lock``: an epilog that found a dead daemon and decided to
quit it must not reach its pipe dir after a prolog of the same key started
a fresh one there. Only hooks of MPS jobs take it.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
from contextlib import contextmanager

from ..atomic import entry_problem
from ..errors import GpushareError
from .journal import MpsDaemon
from .procscan import SEARCH_PATH as SAFE_PATH  # the fixed PATH the daemon runs with and its program is found on
from .procscan import kill_leftovers, process_record, same_process
from .procscan import running as _running
from .procscan import state as _state

TYPE_CHECKING = False  # for type checkers only

CONTROL = ("nvidia-cuda-mps-control",)
_SOCKET_MAX = 100  # sun_path is 108 bytes; leave room
CONNECT_TIMEOUT = 0.25  # a probe's connect: a daemon that answers does so within ms
RECORD, ALIAS = "daemon.json", "root"
# Each key dir is its own size-capped tmpfs (``MpsControl.cap``): what a job's user writes in its pipe dir fills
# that daemon's tmpfs only, never the directory other users' daemons start in. A few files per daemon and client
# are all MPS writes there; the memory a user's writes take is charged to the writing job's memory cgroup.
PIPE_TMPFS = "size=16m,nr_inodes=4096,mode=0711,uid=0,gid=0,nosuid,nodev,noexec"
TMPFS_SOURCE = "gpushare-mps"  # the mount's source in /proc/mounts: the health check and tests know ours by it
KEY = re.compile(r"^g[0-9]+(_[0-9]+)*-u[0-9]+-p[0-9]+$")  # daemon_key's names (not .aside)


class MpsError(GpushareError):
    """An MPS daemon could not be started, configured or stopped; names its pipe dir."""

    exit_code = 1


def daemon_key(gpu_indexes, uid: int, percentage: int) -> str:
    return "g" + "_".join(map(str, gpu_indexes)) + f"-u{uid}-p{percentage}"


def check_paths(daemon: MpsDaemon) -> str | None:
    """Why the daemon's socket path cannot work (None if it can)."""
    control = f"{daemon.pipe_dir}/control"
    if len(control) > _SOCKET_MAX:
        return (
            f"MPS control socket path {control} is {len(control)} characters; a unix socket allows {_SOCKET_MAX}: "
            "shorten cluster.paths.state_dir"
        )
    return None


def lock_path(state_dir: str) -> str:
    return str(state_dir).rstrip("/") + "/mps.lock"


@contextmanager
def mps_lock(state_dir: str, needed: bool = True):
    """Hold the node's MPS lock (flock of ``<state_dir>/mps.lock``) around a decision
    about daemons and its action; ``needed=False`` costs nothing (a job without MPS)."""
    if not needed:
        yield
        return
    path = lock_path(state_dir)  # str paths in this module: pathlib costs every node hook ~17 M instructions
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class MpsControl:
    """The control client for one node. ``command`` is argv before the client's own
    arguments (tests run the docker/fakes script with the interpreter)."""

    def __init__(
        self,
        runner,
        command: tuple[str, ...] = CONTROL,
        timeout: float = 15.0,
        quit_wait: float = 10.0,
        sleep=time.sleep,
        clock=time.monotonic,
        quit_timeout: float = 5.0,
        start_wait: float = 10.0,
        cap: str | None = PIPE_TMPFS,
    ):
        self.runner, self.command, self.timeout, self.quit_wait = runner, tuple(command), timeout, quit_wait
        self.cap = cap  # the tmpfs options of each key dir's own mount; None: the key dirs share <state_dir>/mps
        self.quit_timeout, self.start_wait = quit_timeout, start_wait
        self._sleep, self._clock = sleep, clock
        self.notes: list[str] = []  # what a quit could not clean up (never a failure): the caller reports them

    def env(self, daemon: MpsDaemon, pipe: str | None = None) -> dict[str, str]:
        return {
            "PATH": SAFE_PATH,
            "CUDA_VISIBLE_DEVICES": ",".join(daemon.gpu_uuids),
            "CUDA_MPS_PIPE_DIRECTORY": pipe or daemon.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir,
        }

    def send(self, daemon: MpsDaemon, *lines: str, check: bool = True):
        """One client session, through the root-only alias of the daemon's pipe dir (``<key>/root``); a
        ``quit`` waits at most ``quit_timeout`` (a daemon that never answers is then stopped by its pid)."""
        timeout = self.quit_timeout if lines == ("quit",) else self.timeout
        return self.runner(
            list(self.command),
            input="".join(f"{line}\n" for line in lines),
            env=self.env(daemon, alias_dir(daemon.pipe_dir)),
            timeout=timeout,
            check=check,
        )

    def alive(self, daemon: MpsDaemon) -> bool:
        """Is the daemon recorded for this key running and answering on its socket? (No process spawned.)"""
        return answers(daemon.pipe_dir)

    def prepare_dirs(self, daemon: MpsDaemon) -> None:
        """A fresh pipe dir owned by root (0700) until the daemon is up (``start`` hands it to the job's user);
        root-only state and log dirs, so the root daemon never writes through a link a user planted."""
        key = os.path.dirname(daemon.pipe_dir)
        _own_dir(os.path.dirname(key), 0o711)  # <state_dir>/mps: traversable, not listable
        _own_aside(os.path.dirname(key))  # made before any job of the key can fill the filesystem
        _own_dir(key, 0o711)
        if daemon.log_dir:
            _own_dir(os.path.dirname(daemon.log_dir), 0o700)
            _own_dir(daemon.log_dir, 0o700)
        if any(os.path.lexists(p) for p in (daemon.pipe_dir, alias_dir(daemon.pipe_dir), record_path(daemon.pipe_dir))):
            stop_recorded(daemon.pipe_dir)  # a dead or hung daemon of this key ...
            kill_leftovers(daemon.pipe_dir)  # ... and the servers it left
            notes = self.remove_key(daemon)
            if notes:
                raise MpsError(f"MPS daemon {daemon.key}: the previous daemon's directories are in the way: {notes[0]}")
            _own_dir(key, 0o711)
        self.mount_key(key)
        os.mkdir(daemon.pipe_dir, 0o700)
        _set_owner(daemon.pipe_dir, os.geteuid(), os.getegid())

    def start(self, daemon: MpsDaemon) -> None:
        """Start the daemon (pipe dir still root's), record it, hand the pipe dir to the job's user, then set
        its defaults to the job's limits and start the user's server."""
        try:
            self.runner([*self.command, "-d"], env=self.env(daemon), timeout=self.timeout)
            adopt(daemon.pipe_dir, command_executables(self.command), self.start_wait, self._sleep, self._clock)
            _set_owner(daemon.pipe_dir, daemon.uid, daemon.gid)
            # one client session (commands on stdin, one per line, run in order): the defaults bind the next
            # server only, so they come before start_server; one client start fewer per new daemon. A non-zero
            # exit still fails the prolog, whose rollback quits the daemon and any server it started
            lines = [f"set_default_active_thread_percentage {daemon.percentage}"]
            lines += [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in enumerate(daemon.mem_limit_mib)]
            self.send(daemon, *lines, f"start_server -uid {daemon.uid}")
        except GpushareError as exc:
            raise MpsError(f"MPS daemon {daemon.key} (pipe {daemon.pipe_dir}): could not start") from exc

    def quit(self, daemon: MpsDaemon) -> None:
        """``quit`` through the root-only alias (stops its servers too); a daemon still there after ``quit_wait``
        is SIGKILLed by its recorded pid, with its servers. A pipe dir without a record (a daemon started before
        records were kept) is taken back from the user first, so its ``control`` is root's to trust."""
        record = read_record(daemon.pipe_dir)
        if os.path.isdir(daemon.pipe_dir) and not os.path.islink(daemon.pipe_dir):
            _set_owner(daemon.pipe_dir, os.geteuid(), os.getegid())  # nothing in it changes under us any more
        if record is None:
            self._quit_unrecorded(daemon)
        else:
            self._quit_recorded(daemon, record)
        self.notes += self.remove_key(daemon)

    def mount_key(self, key: str) -> None:
        """Mount the key dir's own size-capped tmpfs (``cap``) on ``key`` (empty, root's), unless it is one
        already. Where the node cannot mount (no CAP_SYS_ADMIN, no ``mount`` on the hooks' PATH) the key dir
        stays on ``<state_dir>/mps``, shared with the other daemons' as before, and a note says so."""
        if self.cap is None or is_mount(key):
            return
        mount = _which("mount", SAFE_PATH)
        problem = "no mount program on " + SAFE_PATH if mount is None else None
        if mount is not None:
            argv = [mount, "-t", "tmpfs", "-o", self.cap, TMPFS_SOURCE, key]
            try:
                self.runner(argv, env={"PATH": SAFE_PATH}, timeout=self.timeout)
            except GpushareError as exc:
                problem = str(exc)[-200:]  # the end: what mount said
        if problem is not None:
            self.notes.append(
                f"{key}: not given its own tmpfs ({problem}): this daemon's pipe dir shares "
                f"{os.path.dirname(key)} with the other daemons', so its user's writes can fill it for them"
            )

    def remove_key(self, daemon: MpsDaemon) -> list[str]:
        """The daemon's key dir gone: its own tmpfs detached (``umount --lazy``: whatever the job's user left in
        it goes with the mount, nothing of it walked), then the empty mount point removed; a key dir that is no
        mount of its own is set aside (``remove_pipe_dir``). Returns notes, as ``remove_pipe_dir``."""
        key = os.path.dirname(daemon.pipe_dir)
        if os.path.lexists(key) and is_mount(key):
            umount = _which("umount", SAFE_PATH)
            if umount is None:
                return [f"MPS daemon {daemon.key}: {key} not unmounted: no umount program on {SAFE_PATH}"]
            try:
                self.runner([umount, "--lazy", key], env={"PATH": SAFE_PATH}, timeout=self.timeout)
            except GpushareError as exc:
                return [f"MPS daemon {daemon.key}: {key} not unmounted: {str(exc)[:200]}"]
            try:
                os.rmdir(key)
                return []
            except OSError:
                pass  # not empty on the parent's filesystem (written there before a mount): set aside below
        return remove_pipe_dir(daemon)

    def _quit_recorded(self, daemon: MpsDaemon, record: dict) -> None:
        handle = ProcessHandle.open(record)
        if handle is None:  # it died (OOM killer, SIGKILL): its servers may outlive it
            kill_leftovers(daemon.pipe_dir)
            return
        with handle:
            try:
                self.send(daemon, "quit", check=False)
            except GpushareError:
                pass  # it did not answer in time: stopped by its pid below
            if not handle.wait(self.quit_wait):
                handle.kill()
                if not handle.wait(2.0):
                    raise MpsError(
                        f"MPS control daemon {daemon.key} (pipe {daemon.pipe_dir}, pid {handle.pid}) survived SIGKILL"
                    )
        kill_leftovers(daemon.pipe_dir)  # servers of a daemon that was killed

    def _quit_unrecorded(self, daemon: MpsDaemon) -> None:
        if not answers(daemon.pipe_dir):
            kill_leftovers(daemon.pipe_dir)
            return
        self.runner(list(self.command), input="quit\n", env=self.env(daemon), timeout=self.quit_timeout, check=False)
        deadline, pause = self._clock() + self.quit_wait, 0.001
        while answers(daemon.pipe_dir):
            if self._clock() > deadline:
                raise MpsError(
                    f"MPS control daemon {daemon.key} (pipe {daemon.pipe_dir}) will not quit "
                    f"within {self.quit_wait:g} s"
                )
            self._sleep(pause)
            pause = min(pause * 2, 0.1)


# ---- what root trusts: its own directories, the recorded daemon, root-owned sockets ------------------------


def alias_dir(pipe_dir: str) -> str:
    return os.path.join(os.path.dirname(pipe_dir), ALIAS)


def record_path(pipe_dir: str) -> str:
    return os.path.join(os.path.dirname(pipe_dir), RECORD)


def _own_dir(path: str, mode: int) -> None:
    """``path`` as a directory of ours (the hooks' user, root) with ``mode``; refused if it is a link or
    another user's (the mode is set on the open directory, never through a name)."""
    os.makedirs(path, mode=mode, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise MpsError(
                f"{path} belongs to uid {st.st_uid}, not to root: remove it (MPS state and log "
                "directories must be root's)"
            )
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _set_owner(path: str, uid: int, gid: int, mode: int = 0o700) -> None:
    """chown and chmod the directory ``path`` through a descriptor opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def socket_problem(path: str) -> str | None:
    """Why root must not connect to ``path`` (None: a socket owned by root, not a link)."""
    return entry_problem(path, "socket", os.geteuid())


def peer(path: str) -> tuple[int, int] | None:
    """(pid, uid) of the process listening on the socket ``path``, from the connection's SO_PEERCRED; None when
    ``path`` is not a root-owned socket (``socket_problem``) or nothing accepts it within CONNECT_TIMEOUT."""
    if socket_problem(path) is not None:
        return None
    # the C socket type itself: the socket module's Python layer (its enums, selectors) would cost each MPS
    # hook a few ms of start-up (bench/node_hooks.py) for a connect and a close
    import _socket

    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    probe.settimeout(CONNECT_TIMEOUT)  # non-blocking: a full backlog fails at once (EAGAIN), never stalls
    try:
        probe.connect(path)
        creds = probe.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    except OSError:
        return None
    finally:
        probe.close()
    return int.from_bytes(creds[0:4], "little", signed=True), int.from_bytes(creds[4:8], "little")


PID_FILE = (
    "nvidia-cuda-mps-control.pid"  # what the daemon writes in its pipe dir at start (docs/admins/mps-security.md)
)


def adopt(
    pipe_dir: str, executables: frozenset[str] = frozenset(), wait: float = 10.0, sleep=time.sleep, clock=time.monotonic
) -> dict:
    """After ``-d``, while the pipe dir is root's: wait (at most ``wait`` s) until the daemon's start-up is done:
    a root process listens on ``control`` and its pid file names that process; check it runs one of
    ``executables`` (``command_executables``: the program root started; empty: any); link what root created in
    the pipe dir into the root-only alias dir and write its record. MpsError naming what is missing."""
    deadline, pause = clock() + wait, 0.001
    while True:
        found, named = peer(f"{pipe_dir}/control"), read_pid_file(pipe_dir)
        if found is not None and found[1] == os.geteuid() and named == found[0]:
            break
        if clock() > deadline:
            why = socket_problem(f"{pipe_dir}/control") or (
                "connect failed"
                if found is None
                else f"its peer is pid {found[0]} (uid {found[1]}), its pid file {pipe_dir}/{PID_FILE} names {named}"
            )
            raise MpsError(
                f"MPS daemon (pipe {pipe_dir}): not up {wait:g} s after start: no root daemon listening on "
                f"{pipe_dir}/control that its pid file names ({why})"
            )
        sleep(pause)
        pause = min(pause * 2, 0.05)
    record = process_record(found[0])
    if record is None:
        raise MpsError(f"MPS daemon (pipe {pipe_dir}): its process {found[0]} is gone")
    if executables and record["exe"] not in executables:
        raise MpsError(
            f"MPS daemon (pipe {pipe_dir}): process {found[0]} runs {record['exe']}, not the control "
            f"program started ({', '.join(sorted(executables))})"
        )
    _link_alias(pipe_dir)
    import json

    from ..atomic import atomic_write

    atomic_write(record_path(pipe_dir), json.dumps(record, sort_keys=True), 0o600)
    return record


def _link_alias(pipe_dir: str) -> None:
    alias = alias_dir(pipe_dir)
    os.mkdir(alias, 0o700)
    for entry in os.scandir(pipe_dir):
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid():
                os.link(entry.path, os.path.join(alias, entry.name), follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone between the listing and the link (a temporary the daemon renamed): nothing to keep


def read_pid_file(pipe_dir: str) -> int | None:
    """The pid in the daemon's pid file: a regular file owned by root, no link followed; None otherwise."""
    try:
        fd = os.open(f"{pipe_dir}/{PID_FILE}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        text = os.read(fd, 32)
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.strip().isdigit() else None


def command_executables(command: tuple[str, ...], path: str = SAFE_PATH) -> frozenset[str]:
    """What the kernel runs for ``command``: its first word found in ``path`` (as the runner finds it), links
    resolved; for a script, its interpreter too (``#!/usr/bin/env [-S] NAME`` found in ``path``). Empty when the
    program cannot be found (then the daemon's executable is not checked; its start fails anyway)."""
    program = _which(command[0], path)
    if program is None:
        return frozenset()
    found = {os.path.realpath(program)}
    try:
        with open(program, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return frozenset(found)
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
        if words and os.path.basename(words[0]) == "env":
            words = [w for w in words[1:] if not w.startswith("-")]
        interpreter = _which(words[0], path) if words else None
        if interpreter is not None:
            found.add(os.path.realpath(interpreter))
    return frozenset(found)


def _which(name: str, path: str) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) else None
    for folder in path.split(":"):
        candidate = f"{folder}/{name}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def read_record(pipe_dir: str) -> dict | None:
    import json

    try:
        with open(record_path(pipe_dir), encoding="utf-8") as fh:
            data = json.load(fh)
        return {"pid": int(data["pid"]), "start": int(data["start"]), "exe": str(data["exe"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none (a daemon started before records were kept), or unreadable: not trusted


class ProcessHandle:
    """A recorded process pinned by a pidfd (where the kernel has them) once its identity is checked:
    signals go to that process even if its pid is reused meanwhile."""

    def __init__(self, pid: int, fd: int | None):
        self.pid, self.fd = pid, fd

    @classmethod
    def open(cls, record: dict) -> ProcessHandle | None:
        fd = None
        try:
            fd = os.pidfd_open(record["pid"])
        except ProcessLookupError:
            return None
        except (AttributeError, OSError):  # no pidfds here (Python or kernel): the identity check alone
            fd = None
        if not same_process(record):  # checked after the pidfd is open: it names this very process
            if fd is not None:
                os.close(fd)
            return None
        return cls(record["pid"], fd)

    def kill(self) -> None:
        if TYPE_CHECKING:
            import signal as _signal  # the same names, typed: the C module publishes no type information
        else:
            import _signal  # the C module: signal's Python layer builds its enums

        try:
            if self.fd is not None:
                _signal.pidfd_send_signal(self.fd, _signal.SIGKILL)
            else:
                os.kill(self.pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> bool:
        """Has it exited (a zombie counts) within ``timeout`` seconds?"""
        deadline, pause = time.monotonic() + timeout, 0.0005
        while _running(self.pid):
            if time.monotonic() > deadline:
                return False
            if self.fd is not None:
                import select

                select.select([self.fd], [], [], max(0.0, min(deadline - time.monotonic(), 0.05)))
            else:
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def stop_recorded(pipe_dir: str) -> bool:
    """SIGKILL the daemon recorded for ``pipe_dir`` if it is still that process; did one go?"""
    record = read_record(pipe_dir)
    handle = None if record is None else ProcessHandle.open(record)
    if handle is None:
        return False
    with handle:
        handle.kill()
        return handle.wait(2.0)


def answers(pipe_dir: str) -> bool:
    """Does the daemon of ``pipe_dir`` answer? With a record (``adopt``): the recorded process is still that
    process and listens on the root-only alias of its control socket. Without one (a daemon started before
    records were kept): ``pipe_dir/control`` is a root-owned socket (no link followed) whose listener is root.
    No process spawned; a socket that never accepts costs at most CONNECT_TIMEOUT."""
    record = read_record(pipe_dir)
    if record is not None:
        if not same_process(record) or _state(record["pid"]) in ("T", "t"):  # stopped: answers nobody
            return False
        found = peer(f"{alias_dir(pipe_dir)}/control")
        return found is not None and found[0] == record["pid"]
    found = peer(f"{pipe_dir}/control")
    return found is not None and found[1] == os.geteuid()


def running_daemons(state_dir: str) -> int:
    """MPS daemons under ``<state_dir>/mps`` whose control socket answers (orphans included)."""
    from pathlib import Path  # reconcile and health only

    root = Path(state_dir) / "mps"
    try:
        keys = sorted(p for p in root.iterdir() if KEY.match(p.name))
    except OSError:  # none yet, or unreadable: no daemon of ours to count
        return 0
    return sum(answers(str(key / "pipe")) for key in keys)


def is_mount(path: str) -> bool:
    """Is the directory ``path`` (no link followed) the root of a filesystem other than its parent's? False when
    it is missing."""
    try:
        return os.lstat(path).st_dev != os.lstat(os.path.dirname(path.rstrip("/")) or "/").st_dev
    except OSError:
        return False


def remove_pipe_dir(daemon: MpsDaemon) -> list[str]:
    """Take the daemon's key dir (the pipe dir, the root-only alias and the record) out of the way in one rename
    into ``<state_dir>/mps/.aside`` (``aside.set_aside``); the log dir stays (logs are not state). Nothing the
    job's user wrote in its pipe dir is walked here, under the node's locks: ``aside.sweep`` removes it later
    (the epilog once its locks are released, the health check). Returns notes: a key dir that could not be
    moved stays where it is (a later reconcile or health run, or the key's next prolog, tries again)."""
    from .aside import set_aside

    key = os.path.dirname(daemon.pipe_dir)
    if not os.path.lexists(key):
        return []
    try:
        set_aside(key, os.path.dirname(key))
    except OSError as exc:
        return [f"MPS daemon {daemon.key}: {key} not set aside for removal: {exc}"]
    return []


def _own_aside(root: str) -> None:
    from .aside import ensure_aside

    try:
        os.close(ensure_aside(root))
    except OSError as exc:
        raise MpsError(f"{root}/.aside: {exc}") from None
