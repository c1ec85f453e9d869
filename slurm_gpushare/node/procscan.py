"""Root's reads of other processes under /proc, and kills of a pid read earlier."""

from __future__ import annotations

import os
import time

def process_record(pid: int, proc: str = "/proc") -> dict | None:
    """{pid, start (clock ticks after boot, /proc/PID/stat field 22), exe} of a live process; None if gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        exe = os.readlink(f"{proc}/{pid}/exe")
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return {"pid": pid, "start": int(fields[19]), "exe": exe}


def same_process(record: dict, proc: str = "/proc") -> bool:
    """Is the recorded process still the one running under its pid (same start time and executable)?"""
    return process_record(record["pid"], proc) == record


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
    import _signal as signal  # the C module: signal's Python layer builds its enums (~3 M instructions)

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
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
    return pids


def running(pid: int) -> bool:
    return state(pid) not in ("Z", "X", "")


def state(pid: int) -> str:
    """The process state letter of /proc/PID/stat ('' if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


