"""The node's MPS lock serialises a daemon decision and its action across hooks.

The race (issue 14): job 1's daemon died (SIGKILL); job 1's epilog reads the
journals, sees no other job on that daemon key and decides to quit it; job 2's
prolog of the same key finds the daemon dead and starts a fresh one in the same
pipe dir; the epilog then quits *that* daemon and removes its pipe dir, and the
prolog's next command fails with "Cannot find MPS control daemon process".

The hooks also hold the journal lock (``jobs/.lock``) for their whole run; these
tests replace it with a no-op so that only the MPS lock stands between the two,
which is what keeps MPS safe if the journal lock is ever narrowed (or a tool acts
on daemons without it). The interleaving is forced with events: the epilog waits,
after deciding and before quitting, for the prolog to have started its daemon; the
prolog waits, after ``-d`` and before configuring it, for the epilog to finish.
Under the lock the prolog cannot get there, so the epilog's wait ends at its bound
(a liveness bound, not an assertion) and the two run one after the other.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import mps as mps_module
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.mps import MpsControl, mps_lock
from slurm_gpushare.proc import run
from tests.unit.hooks_support import FAKE_MPS, HookNode, stop_daemons, unmount_key_dirs

BOUND = 3.0  # how long the epilog waits for a prolog that the lock holds back


@pytest.fixture
def node(tmp_path, monkeypatch):
    node = HookNode(tmp_path, "lab-mps01")
    node.orphans = []
    monkeypatch.setattr(JournalStore, "locked", lambda self: nullcontext(self))  # only the MPS lock is left
    yield node
    stop_daemons(node.state_dir)
    for pid in node.orphans:  # the killed daemons' servers (the fake's outlive their daemon)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_daemon(node: HookNode, job_id: int) -> None:
    """SIGKILL the job's control daemon, as the OOM killer does; its socket and pipe dir stay behind."""
    daemon = JournalStore(node.state_dir).read(job_id).mps
    state = json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())
    pid = state["pid"]
    node.orphans += [int(p) for p in state["servers"]]
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
        time.sleep(0.05)
    assert not node.mps.alive(daemon) and Path(daemon.pipe_dir, "control").exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def race(node: HookNode) -> tuple[BaseException | None, BaseException | None, int]:
    """Job 1's epilog (dead daemon) against job 2's prolog of the same key; (epilog error, prolog error,
    daemons the prolog started: a second when the first was quit under it)."""
    decided, started, epilog_done = threading.Event(), threading.Event(), threading.Event()
    starts = []

    class DecidedThenWait(MpsControl):  # the epilog's control: it has decided to quit; let the prolog start first
        def quit(self, daemon):
            decided.set()
            started.wait(BOUND)
            return super().quit(daemon)

    def prolog_runner(argv, **kw):  # the prolog's: after `-d`, let the epilog act before configuring
        result = run(argv, **kw)
        if argv[-1] == "-d":
            starts.append(argv)
            started.set()
            epilog_done.wait(BOUND * 4)
        return result

    errors: dict[str, BaseException | None] = {"epilog": None, "prolog": None}

    def epilog():
        try:
            epilog_hook.epilog(node.env(61, "0", 25), mps=DecidedThenWait(run, FAKE_MPS, quit_wait=5))
        except BaseException as exc:  # reported to the test
            errors["epilog"] = exc
        finally:
            epilog_done.set()

    def prolog():
        decided.wait(BOUND * 4)
        try:
            prolog_hook.prolog(node.env(62, "0", 25), mps=MpsControl(prolog_runner, FAKE_MPS, quit_wait=5))
        except BaseException as exc:
            errors["prolog"] = exc

    threads = [threading.Thread(target=epilog), threading.Thread(target=prolog)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return errors["epilog"], errors["prolog"], len(starts)


def start_and_kill_job_1(node: HookNode):
    prolog_hook.prolog(node.env(61, "0", 25), mps=node.mps)
    daemon = JournalStore(node.state_dir).read(61).mps
    kill_daemon(node, 61)
    return daemon


def test_epilog_of_a_dead_daemon_and_prolog_of_a_fresh_one_are_serialised(node):
    daemon = start_and_kill_job_1(node)
    epilog_error, prolog_error, starts = race(node)
    assert epilog_error is None and prolog_error is None and starts == 1
    assert node.journals() == ["62.json"]
    assert JournalStore(node.state_dir).read(62).mps.pipe_dir == daemon.pipe_dir
    assert node.mps.alive(daemon)  # the fresh daemon survived job 1's epilog
    state = json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())
    assert state["default_active_thread_percentage"] == 25.0 and len(state["servers"]) == 1
    epilog_hook.epilog(node.env(62, "0", 25), mps=node.mps)
    assert not node.mps.alive(daemon) and node.journals() == []


def test_without_the_lock_the_epilog_quits_the_fresh_daemon(node, monkeypatch):
    """The same interleaving with the MPS lock removed too: the failure the soak saw (so the test above can fail).
    The epilog quits the prolog's fresh daemon under it; the prolog's start fails ("Cannot find MPS control daemon
    process") and, the daemon being gone, the prolog starts it once more: two daemons started where one was due."""

    @contextmanager
    def no_lock(state_dir, needed=True):
        yield

    monkeypatch.setattr(mps_module, "mps_lock", no_lock)
    daemon = start_and_kill_job_1(node)
    epilog_error, prolog_error, starts = race(node)
    assert epilog_error is None and prolog_error is None
    assert starts == 2
    assert node.mps.alive(daemon)  # the second start's daemon
    epilog_hook.epilog(node.env(62, "0", 25), mps=node.mps)
    assert not node.mps.alive(daemon) and node.journals() == []


def test_epilog_of_a_dead_daemon_succeeds_and_removes_what_it_left(node):
    daemon = start_and_kill_job_1(node)
    epilog_hook.epilog(node.env(61, "0", 25), mps=node.mps)
    assert node.journals() == [] and not Path(daemon.pipe_dir).exists()


def test_dead_daemon_still_named_by_another_journal_is_left_to_that_job(node):
    """Job 2 shares job 1's daemon, which died: job 1's epilog leaves the key to job 2, whose epilog cleans it."""
    daemon = start_and_kill_job_1(node)
    prolog_hook.prolog(node.env(62, "0", 25), mps=node.mps)  # the dead daemon is replaced for job 2
    assert node.mps.alive(daemon)
    epilog_hook.epilog(node.env(61, "0", 25), mps=node.mps)
    assert node.mps.alive(daemon) and node.journals() == ["62.json"]
    epilog_hook.epilog(node.env(62, "0", 25), mps=node.mps)
    assert not node.mps.alive(daemon) and not Path(daemon.pipe_dir).exists()


def test_prolog_replaces_a_dead_daemon_of_its_key(node):
    daemon = start_and_kill_job_1(node)
    epilog_hook.epilog(node.env(61, "0", 25), mps=node.mps)
    Path(daemon.pipe_dir).mkdir(parents=True)  # what a dead daemon leaves: its pipe dir and a stale socket file
    Path(daemon.pipe_dir, "control").write_text("")
    prolog_hook.prolog(node.env(63, "0", 25), mps=node.mps)
    assert node.mps.alive(daemon)


def test_jobs_without_mps_take_no_lock(node, tmp_path, monkeypatch):
    taken = []
    real = mps_module.mps_lock

    def spy(state_dir, needed=True):
        taken.append(needed)
        return real(state_dir, needed)

    monkeypatch.setattr(mps_module, "mps_lock", spy)
    (tmp_path / "x").mkdir()
    exclusive = HookNode(tmp_path / "x", "lab-mig01")
    env = exclusive.env(71, "0")
    prolog_hook.prolog(env)
    epilog_hook.epilog(env)
    assert taken == [False, False] and not Path(mps_module.lock_path(str(exclusive.state_dir))).exists()


def test_the_lock_excludes_a_second_holder(tmp_path):
    import fcntl

    with mps_lock(str(tmp_path)):
        fd = os.open(mps_module.lock_path(str(tmp_path)), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    with mps_lock(str(tmp_path), needed=False):
        fd = os.open(mps_module.lock_path(str(tmp_path)), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it
        finally:
            os.close(fd)


def start_serve_and_kill_job_1(node: HookNode):
    """As start_and_kill_job_1, once the server runs as a server (the fake names itself after its interpreter
    starts, as a real server process is named from its exec)."""
    prolog_hook.prolog(node.env(61, "0", 25), mps=node.mps)
    daemon = JournalStore(node.state_dir).read(61).mps
    servers = json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())["servers"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_comm(int(p)) == "nvidia-cuda-mps" for p in servers):
        time.sleep(0.02)
    kill_daemon(node, 61)
    return daemon


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_what_a_killed_daemon_left_is_killed_before_a_fresh_start(node):
    """The fake's servers, like real ones, can outlive a SIGKILLed control daemon: the next prolog of its key
    kills them (found by name and by the pipe dir in their environment) before starting a fresh daemon."""
    from slurm_gpushare.node.procscan import leftover_processes

    daemon = start_serve_and_kill_job_1(node)
    orphans = list(node.orphans)
    assert orphans and leftover_processes(daemon.pipe_dir) == orphans
    prolog_hook.prolog(node.env(63, "0", 25), mps=node.mps)
    assert node.mps.alive(daemon) and not any(_state(p) not in ("Z",) for p in orphans)
    fresh = json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())
    assert fresh["pid"] in leftover_processes(daemon.pipe_dir)  # the fresh daemon is found the same way


def test_epilog_of_a_killed_daemon_kills_its_servers(node):
    daemon = start_serve_and_kill_job_1(node)
    orphans = list(node.orphans)
    epilog_hook.epilog(node.env(61, "0", 25), mps=node.mps)
    assert not any(_state(p) != "Z" for p in orphans) and not Path(daemon.pipe_dir).exists()


def test_reconcile_kills_a_server_that_outlived_its_daemon_and_pipe_dir(node):
    """A server whose daemon died and whose pipe dir and journal are gone (a daemon killed as it forked it,
    after the last scan of its key) is found by reconcile (and so the health check) and killed; a server of a
    key a journal still names is left to that job's hooks."""
    import shutil

    from slurm_gpushare.node.epilog import Killer
    from slurm_gpushare.node.observed import ObservedState
    from slurm_gpushare.node.reconcile import daemon_dirs, execute_reconcile, mps_processes_under, plan_reconcile

    daemon = start_serve_and_kill_job_1(node)
    orphans = list(node.orphans)
    store = JournalStore(node.state_dir)
    journal = store.read(61)
    store.remove(61)
    unmount_key_dirs(Path(daemon.pipe_dir).parent)  # the key dir's own tmpfs, where the hooks could mount it
    shutil.rmtree(Path(daemon.pipe_dir).parent)
    found = mps_processes_under(str(node.state_dir))
    assert sorted(found) == sorted(orphans) and set(found.values()) == {daemon.pipe_dir}
    kept = plan_reconcile(
        {}, set(), ObservedState({}, {}, frozenset(), {}), daemon_dirs(str(node.state_dir)), [], found
    )
    assert [a.pid for a in kept.processes] == sorted(orphans)
    assert any(
        f"kill MPS process {orphans[0]} (pipe {daemon.pipe_dir}): no journal names its daemon" in line
        for line in kept.lines("lab-mps01")
    )
    # while a journal names the key, the server is its job's hooks' to handle
    named = {61: journal}
    assert plan_reconcile(named, {61}, ObservedState({}, named, frozenset(), {}), {}, [], found).processes == []
    assert execute_reconcile(kept, store, node.mps, Killer(None), {}) == []
    assert not any(_state(p) != "Z" for p in orphans)
    assert mps_processes_under(str(node.state_dir)) == {}
