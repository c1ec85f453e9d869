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

Deciding to start or quit a daemon (from the journals and whether it
answers) and doing it happen under ``mps_lock``, one flock per node on
``<state_dir>/mps.lock``: an epilog that found a dead daemon and decided to
quit it must not reach its pipe dir after a prolog of the same key started
a fresh one there. Only hooks of MPS jobs take it.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import GpushareError
from .journal import MpsDaemon

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTROL = ("nvidia-cuda-mps-control",)
_SOCKET_MAX = 100  # sun_path is 108 bytes; leave room


class MpsError(GpushareError):
    """An MPS daemon could not be started, configured or stopped; names its pipe dir."""

    exit_code = 1


def daemon_key(gpu_indexes, uid: int, percentage: int) -> str:
    return "g" + "_".join(map(str, gpu_indexes)) + f"-u{uid}-p{percentage}"


def check_paths(daemon: MpsDaemon) -> str | None:
    """Why the daemon's socket path cannot work (None if it can)."""
    control = f"{daemon.pipe_dir}/control"
    if len(control) > _SOCKET_MAX:
        return f"MPS control socket path {control} is {len(control)} characters; a unix socket allows {_SOCKET_MAX}: shorten cluster.paths.state_dir"
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
    path = Path(lock_path(state_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class MpsControl:
    """The control client for one node. ``command`` is argv before the client's own
    arguments (tests run the docker/fakes script with the interpreter)."""

    def __init__(self, runner, command: tuple[str, ...] = CONTROL, timeout: float = 15.0, quit_wait: float = 10.0,
                 sleep=time.sleep, clock=time.monotonic):
        self.runner, self.command, self.timeout, self.quit_wait = runner, tuple(command), timeout, quit_wait
        self._sleep, self._clock = sleep, clock

    def env(self, daemon: MpsDaemon) -> dict[str, str]:
        return {"PATH": SAFE_PATH, "CUDA_VISIBLE_DEVICES": ",".join(daemon.gpu_uuids),
                "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir}

    def send(self, daemon: MpsDaemon, *lines: str, check: bool = True):
        return self.runner(list(self.command), input="".join(f"{line}\n" for line in lines), env=self.env(daemon),
                           timeout=self.timeout, check=check)

    def alive(self, daemon: MpsDaemon) -> bool:
        """Does a daemon accept connections on the pipe dir's control socket? (No process spawned.)"""
        return answers(daemon.pipe_dir)

    def prepare_dirs(self, daemon: MpsDaemon) -> None:
        """A fresh pipe dir owned by the job's user, mode 0700; a root-owned log dir (0755),
        so the root daemon never writes through a link the user planted."""
        pipe, log = Path(daemon.pipe_dir), Path(daemon.log_dir)
        for parent in (pipe.parent, log):
            parent.mkdir(parents=True, exist_ok=True)
            os.chmod(parent, 0o755)
        if pipe.exists() or pipe.is_symlink():
            kill_leftovers(daemon.pipe_dir)  # a dead or hung daemon of this key, and the servers it left
            _remove(pipe)
        pipe.mkdir(mode=0o700)
        os.chown(pipe, daemon.uid, daemon.gid)
        os.chmod(pipe, 0o700)

    def start(self, daemon: MpsDaemon) -> None:
        """Start the daemon, set its defaults to the job's limits, start the user's server."""
        try:
            self.runner([*self.command, "-d"], env=self.env(daemon), timeout=self.timeout)
            # one client session (commands on stdin, one per line, run in order): the defaults bind the next
            # server only, so they come before start_server; one client start fewer per new daemon. A non-zero
            # exit still fails the prolog, whose rollback quits the daemon and any server it started
            lines = [f"set_default_active_thread_percentage {daemon.percentage}"]
            lines += [f"set_default_device_pinned_mem_limit {i} {mib}M" for i, mib in enumerate(daemon.mem_limit_mib)]
            self.send(daemon, *lines, f"start_server -uid {daemon.uid}")
        except GpushareError as exc:
            raise MpsError(f"MPS daemon {daemon.key} (pipe {daemon.pipe_dir}): could not start") from exc

    def quit(self, daemon: MpsDaemon) -> None:
        """``quit`` (stops its servers too), then wait until nothing answers on the socket."""
        if self.alive(daemon):
            self.send(daemon, "quit", check=False)
            deadline, pause = self._clock() + self.quit_wait, 0.001
            while self.alive(daemon):
                if self._clock() > deadline:
                    raise MpsError(f"MPS control daemon {daemon.key} (pipe {daemon.pipe_dir}) will not quit "
                                   f"within {self.quit_wait:g} s")
                self._sleep(pause)
                pause = min(pause * 2, 0.1)  # a daemon usually goes within ms: no fixed 100 ms on every epilog
        else:
            kill_leftovers(daemon.pipe_dir)  # it died (OOM killer, SIGKILL): its servers may outlive it
        remove_pipe_dir(daemon)


MPS_COMM = "nvidia-cuda-mps"  # the kernel's 15-character comm of nvidia-cuda-mps-control and -server alike


def mps_processes(proc: str = "/proc") -> dict[int, str]:
    """pid -> CUDA_MPS_PIPE_DIRECTORY of every process named nvidia-cuda-mps* that has one in its environment
    (a daemon's servers inherit its environment; reading another user's needs root, as the hooks are)."""
    want = b"CUDA_MPS_PIPE_DIRECTORY="
    found = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/comm", "rb") as fh:
                if fh.read().strip() != MPS_COMM.encode():
                    continue
            with open(f"{entry.path}/environ", "rb") as fh:
                for var in fh.read().split(b"\0"):
                    if var.startswith(want):
                        found[int(entry.name)] = var[len(want):].decode("utf-8", "replace")
                        break
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def leftover_processes(pipe_dir: str, proc: str = "/proc") -> list[int]:
    """MPS control daemons and servers of ``pipe_dir`` (mps_processes). Called only for a key whose daemon does
    not answer, so whatever is found there is what it left."""
    return sorted(pid for pid, pipe in mps_processes(proc).items() if pipe == pipe_dir)


def kill_leftovers(pipe_dir: str, wait: float = 2.0) -> list[int]:
    """SIGKILL what a dead or hung daemon of ``pipe_dir`` left (leftover_processes); wait until they are gone."""
    return kill_scanned(lambda: leftover_processes(pipe_dir), wait)


def kill_scanned(scan, wait: float = 2.0) -> list[int]:
    """SIGKILL the pids ``scan()`` names, scan again (up to three times), wait until they are gone."""
    import signal

    pids: list[int] = []
    deadline = time.monotonic() + wait
    # scan again after each kill: a hung daemon may have forked a server between the scan and its SIGKILL
    for _scan in range(3):
        new = [pid for pid in scan() if pid not in pids]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pids += new
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
    return pids


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def answers(pipe_dir: str) -> bool:
    """Does a daemon accept connections on ``pipe_dir``'s control socket? (No process spawned.)"""
    path = f"{pipe_dir}/control"
    if not os.path.exists(path):
        return False
    # the C socket type itself: the socket module's Python layer (its enums, selectors) would cost each MPS
    # hook a few ms of start-up (bench/node_hooks.py) for a connect and a close
    import _socket

    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def running_daemons(state_dir: str) -> int:
    """MPS daemons under ``<state_dir>/mps`` whose control socket answers (orphans included)."""
    root = Path(state_dir) / "mps"
    try:
        keys = sorted(p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return 0
    return sum(answers(str(key / "pipe")) for key in keys)


def remove_pipe_dir(daemon: MpsDaemon) -> None:
    """The pipe dir and its parent key dir (the log dir stays: logs are not state)."""
    pipe = Path(daemon.pipe_dir)
    if pipe.exists() or pipe.is_symlink():
        _remove(pipe)
    try:
        pipe.parent.rmdir()
    except OSError:
        pass


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    try:
        # the usual case: a daemon that quit removed its socket, so the directory is empty. rmdir never follows
        # a link (one planted meanwhile fails it with ENOTDIR) and removes only an empty directory
        os.rmdir(path)
        return
    except OSError:
        pass
    import shutil  # here: only a tree pays for shutil (+7 M instructions), whose removal goes by descriptor

    shutil.rmtree(path)
