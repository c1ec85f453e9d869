"""Root never acts on an MPS daemon through a name a job's user can write (issue 21 parts 1 and 5).

The attack: a job's pipe dir is its user's, so the job can replace its own ``control`` with a symbolic
link to another user's control socket (keys were listable under ``<state_dir>/mps``); its epilog then
quit the other user's daemon and left its own running. These tests play it with two users' daemons of the
fake MPS control (real processes), and check each rule that stops it: the daemon is stopped by the pid
recorded at its start, a probe connects only to a root-owned socket (no link followed) whose peer is the
recorded daemon, the pipe dir is root's until the daemon is up, the state and log dirs are root-only, a
socket that never accepts is never given a client session, and a hung daemon is killed, not waited on.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpushare.gpu.backend import GpuProcess
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.epilog import Killer, plan_epilog
from slurm_gpushare.node.journal import Device, Journal, JournalStore
from slurm_gpushare.node.mps import MpsControl, answers
from slurm_gpushare.node.observed import ObservedGpu, ObservedState
from slurm_gpushare.proc import run
from tests.unit.hooks_support import FAKE_MPS, FAKES, HookNode, no_scontrol, stop_daemons

VICTIM, ATTACKER = 4101, 4102  # two users (uids with no passwd entry: the fake's server takes gid = uid)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the pipe dirs are handed to other uids")


@pytest.fixture
def node(tmp_path):
    node = HookNode(tmp_path, "lab-mps01")
    node.spawned = []
    yield node
    stop_daemons(node.state_dir)
    for pid in node.spawned:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fake_state(daemon) -> dict:
    return json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def survives(child: subprocess.Popen) -> bool:
    """Is ``child`` still running a second after whatever might have signalled it? (A SIGKILL ends a sleeping
    process at once; the second is a bound, not a measurement.)"""
    try:
        child.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return True
    return False


def start_job(node: HookNode, job_id: int, uid: int):
    assert prolog_hook.main(node.env(job_id, "0", 25, uid=uid), runner=no_scontrol, mps=node.mps) == 0
    daemon = JournalStore(node.state_dir).read(job_id).mps
    state = fake_state(daemon)
    node.spawned += [state["pid"], *map(int, state["servers"])]
    return daemon, state


def listening_socket(path: Path, owner: int | None = None):
    """A socket that listens and never accepts (what a hostile job can bind in its own pipe dir)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    if owner is not None:
        os.chown(path, owner, owner)
    return sock


# ---- the attack -------------------------------------------------------------------------------------------


def test_epilog_of_a_job_that_linked_its_control_to_another_users_socket_stops_only_its_own_daemon(node):
    victim, victim_state = start_job(node, 81, VICTIM)
    attacker, attacker_state = start_job(node, 82, ATTACKER)
    control = Path(attacker.pipe_dir) / "control"
    control.unlink()  # what the attacker's job can do: the pipe dir is its user's
    control.symlink_to(Path(victim.pipe_dir) / "control")
    assert epilog_hook.main(node.env(82, "0", 25, uid=ATTACKER), runner=no_scontrol, mps=node.mps) == 0
    # (the victim's server is not checked here: uid 4101 cannot exec this machine's interpreter under /root, so
    # the fake's servers for it exit at once; tests/cluster/hostile/test_mps_control_link.py checks it answers)
    assert node.mps.alive(victim) and running(victim_state["pid"])
    assert not running(attacker_state["pid"]) and not any(running(int(p)) for p in attacker_state["servers"])
    assert not Path(attacker.pipe_dir).exists() and node.journals() == ["81.json"]


def test_the_mps_state_dir_does_not_list_the_keys_and_each_dir_is_root_only_where_nothing_needs_more(node):
    daemon, _ = start_job(node, 83, VICTIM)
    key = Path(daemon.pipe_dir).parent

    def owner_mode(path: Path):
        st = os.lstat(path)
        return st.st_uid, stat.S_IMODE(st.st_mode)

    assert owner_mode(key.parent) == (0, 0o711)  # <state_dir>/mps: traversable, not listable
    assert owner_mode(key) == (0, 0o711)
    assert owner_mode(Path(daemon.pipe_dir)) == (VICTIM, 0o700)  # handed to the user once the daemon is up
    assert owner_mode(key / "root") == (0, 0o700) and stat.S_ISSOCK(os.lstat(key / "root" / "control").st_mode)
    assert owner_mode(key / "daemon.json") == (0, 0o600)
    assert owner_mode(Path(daemon.log_dir)) == (0, 0o700) and owner_mode(Path(daemon.log_dir).parent) == (0, 0o700)
    assert (Path(daemon.log_dir) / "control.log").exists()  # the file NVIDIA documents there, by the fake too


def test_the_pipe_dir_is_roots_while_the_daemon_starts(node):
    seen = []

    def runner(argv, **kw):
        if argv[-1] == "-d":
            st = os.lstat(kw["env"]["CUDA_MPS_PIPE_DIRECTORY"])
            seen.append((st.st_uid, stat.S_IMODE(st.st_mode)))
        return run(argv, **kw)

    mps = MpsControl(runner, FAKE_MPS, quit_wait=5)
    assert prolog_hook.main(node.env(84, "0", 25, uid=VICTIM), runner=no_scontrol, mps=mps) == 0
    assert seen == [(0, 0o700)]


# ---- the probe ----------------------------------------------------------------------------------------------


def test_probe_follows_no_link_and_trusts_no_socket_root_does_not_own(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    server = listening_socket(real / "control")  # root's, listening
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "control").symlink_to(real / "control")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    other = listening_socket(foreign / "control", owner=ATTACKER)
    try:
        assert answers(str(real))  # the control: a root socket with a root listener answers
        assert not answers(str(linked)) and not answers(str(foreign))
    finally:
        server.close()
        other.close()


def test_a_socket_that_never_accepts_gets_no_client_session(node):
    """A pipe dir without a record (a daemon from before records were kept) whose ``control`` is a socket of
    the job's user that listens and never accepts: quit must not start the control client on it (the client
    would wait until its timeout on every hook that asks it something)."""
    daemon, _ = start_job(node, 85, VICTIM)
    key = Path(daemon.pipe_dir).parent
    (key / "daemon.json").unlink(missing_ok=True)
    control = Path(daemon.pipe_dir) / "control"
    control.unlink()
    sock = listening_socket(control, owner=VICTIM)
    sessions = []

    def runner(argv, **kw):
        if tuple(argv[: len(FAKE_MPS)]) == tuple(FAKE_MPS):  # the control client (not umount)
            sessions.append(kw.get("input"))
        return run(argv, **kw)

    try:
        assert not answers(daemon.pipe_dir)
        MpsControl(runner, FAKE_MPS, quit_wait=0.5).quit(daemon)
    finally:
        sock.close()
    assert sessions == [] and not Path(daemon.pipe_dir).exists()


def test_a_hung_daemon_is_not_reused_and_is_stopped_by_its_pid(node):
    daemon, state = start_job(node, 86, VICTIM)
    os.kill(state["pid"], signal.SIGSTOP)  # it accepts nothing from now on: connects land in its backlog
    deadline = time.monotonic() + 5  # a bound on the signal's delivery, not a measurement
    while Path(f"/proc/{state['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not node.mps.alive(daemon)
    mps = MpsControl(run, FAKE_MPS, quit_wait=0.5)
    mps.quit_timeout = 1.0
    mps.quit(daemon)  # the quit session times out; the recorded pid is SIGKILLed
    assert not running(state["pid"]) and not any(running(int(p)) for p in state["servers"])


def test_a_recorded_pid_reused_by_another_process_is_not_signalled(node):
    daemon, state = start_job(node, 87, VICTIM)
    record = json.loads((Path(daemon.pipe_dir).parent / "daemon.json").read_text())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record["pid"] = bystander.pid  # as if the daemon's pid had been reused by this process
        (Path(daemon.pipe_dir).parent / "daemon.json").write_text(json.dumps(record))
        node.mps.quit(daemon)
        assert survives(bystander)
    finally:
        bystander.kill()
        bystander.wait()
    node.spawned.append(state["pid"])


# ---- the epilog's leftover kill (issue 21 part 5) ----------------------------------------------------------


def test_epilog_kills_a_leftover_only_while_its_pid_is_still_the_jobs_process():
    """The epilog read the pid from NVML when it observed the node; by the kill the job's process may be gone
    and its pid another process's. That one (not in the job's cgroup) must survive."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gpu = ObservedGpu(0, "GPU-x", 0, 24576, False, processes=(GpuProcess(other.pid, 10, None, None),))
        journal = Journal(91, 5, 5, "n", "ready", (Device(0, 0, "GPU-x", "exclusive"),), None, {})
        actions, problems = plan_epilog(journal, ObservedState({0: gpu}, {91: journal}, frozenset(), {other.pid: 91}))
        kill = [a for a in actions if type(a).__name__ == "KillProcess"]
        assert len(kill) == 1 and not problems

        class NoProcesses:
            def processes(self, index):
                return []

        Killer(NoProcesses(), wait=0.5)(kill[0])
        assert survives(other)  # its cgroup is no job's: not the job's process any more
    finally:
        other.kill()
        other.wait()


# ---- the fake writes nothing through a link the user planted ---------------------------------------------


def test_fake_daemon_state_file_is_not_written_through_a_planted_link(tmp_path):
    pipe, log, target = tmp_path / "pipe", tmp_path / "log", tmp_path / "target"
    pipe.mkdir()
    target.write_text("keep")
    (pipe / ".fake-state.json.tmp").symlink_to(target)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log), "PATH": os.defpath}
    assert run([*FAKE_MPS, "-d"], env=env, timeout=10).returncode == 0
    try:
        run([*FAKE_MPS], input="get_server_list\n", env=env, timeout=10)  # served once the state file is written
        assert target.read_text() == "keep" and json.loads((pipe / ".fake-state.json").read_text())["pid"] > 0
        assert stat.S_IMODE(os.lstat(pipe / "control").st_mode) == 0o777  # set by bind (umask 0), no chmod by name
    finally:
        run([*FAKE_MPS], input="quit\n", env=env, timeout=10, check=False)
    assert FAKES.exists()
