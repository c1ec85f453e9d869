"""Root reading other users' processes (issue 31, class 4) and signalling a pid read earlier (part 5).

A user's process can make a read of its cmdline or environ block for as long as it likes (memory backed by
a FUSE file); here a FIFO in a fake /proc tree stands in for it: opening one blocks until a writer comes.
Each call that could block runs under ``guarded``, which unblocks a stuck reader by opening the FIFO for
writing after a liveness bound and then fails the test, so a regression fails rather than hangs the suite.
Kills use real short-lived processes (``sleep``).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from slurm_gpushare.node import procscan
from slurm_gpushare.node.health import stepd_jobs
from slurm_gpushare.node.relayout import RelayoutError, sighup_slurmd

BOUND = 20.0  # liveness only: every call here returns in milliseconds unless it is stuck in a FIFO
STEPD = "/usr/sbin/slurmstepd"
ROOT = os.geteuid()  # "root" to the code under test: the uid the hooks run as (a test runs as whoever runs it)
USER = ROOT + 4242  # some other user
SLEEP = "/bin/sleep"
SLEEP_NAME = os.path.basename(os.path.realpath(SLEEP))  # "sleep" (or a multi-call binary's name)
PIPE = "/var/lib/gpushare/mps/g0-u{uid}-p25/pipe"


def entry(
    proc: Path,
    pid: int,
    uid: int,
    comm: str = "nvidia-cuda-mps",
    exe: str = "/usr/bin/python3",
    environ: bytes | None = None,
    cmdline: bytes | None = None,
    start: int = 5000,
    uids=None,
) -> Path:
    """A fake /proc/PID: stat (state S, start time field 22), status (Uid line), comm, an exe link and,
    where given, environ and cmdline (None: a FIFO, whose open blocks)."""
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S " + " ".join(["0"] * 18) + f" {start} 0 0\n")
    line = "\t".join(str(u) for u in (uids or (uid,) * 4))
    (d / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{line}\nGid:\t0\t0\t0\t0\n")
    (d / "comm").write_text(comm + "\n")
    os.symlink(exe, d / "exe")
    for name, data in (("environ", environ), ("cmdline", cmdline)):
        if data is None:
            os.mkfifo(d / name)
        else:
            (d / name).write_bytes(data)
    return d


def guarded(call, fifos=()):
    """``call()`` in a thread; if it is still running after BOUND, open each FIFO for writing (a blocked
    reader gets EOF) and fail. Returns what ``call`` returned."""
    out: dict = {}

    def target():
        try:
            out["value"] = call()
        except BaseException as exc:  # raised again in the test's thread
            out["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(BOUND)
    if worker.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        worker.join(BOUND)
        pytest.fail(f"the scan blocked on a FIFO for {BOUND:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def env(pipe: str) -> bytes:
    return b"HOME=/root\0CUDA_MPS_PIPE_DIRECTORY=" + pipe.encode() + b"\0PATH=/bin\0"


# ---- MPS processes: memory read only of root's and the daemon's user's processes ---------------------------


def test_a_user_process_named_like_an_mps_server_whose_environ_blocks_is_not_read(tmp_path):
    daemon_pipe = PIPE.format(uid=USER)
    entry(tmp_path, 101, ROOT, environ=env(daemon_pipe))  # the daemon (root)
    entry(tmp_path, 102, USER + 1, environ=None)  # another user's process, named nvidia-cuda-mps: a FIFO
    found = guarded(lambda: procscan.mps_processes(str(tmp_path)), [tmp_path / "102" / "environ"])
    assert found == {101: daemon_pipe}


def test_the_daemons_users_processes_are_read_and_no_other_users(tmp_path):
    pipe = PIPE.format(uid=USER)
    entry(tmp_path, 201, USER, environ=env(pipe))  # the key's user's server
    entry(tmp_path, 202, USER + 1, environ=env(pipe))  # a third user claiming that pipe dir
    entry(tmp_path, 203, USER, uids=(USER, ROOT, ROOT, ROOT), environ=env(pipe))  # mixed uids (setuid): no one's
    entry(tmp_path, 204, ROOT, comm="bash", environ=env(pipe))  # root's, but not named nvidia-cuda-mps
    assert procscan.leftover_processes(pipe, str(tmp_path)) == [201]
    assert procscan.mps_processes(str(tmp_path)) == {}  # no user named: root's processes only
    records, complete = procscan.mps_records(str(tmp_path), (USER,))
    assert complete and records == {
        201: {"pid": 201, "start": 5000, "uid": USER, "exe": "/usr/bin/python3", "pipe": pipe}
    }
    # a user with a daemon of their own (reconcile trusts every key's user) may name another key's pipe dir:
    # read, but not taken for that key's
    records, _ = procscan.mps_records(str(tmp_path), (USER, USER + 1))
    assert sorted(records) == [201, 202] and [procscan.of_its_key(records[p]) for p in (201, 202)] == [True, False]


def test_a_server_whose_executable_the_kernel_hides_is_still_the_keys_leftover(tmp_path, monkeypatch):
    """An MPS server changed its uid, so it is not dumpable, and root without CAP_SYS_PTRACE (a container's
    root) may not read its exe link: it is still found by its uid and pipe dir, with exe None, and the
    same process by pid and start time (seen on the test cluster's nodes: its server outlived a killed daemon)."""
    pipe = PIPE.format(uid=USER)
    entry(tmp_path, 205, USER, environ=env(pipe))
    hidden, real = str(tmp_path / "205" / "exe"), os.readlink

    def readlink(path, *a, **kw):
        if str(path) == hidden:
            raise PermissionError(13, "Permission denied", path)
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "readlink", readlink)
    records = procscan.leftover_records(pipe, str(tmp_path))
    assert records == [{"pid": 205, "start": 5000, "uid": USER, "exe": None, "pipe": pipe}]
    assert procscan.same_process(records[0], str(tmp_path))


def test_a_trusted_process_whose_read_stalls_holds_the_scan_only_until_its_deadline(tmp_path):
    """Owner checks keep users' processes out, but a root process can stall too: the scan runs in a child
    that is killed at the deadline, and the caller goes on with what it had (and knows it is partial)."""
    entry(tmp_path, 301, ROOT, environ=None)
    records, complete = guarded(
        lambda: procscan.mps_records(str(tmp_path), timeout=0.2), [tmp_path / "301" / "environ"]
    )
    assert records == {} and complete is False


def test_the_scan_child_keeps_no_descriptor_of_the_callers(tmp_path):
    """A lock the caller holds (the node's journal and MPS locks are flocks) must not stay held by a scan
    child the kernel keeps asleep after the caller let go: the child closes all but its pipe, and its
    stdout is not the caller's."""
    lock = tmp_path / "mps.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # inheritable on purpose: as one from slurmd might be
    os.set_inheritable(fd, True)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:

        def work(emit):
            for name in os.listdir("/proc/self/fd"):
                try:
                    emit(f"{name} {os.readlink(f'/proc/self/fd/{name}')}".encode())
                except OSError:
                    pass

        lines, complete = procscan.in_child(work)
    finally:
        os.close(fd)
    seen = dict(line.decode().split(" ", 1) for line in lines)
    assert complete and str(lock) not in seen.values(), seen
    assert seen["1"] == os.devnull and seen["2"] == os.devnull
    assert len([n for n in seen if int(n) > 2]) <= 2, seen  # its pipe, and listdir's own descriptor


def test_a_scan_that_fails_in_the_child_is_not_complete():
    def work(emit):
        emit(b"one")
        raise OSError("gone")

    assert procscan.in_child(work) == ([b"one"], False)


def test_key_uid():
    assert procscan.key_uid("/s/mps/g0_1-u1000-p25/pipe") == 1000
    assert procscan.key_uid("/s/mps/other/pipe") is None


# ---- slurmstepd: owner and executable, never the title -------------------------------------------------------


def test_a_user_process_titled_slurmstepd_is_not_a_slurmstepd(tmp_path):
    title = b"slurmstepd: [%d.batch]\0"
    entry(tmp_path, 10, 0, comm="slurmstepd", exe=STEPD, cmdline=title % 466)  # the real one
    entry(tmp_path, 11, USER, comm="slurmstepd", exe="/home/u/a.out", cmdline=None)  # a user's, its read blocks
    entry(tmp_path, 12, USER, comm="slurmstepd", exe=STEPD, cmdline=title % 467)  # a user's run of the binary
    entry(tmp_path, 13, 0, comm="python3", exe="/usr/bin/python3", cmdline=title % 468)  # root's, but no stepd
    entry(tmp_path, 14, 0, comm="slurmstepd", exe=STEPD + " (deleted)", cmdline=title % 469)  # upgraded since
    entry(tmp_path, 15, 0, comm="slurmstepd", exe=STEPD, cmdline=b"slurmstepd: [470.extern]\0")
    (tmp_path / "self").mkdir()
    assert guarded(lambda: stepd_jobs(tmp_path, (STEPD,)), [tmp_path / "11" / "cmdline"]) == {466, 469}


def test_a_real_process_titled_slurmstepd_is_not_counted():
    """The attack on this machine's /proc: a process whose argv says it is a batch slurmstepd."""
    child = subprocess.Popen(["slurmstepd: [977.batch]", "60"], executable=SLEEP)
    try:
        while Path(f"/proc/{child.pid}/cmdline").read_bytes()[:11] != b"slurmstepd:":
            time.sleep(0.01)  # until the exec took
        assert 977 not in (stepd_jobs(Path("/proc"), (STEPD,)) or set())
    finally:
        child.kill()
        child.wait()


def test_slurmstepd_scan_that_stalls_or_has_no_binary_knows_nothing(tmp_path):
    """Unknown is None, never an empty set: an empty set would make every old batch job a lost launch."""
    entry(tmp_path, 20, 0, comm="slurmstepd", exe=STEPD, cmdline=None)  # root's, and its read stalls
    assert (
        guarded(lambda: procscan.cmdlines((STEPD,), 0, str(tmp_path), timeout=0.2), [tmp_path / "20" / "cmdline"])
        is None
    )
    assert stepd_jobs(tmp_path, ()) is None


# ---- kills of a pid read earlier: pidfd, then the identity check ----------------------------------------------


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


@pytest.fixture
def sleeper():
    started = []

    def start():
        # SIGHUP at its default action, as a daemon has it: a test run under nohup would hand down SIG_IGN
        child = subprocess.Popen([SLEEP, "60"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        started.append(child)
        while _exe(child.pid) != os.path.realpath(SLEEP):
            time.sleep(0.01)  # until the exec took
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_a_recorded_process_is_killed_and_a_recycled_pid_is_not(sleeper):
    gone = sleeper()
    record = procscan.process_record(gone.pid)
    gone.kill()
    gone.wait()  # reaped: its pid is free for the next process
    assert procscan.kill_scanned(lambda: [record], wait=0.5) == []

    other = sleeper()
    recycled = {**procscan.process_record(other.pid), "start": record["start"] - 1}  # an earlier process's record
    renamed = {**procscan.process_record(other.pid), "exe": "/usr/bin/nvidia-cuda-mps-server"}
    assert procscan.kill_scanned(lambda: [recycled, renamed], wait=0.5) == []
    assert other.poll() is None  # still running: neither record is this process

    mine = procscan.process_record(other.pid)
    assert procscan.kill_scanned(lambda: [mine]) == [mine]
    assert other.wait() == -signal.SIGKILL and not procscan.still_there(mine)


def test_without_pidfds_the_same_check_decides(sleeper, monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")  # an old kernel or Python
    child = sleeper()
    record = procscan.process_record(child.pid)
    assert procscan.kill_scanned(lambda: [{**record, "start": record["start"] - 1}], wait=0.5) == []
    assert child.poll() is None
    assert procscan.kill_scanned(lambda: [record]) == [record] and child.wait() == -signal.SIGKILL


def test_kill_scans_again_for_a_process_forked_between_scan_and_kill(sleeper):
    """A hung daemon can fork a server between the scan and its SIGKILL: the kill scans again until a scan
    finds nothing new, and kills what the second scan found."""
    first, second = sleeper(), sleeper()
    a, b = procscan.process_record(first.pid), procscan.process_record(second.pid)
    scans = iter([[a], [a, b], [a, b]])
    assert [r["pid"] for r in procscan.kill_scanned(lambda: next(scans))] == [first.pid, second.pid]
    assert first.wait() == second.wait() == -signal.SIGKILL


# ---- the slurmd reconfigure signal: the pid file's pid, checked -------------------------------------------------


def test_sighup_goes_only_to_the_daemon_that_wrote_the_pid_file(tmp_path, sleeper):
    pid_file = tmp_path / "slurmd.pid"
    child = sleeper()
    pid_file.write_text(f"{child.pid}\n")
    with pytest.raises(RelayoutError, match=f"pid {child.pid} from {pid_file} is {os.path.realpath(SLEEP)}, not "):
        sighup_slurmd(pid_file)  # not slurmd: a stale file's pid taken by another program
    assert child.poll() is None
    old = time.time() - 600
    os.utime(pid_file, (old, old))  # written long before this process started: its pid was reused
    with pytest.raises(RelayoutError, match="after the pid file was written"):
        sighup_slurmd(pid_file, name=SLEEP_NAME, uid=os.geteuid())
    assert child.poll() is None
    with pytest.raises(RelayoutError, match=f"runs as uid {os.geteuid()}, not {USER}"):
        sighup_slurmd(pid_file, name=SLEEP_NAME, uid=USER)
    os.utime(pid_file)  # written now, after it started: it is the daemon of this file
    sighup_slurmd(pid_file, name=SLEEP_NAME, uid=os.geteuid())
    assert child.wait() == -signal.SIGHUP


def test_sighup_of_a_gone_pid_is_an_error_naming_the_file(tmp_path, sleeper):
    child = sleeper()
    pid_file = tmp_path / "slurmd.pid"
    pid_file.write_text(str(child.pid))
    child.kill()
    child.wait()
    with pytest.raises(RelayoutError, match=f"pid {child.pid} from {pid_file} is not running"):
        sighup_slurmd(pid_file)
