"""Root's reads of other users' processes under /proc, and its signals to a pid it read earlier.

A root hook looks at other processes to find what an MPS daemon left (its
servers, by the pipe dir in their environment) and which jobs have a batch
slurmstepd (the health check's lost launches). Any user's process can be
among them, so what is read, and how, is chosen so that no process can make
the read hang, lie to it, or turn a signal onto another process:

- **Memory is read only of trusted owners.** ``cmdline`` and ``environ`` are
  read out of the process's memory (the kernel takes its mm lock and faults
  its pages in), and a process can make such a read wait as long as it likes
  (memory mapped from a FUSE file its user serves, a userfaultfd region, a
  writer that holds the lock). ``stat``, ``status``, ``comm`` and the ``exe``
  link are the kernel's bookkeeping, not the process's memory: they are read
  first, and memory only of a process whose real, effective, saved and
  filesystem uids (``status``) are all root's or the one user a caller names
  (the MPS daemon's user). The owner of the ``/proc/PID`` files is not used:
  the kernel shows root as the owner of every file of a non-dumpable process,
  which any process can become (``prctl(PR_SET_DUMPABLE, 0)``).
- **Identity by executable, not by title.** A process takes any title
  (argv, ``prctl(PR_SET_NAME)``); its ``exe`` link is the file the kernel
  executed. slurmstepd is a root process whose ``exe`` is the real
  slurmstepd; an MPS server is found by name only among processes of its
  daemon's user and root, or by the real ``nvidia-cuda-mps-server``.
- **The scan runs in a forked child with a hard deadline** (``in_child``).
  Owner and executable keep a user's own processes out, but a trusted
  process can still stall (a daemon stopped in the kernel, a server its user
  attached to with ptrace), and callers hold the node's journal and MPS locks
  while they scan. Not a thread: procfs ignores ``O_NONBLOCK``, a thread
  blocked in such a read cannot be cancelled, and a process whose thread
  sleeps in the kernel cannot even exit. Not the runner (``proc.py``): it
  execs a program (an interpreter start, tens of ms, on every MPS epilog)
  and, after a timeout, waits for the child's pipes to close, which a child
  held in the kernel never does. A forked child costs about a millisecond,
  keeps nothing of the hook's but one pipe (every other descriptor is closed
  first: an inherited lock descriptor would keep the node's flock held after
  the hook let go), writes each find as one line as soon as it has it, and
  is SIGKILLed at the deadline; the hook goes on with the lines it got and
  never waits for a child the kernel holds (init reaps it once the hook
  has exited).
- **A pid read earlier is signalled through a pidfd** (``signal_checked``):
  the pidfd is opened first, then the identity is checked (start time, /proc
  PID/stat field 22, and executable, as recorded when the pid was read), then
  the signal goes through the pidfd, which names that very process even if
  the pid is reused meanwhile. Without pidfds (Linux before 5.3, or a seccomp
  filter that refuses them) the same check runs just before ``os.kill``; a pid
  reused in the microseconds between the two is the window left there.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # for type checkers only

SCAN_TIMEOUT = 2.0  # a scan of a few thousand processes takes tens of ms; past this one has stalled
MPS_COMM = b"nvidia-cuda-mps"  # the kernel's 15-character comm of nvidia-cuda-mps-control and -server alike
MPS_SERVER = "nvidia-cuda-mps-server"
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # also mps.SAFE_PATH, the daemon's PATH
_PIPE_VAR = b"CUDA_MPS_PIPE_DIRECTORY="
_DONE = b"."  # a scan child's last line: what it sent is all there is


# ---- the kernel's bookkeeping of one process: never its memory -------------------------------------------


def _stat_fields(pid: int, proc: str) -> list[bytes] | None:
    """/proc/PID/stat after the comm (its field 3 first), or None if gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_record(pid: int, proc: str = "/proc") -> dict | None:
    """{pid, start (clock ticks after boot, /proc/PID/stat field 22), exe} of a live process; None if gone.

    ``exe`` is None where the kernel will not show it: another user's process that is not dumpable (one that
    changed its uid, as an MPS server does) when this root lacks CAP_SYS_PTRACE (a container's root, a
    hardened unit). The pid and start time still name the process: a reused pid starts later."""
    fields = _stat_fields(pid, proc)
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except PermissionError:
        exe = None
    except OSError:
        return None
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return {"pid": pid, "start": int(fields[19]), "exe": exe}


def same_process(record: dict, proc: str = "/proc") -> bool:
    """Is the recorded process still the one running under its pid (same start time and executable)?"""
    found = process_record(record["pid"], proc)
    return found is not None and (found["pid"], found["start"], found["exe"]) == (
        record["pid"],
        record["start"],
        record["exe"],
    )


def state(pid: int, proc: str = "/proc") -> str:
    """The process state letter of /proc/PID/stat ('' if gone)."""
    fields = _stat_fields(pid, proc)
    return fields[0].decode() if fields else ""


def running(pid: int, proc: str = "/proc") -> bool:
    return state(pid, proc) not in ("Z", "X", "")


def owner(pid: int | str, proc: str = "/proc") -> int | None:
    """The uid a process runs as, when its real, effective, saved and filesystem uids (the ``Uid:`` line of
    /proc/PID/status) are all that one; None when they differ (a setuid program) or it is gone."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as fh:
            for line in fh.read().split(b"\n"):
                if line.startswith(b"Uid:"):
                    uids = set(line.split()[1:5])
                    return int(uids.pop()) if len(uids) == 1 else None
    except (OSError, ValueError):
        pass
    return None


def executable(pid: int | str, proc: str = "/proc") -> str | None:
    """The file the process executed (its ``exe`` link, without the kernel's `` (deleted)`` for a file
    removed or replaced since, e.g. by an upgrade), or None (gone, or a kernel thread)."""
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        return None
    return exe[: -len(" (deleted)")] if exe.endswith(" (deleted)") else exe


def executable_paths(name: str, search: str = SEARCH_PATH) -> tuple[str, ...]:
    """The real paths (links resolved, as ``exe`` shows them) of the files called ``name`` on ``search``."""
    found = []
    for folder in search.split(":"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            real = os.path.realpath(path)
            if real not in found:
                found.append(real)
    return tuple(found)


def _pids(proc: str):
    with os.scandir(proc) as listing:
        return [entry.name for entry in listing if entry.name.isdigit()]


# ---- a scan in a forked child with a deadline ----------------------------------------------------------


def in_child(work, timeout: float = SCAN_TIMEOUT) -> tuple[list[bytearray], bool]:
    """Run ``work(emit)`` in a forked child; ``emit(line)`` sends one line (bytes, no newline) back at once.
    Returns the lines the child sent and whether ``work`` returned within ``timeout`` seconds. A child past
    the deadline is SIGKILLed and left: its lines so far are returned, complete False. A fork the kernel
    refuses (no memory, the pid limit) is a scan that saw nothing: ``([], False)``."""
    import fcntl  # here, before the fork: the child imports nothing
    import select

    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return [], False
    if pid == 0:
        _child(work, r, w, fcntl)
    os.close(w)
    data, ended = bytearray(), False
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(r, select.POLLIN)
    try:
        while not ended:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                break
            chunk = os.read(r, 65536)
            data += chunk
            ended = not chunk
    finally:
        os.close(r)
    lines = data.split(b"\n")[:-1]  # a line cut short by the kill is not a line
    done = lines[-1:] == [_DONE]  # its last line, written once ``work`` returned
    if not ended:
        os.kill(pid, 9)  # our own child, not yet reaped: its pid cannot have been given to another process
    _reap_soon(pid)
    return (lines[:-1] if done else lines), done


def _reap_soon(pid: int, within: float = 0.1) -> None:
    """Reap a child that exits within ``within`` seconds; one the kernel holds longer (SIGKILLed asleep in a
    read that ignores signals until it returns) is left, and init reaps it once this process has exited."""
    deadline, pause = time.monotonic() + within, 0.0005
    try:
        while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
    except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
        pass


def _child(work, r: int, w: int, fcntl) -> None:
    """The forked child: nothing of the hook's kept but the pipe's write end (no lock descriptor, no stdout a
    caller waits on), then ``work``, then the line ``_DONE``; never returns."""
    status = 1
    try:
        os.close(r)
        high = fcntl.fcntl(w, fcntl.F_DUPFD, 3)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, high)
        os.closerange(high + 1, max(high + 1, os.sysconf("SC_OPEN_MAX")))

        def emit(line: bytes) -> None:
            data = line + b"\n"
            while data:
                data = data[os.write(high, data) :]

        work(emit)
        emit(_DONE)
        status = 0
    finally:
        os._exit(status)


# ---- MPS daemons and servers, by the pipe dir in their environment --------------------------------------


def key_uid(pipe_dir: str) -> int | None:
    """The user of the daemon key ``<key>/pipe`` names (``g0_1-u1000-p25``: 1000), None if it names none."""
    for part in os.path.basename(os.path.dirname(pipe_dir)).split("-"):
        if part[:1] == "u" and part[1:].isdigit():
            return int(part[1:])
    return None


def _environ_value(path: str, want: bytes) -> bytes | None:
    with open(path, "rb") as fh:
        for var in fh.read().split(b"\0"):
            if var.startswith(want):
                return var[len(want) :]
    return None


def _mps_work(proc: str, users: frozenset, servers: tuple[str, ...]):
    """The child's part of ``mps_records``: one line per MPS process found (pid, start, exe, pipe dir)."""

    def work(emit) -> None:
        for name in _pids(proc):
            try:
                with open(f"{proc}/{name}/comm", "rb") as fh:
                    if fh.read().strip() != MPS_COMM:
                        continue
                uid = owner(name, proc)
                if uid is None or (uid not in users and executable(name, proc) not in servers):
                    continue  # not root's, not the daemon's user's, not the real server: its memory is not read
                record = process_record(int(name), proc)
                pipe = None if record is None else _environ_value(f"{proc}/{name}/environ", _PIPE_VAR)
            except OSError:  # gone meanwhile
                continue
            if record is not None and pipe is not None:  # a pipe was looked for only in a record's process
                exe = os.fsencode(record["exe"] or "").hex().encode()  # '' (no hex digits): not shown
                emit(b"%d %d %d %s %s" % (record["pid"], record["start"], uid, exe, pipe.hex().encode()))

    return work


def mps_records(proc: str = "/proc", users=(), timeout: float = SCAN_TIMEOUT) -> tuple[dict[int, dict], bool]:
    """pid -> {pid, start, uid, exe, pipe} of every process named nvidia-cuda-mps* with a CUDA_MPS_PIPE_DIRECTORY
    in its environment (a daemon's servers inherit its environment), and whether the scan finished in time.
    Memory is read only of processes owned by this process's user (root, as the hooks are), by one of ``users``
    (the daemons' users, whose servers these are), or running the real nvidia-cuda-mps-server. What a process
    says its pipe dir is, is still its own word: ``of_its_key`` tells whether it may be that key's."""
    trusted = frozenset({os.geteuid(), *users})
    lines, complete = in_child(_mps_work(proc, trusted, executable_paths(MPS_SERVER)), timeout)
    found = {}
    for line in lines:
        try:
            pid, start, uid, exe, pipe = line.split(b" ")
            found[int(pid)] = {
                "pid": int(pid),
                "start": int(start),
                "uid": int(uid),
                "exe": os.fsdecode(bytes.fromhex(exe.decode())) or None,
                "pipe": bytes.fromhex(pipe.decode()).decode("utf-8", "replace"),
            }
        except ValueError:
            continue
    return found, complete


def of_its_key(record: dict) -> bool:
    """Can the process be what its pipe dir's key left: root's (a control daemon) or the key's user's (its
    server)? Another user's process that names the key's pipe dir in its environment is that user's decoy."""
    return record["uid"] in (os.geteuid(), key_uid(record["pipe"]))


def mps_processes(proc: str = "/proc", users=()) -> dict[int, str]:
    """pid -> CUDA_MPS_PIPE_DIRECTORY of the MPS processes ``mps_records`` finds."""
    return {pid: r["pipe"] for pid, r in mps_records(proc, users)[0].items()}


def leftover_records(pipe_dir: str, proc: str = "/proc") -> list[dict]:
    """The MPS control daemons and servers of ``pipe_dir`` (``mps_records``, reading the memory of root's
    processes and its key's user's only). Called only for a key whose daemon does not answer, so whatever is
    found there is what it left."""
    uid = key_uid(pipe_dir)
    found = mps_records(proc, () if uid is None else (uid,))[0]
    return [found[pid] for pid in sorted(found) if found[pid]["pipe"] == pipe_dir and of_its_key(found[pid])]


def leftover_processes(pipe_dir: str, proc: str = "/proc") -> list[int]:
    return [r["pid"] for r in leftover_records(pipe_dir, proc)]


# ---- signals to a pid read earlier ----------------------------------------------------------------------


def signal_checked(pid: int, check, signal: int) -> bool:
    """Send ``signal`` to ``pid`` if ``check()`` holds, checked once a pidfd pins the process (see the module's
    docstring; without pidfds, checked just before ``os.kill``). Was it sent?"""
    if TYPE_CHECKING:
        import signal as _signal  # the same names, typed: the C module publishes no type information
    else:
        import _signal  # the C module: signal's Python layer builds its enums (~3 M instructions)

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds here (Python or kernel): the check alone
        fd = None
    try:
        if not check():
            return False
        if fd is not None:
            _signal.pidfd_send_signal(fd, signal)
        else:
            os.kill(pid, signal)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def still_there(record: dict, proc: str = "/proc") -> bool:
    """Is the recorded process still running (not a zombie) as itself?"""
    return running(record["pid"], proc) and same_process(record, proc)


def kill_scanned(scan, wait: float = 2.0, proc: str = "/proc") -> list[dict]:
    """SIGKILL the processes ``scan()`` returns (records: pid, start, exe), each only while it is still that
    process (``signal_checked``); scan again (up to three times), wait until they are gone. Returns the
    records signalled: ``still_there`` tells which survived."""
    killed: list[dict] = []
    deadline = time.monotonic() + wait
    # scan again after each kill: a hung daemon may have forked a server between the scan and its SIGKILL
    for _scan in range(3):
        new = [r for r in scan() if r["pid"] not in {k["pid"] for k in killed}]
        if not new:
            break
        killed += [r for r in new if signal_checked(r["pid"], lambda r=r: same_process(r, proc), 9)]
        pause = 0.0005
        while any(still_there(r, proc) for r in killed) and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    return killed


def kill_leftovers(pipe_dir: str, wait: float = 2.0) -> list[int]:
    """SIGKILL what a dead or hung daemon of ``pipe_dir`` left (``leftover_records``); wait until they are
    gone. The pids signalled."""
    return [r["pid"] for r in kill_scanned(lambda: leftover_records(pipe_dir), wait)]


# ---- slurmstepd -------------------------------------------------------------------------------------------


def _cmdline_work(proc: str, executables: tuple[str, ...], uid: int):
    def work(emit) -> None:
        for name in _pids(proc):
            if executable(name, proc) not in executables or owner(name, proc) != uid:
                continue  # checked before any read of its memory
            try:
                with open(f"{proc}/{name}/cmdline", "rb") as fh:
                    emit(b"%s %s" % (name.encode(), fh.read().hex().encode()))
            except OSError:
                continue

    return work


def cmdlines(
    executables: tuple[str, ...], uid: int = 0, proc: str = "/proc", timeout: float = SCAN_TIMEOUT
) -> dict[int, bytes] | None:
    """pid -> command line (its title) of each process owned by ``uid`` whose executable is one of
    ``executables``; None when the scan did not finish within ``timeout`` (what it saw is not all there is)."""
    lines, complete = in_child(_cmdline_work(proc, tuple(executables), uid), timeout)
    if not complete:
        return None
    found = {}
    for line in lines:
        pid, title = line.split(b" ")
        found[int(pid)] = bytes.fromhex(title.decode())
    return found


# ---- a daemon named by its pid file -------------------------------------------------------------------------


def started_at(pid: int, proc: str = "/proc") -> float | None:
    """When the process started (seconds since the epoch, to a second: /proc/stat's btime is whole seconds),
    from /proc/PID/stat field 22; None if gone."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return None
    try:
        with open(f"{proc}/stat", "rb") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def pid_file_problem(pid: int, written: float, name: str, uid: int = 0, proc: str = "/proc") -> str | None:
    """Why ``pid`` (read from a pid file last written at ``written``) is not the daemon that wrote it: not
    running as ``uid`` alone, its executable not a file called ``name``, or started after the file was
    written (a daemon writes its pid file once it runs: a later process took a stale file's pid). None if it
    is."""
    exe, start, runs_as = executable(pid, proc), started_at(pid, proc), owner(pid, proc)
    if exe is None or start is None or not running(pid, proc):
        return "is not running"
    if os.path.basename(exe) != name:
        return f"is {exe}, not {name}"
    if runs_as != uid:
        return f"runs as uid {runs_as}, not {uid}"
    if start > written + 1.0:  # btime's whole seconds
        return f"started at {start:.0f}, after the pid file was written ({written:.0f}): a reused pid"
    return None
