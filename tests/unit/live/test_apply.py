"""The live planner's apply path: its lock and relayout job through the Slurm client (slurm/relayoutjob.py), the pure
next step (live/steps.py),
the shared state file (live/state.py) and one run end to end against a stateful fake of Slurm (live/apply.py)."""

from __future__ import annotations

import copy
import json
import multiprocessing
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.live import steps as d
from slurm_gpushare.live.apply import LiveApply, LiveApplyError, gpu_jobs_by_node
from slurm_gpushare.live.change import Change, LayoutStep, ModeStep
from slurm_gpushare.live.report import Proposal
from slurm_gpushare.live.state import Record, State, StateError, StateFile
from slurm_gpushare.policy.share import Mode, Share
from slurm_gpushare.slurm import relayoutjob
from slurm_gpushare.slurm.cli_backend import CliClient, ReservationError
from slurm_gpushare.slurm.model import JobEnd
from slurm_gpushare.slurm.relayoutjob import LockHeld, lock_name, lock_node, relayout_script
from tests.conftest import ROOT
from tests.unit.live_fakes import FakeCtld, carol_job
from tests.unit.slurm_fakes import UnknownCommand

NODE = "lab-mig01"
ALL_1G = ("1g.5gb",) * 7
THREE_G = ("3g.20gb", "2g.10gb", "1g.5gb")


# ---- slurm/relayoutjob.py over the client -------------------------------------------------------


def test_create_lock_is_one_reservation_named_for_the_node():
    ctld = FakeCtld()
    client = CliClient(ctld)
    assert relayoutjob.create_lock(client, NODE, 3601) == "gpushare-relayout-lab-mig01"
    assert ctld.calls[-1] == (
        "scontrol",
        "create",
        "reservation",
        "ReservationName=gpushare-relayout-lab-mig01",
        "Nodes=lab-mig01",
        "StartTime=now",
        "Duration=61",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    )
    with pytest.raises(LockHeld, match="another planner holds the node"):
        relayoutjob.create_lock(client, NODE, 60)
    assert [lock_node(r) for r in relayoutjob.locks(client)] == [NODE]


def test_create_lock_other_failures_are_not_taken_for_a_held_lock():
    def runner(argv, **kw):
        from slurm_gpushare.proc import Result

        return Result(tuple(argv), 1, "", "Error creating the reservation: Invalid node name specified\n")

    with pytest.raises(ReservationError, match="node lab-mig01: cannot create reservation .*Invalid node name") as exc:
        relayoutjob.create_lock(CliClient(runner), NODE, 60)
    assert not isinstance(exc.value, LockHeld)


def test_locks_lists_only_gpushare_reservations_and_reads_their_times():
    ctld = FakeCtld()
    ctld.reservations["admin-maint"] = {"node": "lab-excl01", "start": 1, "end": 2}
    relayoutjob.create_lock(CliClient(ctld), NODE, 120)
    locks = relayoutjob.locks(CliClient(ctld))
    assert [(r.name, r.nodes, r.end - r.start) for r in locks] == [(lock_name(NODE), NODE, 120)]
    assert "MAINT" in locks[0].flags


def test_delete_lock_says_whether_it_was_there():
    ctld = FakeCtld()
    client = CliClient(ctld)
    relayoutjob.create_lock(client, NODE, 60)
    assert relayoutjob.delete_lock(client, NODE) is True
    assert relayoutjob.delete_lock(client, NODE) is False
    assert ctld.calls[-1] == ("scontrol", "delete", "ReservationName=gpushare-relayout-lab-mig01")


def test_relayout_job_is_a_fixed_script_in_the_lock_with_no_environment():
    ctld = FakeCtld()
    client = CliClient(ctld)
    relayoutjob.create_lock(client, NODE, 600)
    job = relayoutjob.submit_relayout(
        client,
        NODE,
        "/etc/slurm/gpushare-live.yaml",
        log="/var/log/slurm/relayout-%j.log",
        time_limit_s=1320,
        partition="batch",
        node_config="/etc/gpushare/node.yaml",
    )
    fake = ctld.jobs[job]
    assert fake.options == {
        "reservation": "gpushare-relayout-lab-mig01",
        "nodelist": NODE,
        "job-name": "gpushare-relayout-lab-mig01",
        "output": "/var/log/slurm/relayout-%j.log",
        "export": "NIL",
        "time": "22",
        "nodes": "1",
        "ntasks": "1",
        "partition": "batch",
        "qos": "normal",
    }
    lines = fake.script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[-1] == (
        "exec gpushare node relayout --policy /etc/slurm/gpushare-live.yaml --node lab-mig01 "
        "--node-config /etc/gpushare/node.yaml"
    )
    assert "$" not in fake.script.replace("$PATH", "")  # nothing expanded from any environment


@pytest.mark.parametrize(
    "node, policy",
    [
        ("lab;reboot", "/etc/slurm/live.yaml"),
        ("-n", "/etc/slurm/live.yaml"),
        ("a b", "/etc/slurm/live.yaml"),
        (NODE, "relative.yaml"),
        (NODE, "/etc/slurm/../shadow"),
        (NODE, "/etc/slurm/live.yaml; reboot"),
        (NODE, "/etc/$(reboot)"),
        ("x" * 64, "/etc/slurm/live.yaml"),
    ],
)
def test_hostile_node_names_and_paths_are_refused(node, policy):
    with pytest.raises(ReservationError, match="expected"):
        relayout_script(policy, node)


def test_job_end_reads_sacct_in_epoch_seconds():
    ctld = FakeCtld()
    client = CliClient(ctld)
    relayoutjob.create_lock(client, NODE, 600)
    job = relayoutjob.submit_relayout(client, NODE, "/etc/slurm/live.yaml", log="/var/log/r.log", time_limit_s=60)
    assert client.job_end(job) == JobEnd(job, "PENDING", "0:0", None, NODE)
    ctld.finish(job, "FAILED", "1:0")
    end = client.job_end(job)
    assert (end.ended, end.ok, end.end) == (True, False, int(ctld.now))
    ctld.jobs[job].in_sacct = False
    assert client.job_end(job) is None


# ---- live/steps.py ----------------------------------------------------------------------------


def change(phase="waiting", node=NODE, steps=((0, ALL_1G, THREE_G),), modes=(), **kw) -> Record:
    what = (
        Change(node, modes=tuple(ModeStep(g, Share.from_entry(o), Share.from_entry(n)) for g, o, n in modes))
        if modes
        else Change(node, tuple(LayoutStep(*step) for step in steps))
    )
    return Record(what, phase=phase, **{"locked_at": 1000.0, **kw})


def one(state_change, now=1100.0, locks=frozenset({NODE}), jobs=None, ends=None, nodes=None, max_wait=600.0):
    state = State()
    state.put(state_change)
    inputs = d.StepInputs(
        now, state, locks, max_wait, 1320.0, gpu_jobs=jobs or {}, job_ends=ends or {}, node_states=nodes or {}
    )
    return d.next_steps(inputs)[0]


def test_step_inputs_name_what_a_run_knows_with_empty_defaults():
    state = State()
    inputs = d.StepInputs(1100.0, state, frozenset({NODE}), 600.0, 1320.0, gpu_jobs={NODE: (7,)})
    assert inputs.locked(NODE) and not inputs.locked("lab-other")
    assert inputs.jobs_on(NODE) == (7,) and inputs.jobs_on("lab-other") == ()
    assert inputs.node_state(NODE) == ((), "")
    assert (inputs.job_ends, inputs.found, inputs.proposals, inputs.weights) == ({}, {}, (), ())
    assert d.next_steps(inputs) == []  # nothing in flight, nothing proposed
    with pytest.raises(AttributeError):
        inputs.now = 0.0  # frozen


def test_waiting_change_waits_for_gpu_jobs_then_gives_up_after_max_wait():
    assert isinstance(one(change(), jobs={NODE: (7, 8)}), d.Wait)
    gave = one(change(), now=1000.0 + 601, jobs={NODE: (7,)})
    assert isinstance(gave, d.GiveUp) and "live.max_wait 600 s" in gave.why


def test_waiting_change_without_gpu_jobs_starts_the_relayout():
    assert one(change(), jobs={"lab-other": (3,)}) == d.StartRelayout(NODE)


def test_waiting_change_whose_lock_vanished_is_lost():
    assert isinstance(one(change(), locks=frozenset()), d.Lost)


def test_relayout_change_follows_its_job():
    c = change("relayout", job=55, submitted_at=1050.0)
    assert isinstance(one(c), d.Wait)  # not in accounting yet
    assert isinstance(one(c, ends={55: JobEnd(55, "RUNNING", "0:0", None, NODE)}), d.Wait)
    assert one(c, ends={55: JobEnd(55, "COMPLETED", "0:0", 1090, NODE)}).ok
    failed = one(c, ends={55: JobEnd(55, "FAILED", "1:0", 1090, NODE)})
    assert (failed.ok, failed.drain) == (False, "gpushare relayout failed: job 55 ended FAILED exit 1:0")
    # the relayout drained the node with its own reason: kept, not replaced
    own = one(
        c,
        ends={55: JobEnd(55, "FAILED", "1:0", 1090, NODE)},
        nodes={NODE: (("IDLE", "DRAIN"), "gpushare relayout failed: MIG layout still differs")},
    )
    assert (own.ok, own.drain) == (False, None)
    # a job accounting never heard of, long after: failed, not waited for forever
    lost = one(c, now=1050.0 + 1320 + d.NO_RECORD_GRACE + 1)
    assert isinstance(lost, d.Finish) and not lost.ok and "no accounting record" in lost.result


def test_a_change_left_by_a_run_that_stopped_is_taken_on_or_back():
    state = State()
    state.put(change("locking"))
    locked, unlocked = (
        d.StepInputs(1100.0, state, frozenset({NODE}), 600, 1320),
        d.StepInputs(1100.0, state, frozenset(), 600, 1320),
    )
    assert isinstance(d.next_steps(locked)[0], d.Adopt)
    assert isinstance(d.next_steps(unlocked)[0], d.Drop)
    state.put(change("submitting", prior={"layouts": {}, "modes": {}}))
    assert d.next_steps(replace(locked, found={NODE: (9, 7)})) == [d.Found(NODE, 7)]
    assert d.next_steps(replace(locked, found={NODE: ()})) == [d.StartRelayout(NODE)]
    assert isinstance(d.next_steps(unlocked)[0], d.Lost)


def test_restore_puts_back_the_nodes_entries_as_they_were():
    state = State(layouts={NODE: {1: ALL_1G}, "lab-mig02": {0: THREE_G}})
    c = state.apply(change(steps=((0, ALL_1G, THREE_G),)))
    assert c.phase == "submitting" and c.prior == {"layouts": {"1": list(ALL_1G)}, "modes": {}}
    assert state.layouts[NODE] == {0: THREE_G, 1: ALL_1G} and state.apply(c) is c  # once
    state.restore(c)
    assert state.layouts == {NODE: {1: ALL_1G}, "lab-mig02": {0: THREE_G}}
    fresh = State()
    fresh.restore(fresh.apply(change(modes=((0, {"mode": "exclusive"}, {"mode": "shard", "replicas": 4}),))))
    assert fresh.modes == {} and fresh.layouts == {}


def P(node: str, steps=((0, ALL_1G, THREE_G),), line="3 jobs wait for a100_40g_3g.20gb") -> Proposal:
    """A proposal as live.plan makes one: the change, what it starts (not read by the apply side), its line."""
    return Proposal(Change(node, tuple(LayoutStep(*step) for step in steps)), {}, (), 0.0, 0.0, 1.0, line)


def test_proposals_on_nodes_in_flight_are_not_taken_twice():
    state = State()
    state.put(change(node="lab-mig02"))
    acts = d.next_steps(
        d.StepInputs(1100.0, state, frozenset({"lab-mig02"}), 600, 1320, proposals=(P("lab-mig02"), P(NODE), P(NODE)))
    )
    assert acts == [d.StartRelayout("lab-mig02"), d.Take(P(NODE))]


# ---- live/state.py ----------------------------------------------------------------------------


def test_state_round_trips_and_counts_each_ended_change_once(tmp_path):
    store = StateFile(tmp_path / "gpushare-live-state.json")
    state = store.read()
    state.put(change())
    state.put(change("relayout", job=5))
    done = change("done", job=5, ended_at=1500.0)
    state.put(done)
    state.put(done)
    state.layouts[NODE] = {0: THREE_G}
    store.write(state)
    again = store.read()
    assert again.current[NODE] == done and again.layouts == {NODE: {0: THREE_G}}
    assert again.counts == {NODE: {"done": 1}} and len(again.history) == 1
    assert again.changes() == {NODE: 1500.0}
    assert store.lock_path.name == "gpushare-live-state.json.lock"


def test_a_state_file_of_another_format_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(StateError, match="not a gpushare-live-state/2 .or gpushare-live-state/1. file"):
        StateFile(path).read()


def _hold(path, started, release):
    with StateFile(path).locked():
        started.set()
        release.wait(10)


def test_the_state_lock_excludes_another_process(tmp_path):
    import fcntl
    import os

    path = tmp_path / "s.json"
    ctx = multiprocessing.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(path, started, release))
    proc.start()
    try:
        assert started.wait(10)
        fd = os.open(StateFile(path).lock_path, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release.set()
        proc.join(10)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the holder is gone
        os.close(fd)
    finally:
        release.set()
        proc.join(10)


# ---- live/apply.py: runs against the fake Slurm ----------------------------------------------


@dataclass
class Running:
    job_id: int
    node: str
    gres: dict
    end_time: float | None = None


@dataclass
class View:
    name: str
    state: tuple = ("IDLE",)
    reason: str = ""
    gres: dict = field(default_factory=dict)


@dataclass
class Snap:
    now: float
    running: tuple
    nodes: dict
    changes: dict
    locked: frozenset
    pending: tuple = ()


@dataclass
class Plan:
    proposals: tuple
    held: tuple = ()
    demand: tuple = ()
    weights: tuple = ()

    def report(self) -> list[str]:
        return [p.line for p in self.proposals]

    def to_dict(self) -> dict:
        return {"proposals": [p.node for p in self.proposals]}


class FakePlanner:
    """The apply side's Planner: the proposals and running jobs a test sets; with_layouts sets the layouts of
    the node's (one-node) group."""

    def __init__(self):
        self.proposals: tuple = ()
        self.running: tuple = ()
        self.nodes = {NODE: View(NODE)}
        self.seen: list[Snap] = []

    def read_view(self, client, site, now, changes, locked):
        snap = Snap(now, self.running, dict(self.nodes), dict(changes), frozenset(locked))
        self.seen.append(snap)
        return snap

    def plan(self, site, snap, doc):
        return Plan(tuple(p for p in self.proposals if p.node not in snap.locked))

    @staticmethod
    def with_layouts(doc, node, layouts):
        doc = copy.deepcopy(doc)
        group = next(g for g in doc["node_groups"] if g["nodes"] == node)
        group["sharing"] = [{"gpus": gpu, "mode": "mig", "layout": list(layout)} for gpu, layout in layouts.items()]
        return doc

    @staticmethod
    def with_modes(doc, node, modes):
        raise AssertionError(f"no test of the fake planner changes modes ({node}: {modes})")


def admin_policy(tmp_path: Path, enabled: bool = True) -> Path:
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["node_groups"] = [g for g in raw["node_groups"] if g["name"] == "lab-mig"]
    for tier in raw["tiers"]:
        tier["node_groups"] = ["lab-mig"]
    raw["submission"]["aliases"].pop("half", None)
    raw["billing"]["gpu_weights"] = {"A100-SXM4-40GB": 100}
    raw["cluster"]["paths"] = {"slurm_conf_dir": str(tmp_path / "etc-slurm")}
    raw["live"] = {"enabled": enabled, "min_dwell": 3600, "max_wait": 600}
    path = tmp_path / "gpushare.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Clock:
    def __init__(self, ctld):
        self.ctld = ctld

    def __call__(self):
        return self.ctld.now


@pytest.fixture
def world(tmp_path):
    ctld = FakeCtld()
    planner = FakePlanner()
    live = LiveApply(admin_policy(tmp_path), CliClient(ctld), clock=Clock(ctld), planner=planner)
    return live, ctld, planner


def test_a_change_waits_for_the_gpu_jobs_then_runs_the_relayout_job_then_ends(world, tmp_path):
    live, ctld, planner = world
    planner.proposals = (P(NODE),)
    planner.running = (Running(7, NODE, {"gpu:a100_40g_1g.5gb": 1}, ctld.now + 300),)

    first = live.run_once()
    assert lock_name(NODE) in ctld.reservations and not ctld.jobs
    assert live.store.read().current[NODE].phase == "waiting"
    assert not live.policy_file.exists()
    assert any("locked" in line for line in first.lines)

    ctld.now += 60
    second = live.run_once()
    assert [type(a) for a in second.actions] == [d.Wait]
    assert planner.seen[-1].locked == {NODE}

    ctld.now += 300
    planner.running = ()
    live.run_once()
    (job,) = ctld.jobs.values()
    assert job.reservation == lock_name(NODE) and "--policy " + str(live.policy_file) in job.script
    written = yaml.safe_load(live.policy_file.read_text())
    assert written["node_groups"][0]["sharing"][0]["layout"] == list(THREE_G)
    slurm_conf = (tmp_path / "etc-slurm" / "slurm-gpushare.conf").read_text()
    assert "gpu:a100_40g_3g.20gb:1" in slurm_conf and "gpu:a100_40g_1g.5gb:1" in slurm_conf
    # the lock now outlasts the relayout job's time limit
    assert ctld.reservations[lock_name(NODE)]["end"] >= ctld.now + live.relayout_limit
    assert live.store.read().current[NODE].phase == "relayout"

    job.state = "RUNNING"
    ctld.now += 30
    assert [type(a) for a in live.run_once().actions] == [d.Wait]
    ctld.finish(job.job_id)
    ctld.now += 30
    live.run_once()
    state = live.store.read()
    assert state.current[NODE].phase == "done" and state.counts == {NODE: {"done": 1}}
    assert not ctld.reservations and not ctld.drains
    assert planner.seen[-1].changes == {NODE: state.current[NODE].locked_at}  # the snapshot of that run
    live.run_once()
    assert planner.seen[-1].changes == {NODE: ctld.now - 0}  # ended_at: the dwell counts from the end


def test_a_node_without_gpu_jobs_is_relaid_out_in_the_run_that_locks_it(world):
    live, ctld, planner = world
    planner.proposals = (P(NODE),)
    live.run_once()
    assert len(ctld.jobs) == 1 and live.store.read().current[NODE].phase == "relayout"


def test_a_failed_relayout_leaves_the_node_drained_and_counts(world):
    live, ctld, planner = world
    planner.proposals = (P(NODE),)
    live.run_once()
    (job,) = ctld.jobs.values()
    ctld.finish(job.job_id, "FAILED", "1:0")
    ctld.now += 10
    live.run_once()
    state = live.store.read()
    assert state.current[NODE].phase == "failed" and state.counts == {NODE: {"failed": 1}}
    assert ctld.drains == {NODE: f"gpushare relayout failed: job {job.job_id} ended FAILED exit 1:0"}
    assert not ctld.reservations


def test_gpu_jobs_past_max_wait_give_the_change_up(world):
    live, ctld, planner = world
    planner.proposals = (P(NODE),)
    planner.running = (Running(7, NODE, {"gpu:a100_40g_1g.5gb": 1}, None),)
    live.run_once()
    ctld.now += 601
    live.run_once()
    state = live.store.read()
    assert state.current[NODE].phase == "gave_up" and not ctld.reservations and not ctld.jobs


class LocksFirst:
    """The fake Slurm, where someone else (an admin, a planner of an earlier version) creates the node's
    reservation just before this run does."""

    def __init__(self, ctld):
        self.ctld = ctld

    def __call__(self, argv, **kw):
        if list(argv[:3]) == ["scontrol", "create", "reservation"]:
            self.ctld(argv, **kw)
        return self.ctld(argv, **kw)


def test_a_lock_made_by_someone_else_while_this_run_takes_the_node_is_left_alone(world):
    live, ctld, planner = world
    planner.proposals = (P(NODE),)
    live.client = CliClient(LocksFirst(ctld))
    report = live.run_once()
    assert any("another planner holds the node" in line for line in report.lines)
    assert live.store.read().current == {} and not ctld.jobs  # the intent taken back: no record, nothing counted
    assert lock_name(NODE) in ctld.reservations  # theirs, left alone in this run


def test_a_lock_no_change_owns_is_deleted_unless_a_job_runs_in_it(world):
    live, ctld, planner = world
    client = CliClient(ctld)
    relayoutjob.create_lock(client, NODE, 600)  # a run that deleted its change's record, then stopped
    report = live.run_once()
    assert not ctld.reservations and any("no change in flight owns it" in line for line in report.lines)
    relayoutjob.create_lock(client, NODE, 600)
    job = relayoutjob.submit_relayout(client, NODE, "/etc/slurm/live.yaml", log="/var/log/r.log", time_limit_s=60)
    report = live.run_once()
    assert lock_name(NODE) in ctld.reservations and ctld.jobs[job].state == "PENDING"
    assert any("has no change recorded and was not deleted" in line and "in use" in line for line in report.lines)


def test_a_change_recorded_by_another_planner_after_the_snapshot_releases_the_new_lock(world):
    live, ctld, planner = world
    with live.store.locked():
        state = live.store.read()
        state.put(change("done", locked_at=ctld.now - 100, ended_at=ctld.now - 10))
        live.store.write(state)
    planner.plan = lambda site, snap, doc: Plan((P(NODE),))  # the other planner's change, unseen by the planner
    report = live.run_once()
    assert any("another planner recorded a change" in line for line in report.lines)
    assert not ctld.reservations and not ctld.jobs


def test_a_refused_submission_puts_the_live_policy_back(world, tmp_path):
    live, ctld, planner = world
    ctld.fail_sbatch = "Invalid account or account/partition combination specified"
    planner.proposals = (P(NODE),)
    report = live.run_once()
    state = live.store.read()
    assert state.current[NODE].phase == "failed" and "Invalid account" in state.current[NODE].result
    assert state.layouts == {}
    written = yaml.safe_load(live.policy_file.read_text())
    assert written["node_groups"][0]["sharing"][0]["layout"] == "all-1g.5gb"
    assert "gpu:a100_40g_1g.5gb:7" in (tmp_path / "etc-slurm" / "slurm-gpushare.conf").read_text()
    assert not ctld.reservations and any("live policy put back" in line for line in report.lines)


def test_a_proposal_of_two_gpus_is_recorded_and_relaid_out_in_one_job(tmp_path):
    """live.plan proposes every GPU of a node that should change (one Change): the state records them
    all, the live policy gets them all (with_layouts, one set) and one relayout job applies them."""
    from slurm_gpushare.policy.document import with_layouts

    raw = yaml.safe_load(admin_policy(tmp_path).read_text())
    raw["node_groups"][0].update(
        gpu={"model": "A100-SXM4-40GB", "count": 2}, sharing=[{"gpus": "0-1", "mode": "mig", "layout": "all-1g.5gb"}]
    )
    policy = tmp_path / "two-gpus.yaml"
    policy.write_text(yaml.safe_dump(raw, sort_keys=False))
    ctld = FakeCtld()
    planner = FakePlanner()
    planner.with_layouts = with_layouts  # the product's: the node's group split out, validated
    seven = ("7g.40gb",)
    planner.proposals = (P(NODE, ((0, ALL_1G, THREE_G), (1, ALL_1G, seven))),)
    live = LiveApply(policy, CliClient(ctld), clock=Clock(ctld), planner=planner)
    live.run_once()
    assert len(ctld.jobs) == 1  # one relayout job for both GPUs
    state = live.store.read()
    assert state.current[NODE].change.layouts == ((0, ALL_1G, THREE_G), (1, ALL_1G, seven))
    assert state.current[NODE].change.new_layouts == {0: THREE_G, 1: seven} and state.layouts == {
        NODE: {0: THREE_G, 1: seven}
    }
    written = yaml.safe_load(live.policy_file.read_text())
    assert [(e["gpus"], tuple(e["layout"])) for e in written["node_groups"][0]["sharing"]] == [(0, THREE_G), (1, seven)]
    node_line = (tmp_path / "etc-slurm" / "slurm-gpushare.conf").read_text().split("NodeName=lab-mig01")[1]
    assert "7g.40gb:1" in node_line.splitlines()[0] and "3g.20gb:1" in node_line.splitlines()[0]


V1_RECORD = {
    "node": NODE,
    "gpu": 0,
    "old_layout": list(ALL_1G),
    "new_layout": list(THREE_G),
    "phase": "done",
    "locked_at": 1000.0,
    "line": "3 jobs wait",
    "job": 5,
    "submitted_at": 1010.0,
    "ended_at": 1500.0,
    "result": "relayout job 5 COMPLETED",
    "planner": "h:1",
    "prior": {"layouts": {}, "modes": {}},
}


def test_a_state_file_of_format_1_reads_as_the_same_records(tmp_path):
    """Format 1 kept a change as first-GPU fields (gpu, old_layout, new_layout), ``changes`` (every GPU, or none
    for one GPU) and ``modes`` with the old mode as text; it is read into the same records, and written as 2."""
    two = {
        **V1_RECORD,
        "node": "lab-mig02",
        "changes": [[0, list(ALL_1G), list(THREE_G)], [1, list(ALL_1G), ["7g.40gb"]]],
    }
    modes = {
        **V1_RECORD,
        "node": "lab-excl01",
        "gpu": 1,
        "old_layout": ["exclusive"],
        "new_layout": ["mps (100 units)"],
        "changes": [[1, ["exclusive"], ["mps (100 units)"]]],
        "modes": [[1, "exclusive", {"mode": "mps", "units": 100}]],
        "phase": "waiting",
        "job": None,
        "submitted_at": None,
        "ended_at": None,
        "result": "",
        "prior": None,
    }
    doc = {
        "format": "gpushare-live-state/1",
        "current": {NODE: V1_RECORD, "lab-mig02": two, "lab-excl01": modes},
        "layouts": {NODE: {"0": list(THREE_G)}},
        "modes": {},
        "weights": {"lab-mig02": 3},
        "history": [V1_RECORD],
        "counts": {NODE: {"done": 1}},
    }
    store = StateFile(tmp_path / "s.json")
    store.path.write_text(json.dumps(doc))
    state = store.read()
    assert state.current[NODE] == change(
        "done",
        line="3 jobs wait",
        job=5,
        submitted_at=1010.0,
        ended_at=1500.0,
        result="relayout job 5 COMPLETED",
        planner="h:1",
        prior={"layouts": {}, "modes": {}},
    )
    assert state.current["lab-mig02"].change.new_layouts == {0: THREE_G, 1: ("7g.40gb",)}
    excl = state.current["lab-excl01"]
    assert excl.change.to_json()["modes"] == [[1, {"mode": "exclusive"}, {"mode": "mps", "units": 100}]]
    assert excl.in_flight
    assert excl.change.text() == "GPU 1 exclusive -> mps (100 units)"
    assert state.history == [state.current[NODE]] and state.weights == {"lab-mig02": 3}
    store.write(state)
    assert json.loads(store.path.read_text())["format"] == "gpushare-live-state/2" and store.read() == state


def test_a_format_1_record_with_a_field_of_another_format_is_refused(tmp_path):
    store = StateFile(tmp_path / "s.json")
    store.path.write_text(json.dumps({"format": "gpushare-live-state/1", "current": {NODE: {**V1_RECORD, "x": 1}}}))
    with pytest.raises(StateError, match=r"unknown keys \['x'\]"):
        store.read()
    store.path.write_text(
        json.dumps(
            {
                "format": "gpushare-live-state/1",
                "current": {NODE: {**V1_RECORD, "modes": [[0, "mps (lots)", {"mode": "mps"}]]}},
            }
        )
    )
    with pytest.raises(StateError, match="is not a GPU mode as the live planner writes one"):
        store.read()


def test_apply_needs_live_enabled(tmp_path):
    ctld = FakeCtld()
    with pytest.raises(LiveApplyError, match="live.enabled is false"):
        LiveApply(admin_policy(tmp_path, enabled=False), CliClient(ctld), planner=FakePlanner())


def test_unknown_commands_are_refused_by_the_fake():
    with pytest.raises(UnknownCommand):
        FakeCtld()(["scontrol", "reconfigure"])


def test_gpu_jobs_by_node_counts_only_gpu_mps_shard():
    snap = Snap(
        0,
        (
            Running(1, "a", {"gpu:x": 1}),
            Running(2, "a", {"shard": 2}),
            Running(3, "b", {"license": 1}),
            Running(4, "b", {"mps": 0}),
        ),
        {},
        {},
        frozenset(),
    )
    assert gpu_jobs_by_node(snap) == {"a": (1, 2)}


# ---- the node follows the live policy (node/nodeconfig.py, `gpushare node relayout --node-config`) -----------


def test_node_config_live_policy_wins_while_its_file_exists(tmp_path):
    from slurm_gpushare.node.nodeconfig import read_config

    admin, live_file = tmp_path / "policy.yaml", tmp_path / "gpushare-live.yaml"
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"policy: {admin}\nlive_policy: {live_file}\n")
    cfg.chmod(0o644)
    assert read_config(cfg).policy == admin
    live_file.write_text("version: 1\n")
    config = read_config(cfg)
    assert (config.policy, config.admin_policy, config.live_policy) == (live_file, admin, live_file)


def test_relayout_refuses_a_policy_the_node_hooks_do_not_follow(tmp_path):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    admin = admin_policy(tmp_path)
    other = tmp_path / "gpushare-live.yaml"
    cfg = tmp_path / "node.yaml"
    other.write_text(admin.read_text())
    cfg.write_text(f"policy: {admin}\n")  # no live_policy: the hooks follow the admin's policy
    cfg.chmod(0o644)
    res = CliRunner().invoke(
        main, ["node", "relayout", "--policy", str(other), "--node", NODE, "--node-config", str(cfg)]
    )
    assert res.exit_code == 1, res.output
    assert f"the node hooks follow {admin}, not --policy {other}" in res.output


# ---- the real planner (live/plan.py) through the apply path ---------------------------------


class FakeClient(CliClient):
    """The Slurm client's reads from data (jobs, nodes); its changes (drain) go to the fake controller."""

    def __init__(self, ctld, jobs, nodes):
        super().__init__(ctld)
        self._jobs, self._nodes = jobs, nodes

    def jobs(self):
        return list(self._jobs)

    def nodes(self):
        return list(self._nodes)


def test_the_real_planner_proposes_and_the_apply_path_locks_relays_out_and_renders(tmp_path):
    from slurm_gpushare.slurm.model import Node

    raw = yaml.safe_load(admin_policy(tmp_path).read_text())
    spare = {
        **raw["node_groups"][0],
        "name": "lab-mig3",
        "nodes": "lab-mig02",
        "sharing": [{"gpus": 0, "mode": "mig", "layout": ["3g.20gb", "2g.10gb", "1g.5gb"]}],
    }
    raw["node_groups"].append(spare)
    for tier in raw["tiers"]:
        tier["node_groups"] = ["lab-mig", "lab-mig3"]
    raw["live"].update({"min_pending": 0, "max_wait": 600})
    policy = tmp_path / "two.yaml"
    policy.write_text(yaml.safe_dump(raw, sort_keys=False))
    ctld = FakeCtld()
    now = int(ctld.now)

    def job(i, state, gres, node="", reason="None"):
        return carol_job(i, state, gres, now, node, reason=reason)

    jobs = [job(1, "RUNNING", f"gpu:{'a100_40g_1g.5gb'}", NODE)] + [
        job(i, "PENDING", "gpu:a100_40g_3g.20gb", reason="ReqNodeNotAvail") for i in (2, 3, 4)
    ]

    def mig_node(name, gres, state=("MIXED",), reason=""):
        return Node(name, state, reason, gres, {}, (), (), 1, ("batch",), 8, 0, 16000, 0)

    nodes = [
        mig_node(NODE, {"gpu:a100_40g_1g.5gb": 7}),
        mig_node(
            "lab-mig02",
            {"gpu:a100_40g_3g.20gb": 1, "gpu:a100_40g_2g.10gb": 1, "gpu:a100_40g_1g.5gb": 1},
            ("IDLE", "DRAIN"),
            "out for repair",
        ),
    ]
    live = LiveApply(policy, FakeClient(ctld, jobs, nodes), clock=Clock(ctld))
    first = live.run_once()
    assert [p.node for p in first.plan.proposals] == [NODE], first.plan.report()
    (new,) = first.plan.proposals[0].change.new_layouts.values()
    assert "3g.20gb" in new and lock_name(NODE) in ctld.reservations and not ctld.jobs
    jobs[0] = job(1, "COMPLETED", "gpu:a100_40g_1g.5gb")  # the 1g job ended
    live.client._jobs = jobs[1:]
    ctld.now += 120
    second = live.run_once()
    assert not second.plan.proposals  # the node is locked: held, not proposed again
    (relayout,) = ctld.jobs.values()
    assert relayout.options["partition"] == "batch"
    written = yaml.safe_load(live.policy_file.read_text())
    assert written["node_groups"][0]["sharing"][-1]["layout"] == list(new)
    assert (
        "gpu:a100_40g_3g.20gb"
        in (tmp_path / "etc-slurm" / "slurm-gpushare.conf").read_text().split("NodeName=lab-mig01")[1].splitlines()[0]
    )


def test_a_layout_the_policy_refuses_ends_the_attempt_and_releases_the_lock(world):
    live, ctld, planner = world
    planner.proposals = (P(NODE, ((0, ALL_1G, ("7g.40gb", "1g.5gb")),)),)

    def refuse(doc, node, layouts):
        raise ValueError(f"node {node}: {layouts} does not fit")

    planner.with_layouts = refuse
    report = live.run_once()
    assert live.store.read().current[NODE].phase == "failed"
    assert not ctld.reservations and not ctld.jobs
    assert any("does not fit" in line for line in report.lines)


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "--apply", "--demand", "openb:x.csv"], "No such option '--apply'"),  # the static plan: its own only
        (["live", "report", "--every", "5"], "No such option '--every'"),
        (["live", "apply"], "live.enabled is false"),
        (["plan", "--live", "--apply"], "live.enabled is false"),  # the alias of `live apply`, for one release
    ],
)
def test_live_apply_options_are_checked(tmp_path, args, message):
    from click.testing import CliRunner

    from slurm_gpushare.cli import main

    policy = admin_policy(tmp_path, enabled=False)
    res = CliRunner().invoke(main, [*args, "--policy", str(policy)], obj={"runner": FakeCtld()})
    assert res.exit_code != 0 and message in res.output, res.output


def test_a_change_is_layouts_or_modes_and_round_trips():
    with pytest.raises(ValueError, match="MIG layouts or sharing modes"):
        Change(NODE)
    with pytest.raises(ValueError, match="MIG layouts or sharing modes"):
        Change(NODE, (LayoutStep(0, ALL_1G, THREE_G),), (ModeStep(1, Share(), Share(Mode.MPS)),))
    three = Change(
        NODE, (LayoutStep(0, ALL_1G, THREE_G), LayoutStep(1, ALL_1G, THREE_G), LayoutStep(3, ALL_1G, ALL_1G))
    )
    assert three.text() == f"GPUs 0-1 to {'+'.join(THREE_G)} and GPU 3 to {'+'.join(ALL_1G)}"
    assert Change.from_json(json.loads(json.dumps(three.to_json()))) == three
    mps = Change(NODE, modes=(ModeStep(1, Share(), Share.from_entry({"mode": "mps", "units": 100})),))
    assert Change.from_json(json.loads(json.dumps(mps.to_json()))) == mps
    assert (mps.first(), mps.gpus, mps.new_layouts) == (("exclusive", "mps (100 units)"), (1,), {})
