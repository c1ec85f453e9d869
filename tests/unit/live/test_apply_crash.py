"""The live apply path (live/apply.py) stopped after each of its steps, as by `kill -9`, then run again by a fresh
applier: the change is finished or undone, no reservation is left without an owner, there is never a second
relayout job for the node, and the live policy says what the state file says.

A step is a side effect: a write of the state file, of the live policy, of the rendered configuration, or a Slurm
command that changes something. ``Crash`` (a BaseException: no ``except`` of the apply path takes it) is raised
right after the step named by the test took effect, which is what a process killed there leaves behind. The
fakes are the same as tests/unit/live/test_apply.py's: the stateful fake Slurm (tests/unit/live_fakes.py) and a
planner that proposes one change.
"""

from __future__ import annotations

import pytest
import yaml

from slurm_gpushare.live.apply import LiveApply
from slurm_gpushare.slurm import relayoutjob
from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.relayoutjob import lock_name
from tests.unit.crash_support import Crash, Crasher
from tests.unit.live.test_apply import ALL_1G, NODE, THREE_G, Clock, FakePlanner, P, Plan, admin_policy
from tests.unit.live_fakes import FakeCtld

# Every step of one change of a node with no GPU job, in order: the first run takes the node and submits the
# relayout job; the run after the job has ended records it done. test_the_steps_are_these checks the list.
STEPS = (
    "state:locking",
    "scontrol create reservation",
    "state:waiting",
    "state:submitting",
    "live policy",
    "configuration",
    "scontrol update reservation",
    "sbatch",
    "state:relayout",
    "scontrol delete reservation",
    "state:done",
)
BEFORE_SBATCH = STEPS[: STEPS.index("sbatch")]


def slurm_step(argv) -> str | None:
    """The step a Slurm command is (None: it changes nothing)."""
    argv = list(argv)
    if argv[:3] == ["scontrol", "create", "reservation"]:
        return "scontrol create reservation"
    if argv[:2] == ["scontrol", "update"] and argv[2].startswith("ReservationName="):
        return "scontrol update reservation"
    if argv[:2] == ["scontrol", "delete"]:
        return "scontrol delete reservation"
    if argv[:2] == ["scontrol", "update"]:
        return "scontrol update node"
    return "sbatch" if argv[0] == "sbatch" else None


class CrashingSlurm:
    def __init__(self, ctld: FakeCtld, crasher: Crasher):
        self.ctld, self.crasher = ctld, crasher

    def __call__(self, argv, **kw):
        res = self.ctld(argv, **kw)
        step = slurm_step(argv)
        if step is not None:
            self.crasher.after(step)
        return res


class OneChange(FakePlanner):
    """Proposes lab-mig01's change until a change of it is recorded (the real planner's min_dwell then holds it)."""

    def plan(self, site, snap, doc):
        return Plan(tuple(p for p in self.proposals if p.node not in snap.locked and p.node not in snap.changes))


@pytest.fixture
def crashing(tmp_path, monkeypatch):
    """(make an applier: a fresh one each call, as a new process; the fake Slurm; the planner; the crasher)."""
    import slurm_gpushare.live.apply as apply_module
    import slurm_gpushare.outfiles as outfiles

    ctld, crasher, planner = FakeCtld(), Crasher(), OneChange()
    planner.proposals = (P(NODE),)
    policy = admin_policy(tmp_path)
    write_policy, write_all = apply_module.atomic_write, outfiles.write_all

    def policy_then(path, text, *a, **kw):
        write_policy(path, text, *a, **kw)
        crasher.after("live policy")

    def configuration_then(*a, **kw):
        out = write_all(*a, **kw)
        crasher.after("configuration")
        return out

    monkeypatch.setattr(apply_module, "atomic_write", policy_then)
    monkeypatch.setattr(outfiles, "write_all", configuration_then)

    def applier() -> LiveApply:
        slurm = CrashingSlurm(ctld, crasher)
        live = LiveApply(policy, CliClient(slurm), clock=Clock(ctld), planner=planner)
        write_state = live.store.write

        def state_then(state):
            write_state(state)
            crasher.after(f"state:{state.current[NODE].phase}" if NODE in state.current else "state")

        live.store.write = state_then
        return live

    return applier, ctld, planner, crasher


def run_on(live: LiveApply, ctld: FakeCtld, runs: int = 4) -> None:
    """Runs of one applier, every relayout job pending after a run ending COMPLETED (the node relaid out)."""
    for _ in range(runs):
        live.run_once()
        for job in ctld.jobs.values():
            if job.state == "PENDING":
                ctld.finish(job.job_id)
        ctld.now += 30


def layout_of(live: LiveApply):
    """The live policy's layout of lab-mig01 (None: no live policy written) and its line in the configuration."""
    if not live.policy_file.exists():
        return None, None
    doc = yaml.safe_load(live.policy_file.read_text())
    path = live.conf_dir / "slurm-gpushare.conf"
    conf = path.read_text().split(f"NodeName={NODE}")[1].splitlines()[0] if path.exists() else None
    return doc["node_groups"][0]["sharing"][0]["layout"], conf


def test_the_steps_are_these(crashing):
    applier, ctld, planner, crasher = crashing
    run_on(applier(), ctld, runs=2)
    assert tuple(crasher.seen) == STEPS


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_after_each_step_is_finished_by_the_next_run(crashing, step):
    applier, ctld, planner, crasher = crashing
    crasher.at = step
    with pytest.raises(Crash):
        run_on(applier(), ctld)
    assert crasher.fired
    run_on(applier(), ctld)  # a new process
    state = applier().store.read()
    relayouts = [j for j in ctld.jobs.values() if j.name == lock_name(NODE)]
    assert len(relayouts) == 1, f"{len(relayouts)} relayout jobs for {NODE}"
    assert not ctld.reservations, f"reservations left: {sorted(ctld.reservations)}"
    assert state.current[NODE].phase == "done" and state.current[NODE].job == relayouts[0].job_id
    assert state.counts == {NODE: {"done": 1}} and not state.in_flight()
    assert state.layouts == {NODE: {0: THREE_G}}
    layout, conf = layout_of(applier())
    assert layout == list(THREE_G) and "a100_40g_3g.20gb:1" in conf


@pytest.mark.parametrize("step", BEFORE_SBATCH)
def test_a_crash_before_the_job_then_the_lock_gone_is_undone(crashing, step):
    """The run stopped before sbatch and the lock ended before the next run (its duration, or deleted by hand).
    Stopped before the change was recorded waiting: nothing was started, the intent is taken back and the change
    proposed again (done in a later run). After: the change is lost, and a live policy it wrote is put back."""
    applier, ctld, planner, crasher = crashing
    crasher.at = step
    with pytest.raises(Crash):
        run_on(applier(), ctld)
    ctld.reservations.pop(lock_name(NODE), None)
    run_on(applier(), ctld)
    state = applier().store.read()
    layout, conf = layout_of(applier())
    assert not ctld.reservations and not state.in_flight()
    if step in ("state:locking", "scontrol create reservation"):
        assert state.current[NODE].phase == "done" and len(ctld.jobs) == 1 and state.counts == {NODE: {"done": 1}}
        assert state.layouts == {NODE: {0: THREE_G}} and layout == list(THREE_G)
        return
    assert state.current[NODE].phase == "lost" and not ctld.jobs and state.layouts == {}
    assert layout in (None, "all-1g.5gb"), f"live policy left at {layout} by a change that was lost"
    assert conf is None or "a100_40g_1g.5gb:7" in conf


def test_the_job_of_a_stopped_run_is_found_in_accounting_when_slurmctld_has_forgotten_it(crashing):
    applier, ctld, planner, crasher = crashing
    crasher.at = "sbatch"
    with pytest.raises(Crash):
        applier().run_once()
    (job,) = ctld.jobs.values()
    ctld.finish(job.job_id)
    job.in_squeue = False  # MinJobAge after its end
    ctld.now += 600
    report = applier().run_once()
    assert any(f"relayout job {job.job_id} found by its name" in line for line in report.lines)
    run_on(applier(), ctld, runs=1)
    state = applier().store.read()
    assert len(ctld.jobs) == 1 and state.current[NODE].phase == "done" and not ctld.reservations


def test_a_users_job_named_like_the_relayout_job_is_not_taken_for_it(crashing):
    """Anyone may name a job gpushare-relayout-<node>; only root's is the relayout job."""
    applier, ctld, planner, crasher = crashing
    crasher.at = "state:submitting"
    with pytest.raises(Crash):
        applier().run_once()
    decoy = ctld.user_job(lock_name(NODE), "mallory")
    run_on(applier(), ctld)
    state = applier().store.read()
    (ours,) = [j for j in ctld.jobs.values() if j.user == "root"]
    assert state.current[NODE].job == ours.job_id != decoy and state.current[NODE].phase == "done"


def test_the_job_of_the_nodes_last_change_is_not_taken_for_this_ones(crashing):
    """An earlier change's relayout job has the same name (and, on a skewed clock, may seem submitted after this
    change began): the job ids the state file has recorded are never taken for a new change's."""
    from slurm_gpushare.live.state import State, StateFile
    from tests.unit.live.test_apply import change

    applier, ctld, planner, crasher = crashing
    client = CliClient(ctld)
    relayoutjob.create_lock(client, NODE, 600)
    earlier = relayoutjob.submit_relayout(client, NODE, "/etc/slurm/live.yaml", log="/var/log/r.log", time_limit_s=60)
    ctld.finish(earlier)
    relayoutjob.delete_lock(client, NODE)
    state = State()
    state.put(
        change("done", steps=((0, THREE_G, ALL_1G),), job=earlier, locked_at=ctld.now - 9000, ended_at=ctld.now - 7200)
    )
    StateFile(applier().store.path).write(state)
    planner.plan = lambda site, snap, doc: Plan(
        tuple(planner.proposals) if snap.changes[NODE] < ctld.now - 3600 else ()
    )
    crasher.at = "state:submitting"
    with pytest.raises(Crash):
        applier().run_once()
    run_on(applier(), ctld)
    state = applier().store.read()
    assert state.current[NODE].phase == "done" and state.current[NODE].job not in (None, earlier)
    assert len(ctld.jobs) == 2 and state.counts == {NODE: {"done": 2}}
