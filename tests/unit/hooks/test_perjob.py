"""Per-job MIG on a node (node/perjob.py; issue 35): the prolog makes the job's instance at the default rule's
placement beside its neighbours, the task prolog hands the job exactly that instance, the epilog destroys it; a
slice that cannot be made refuses the job and never the node; a crash after the create is cleaned by the epilog
and by the health check's reconcile; the fake NVML's latencies change none of it. On the fake NVML, through the
hooks' entry points (tests/unit/hooks_support.HookNode, the perjob-lab test policy)."""

from __future__ import annotations

import io

import pytest
import yaml

from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hardware import get_model, migplace
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import perjob, taskprolog
from slurm_gpushare.node.epilog import Killer
from slurm_gpushare.node.jobenv import mig_record
from slurm_gpushare.node.journal import Device, Journal, JournalStore
from slurm_gpushare.node.perjob import (
    DestroySlice,
    GpuSlices,
    SlicePlan,
    SliceRefused,
    destroys,
    plan_slice,
)
from slurm_gpushare.node.reconcile import execute_reconcile, plan_for_node
from slurm_gpushare.policy.share import MAX_SLICE_REQUEUES
from slurm_gpushare.proc import Result
from tests.unit.hooks_support import ROOT, HookNode

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
A100 = get_model("A100-SXM4-40GB")
ALLOWED = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


def never_drain(argv, **_kw):
    """A runner for the hooks' drain call that fails the test: per-job MIG never drains a node."""
    raise AssertionError(f"the node was drained: {argv}")


def no_scontrol(argv, **_kw):
    return Result(tuple(argv), 0, "", "")


@pytest.fixture
def node(tmp_path):
    return HookNode(tmp_path, "lab-perjob01", POLICY)


def env(node: HookNode, job: int, profile: str | None, gpus: str = "0") -> dict:
    extra = {} if profile is None else {"SLURM_JOB_EXTRA": f"gpushare-mig={profile}"}
    return node.env(job, gpus, **extra)


def instances(node: HookNode, index: int = 0) -> list[tuple[str, int]]:
    with node.backend() as backend:
        return sorted(
            (A100.profile_for_constant(g.profile_constant).name, g.start) for g in backend.gpu_instances(index)
        )


def task_prolog(node: HookNode, job: int, gpus: str = "0") -> tuple[int, str]:
    out = io.StringIO()
    rc = taskprolog.main(node.env(job, gpus), out=out, err=io.StringIO())
    return rc, out.getvalue()


# ---- the record and the plan (pure) ------------------------------------------------------------------


def test_the_record_is_read_strictly():
    assert mig_record("gpushare-mig=1g.10gb+me") == "1g.10gb+me"
    assert mig_record(None) is None and mig_record("") is None
    for hostile in ("gpushare-mig=1g.5gb\n", "gpushare-mig=1g.5gb;rm -rf /", "mine", "gpushare-mig=$(id)"):
        assert mig_record(hostile) == ""  # present, not a record: nothing of it is kept


def test_the_plan_takes_the_default_rules_start_and_never_reuses():
    dev = Device(0, 0, "GPU-a", "mig", profile="1g.5gb")
    seen = GpuSlices(((_gi(1, "3g.20gb", 0)),), {p.nvml_constant: p.profile_id for p in A100.mig_profiles})
    plan = plan_slice(dev, A100.name, ALLOWED, seen)
    want = migplace.choose(A100, "1g.5gb", [("3g.20gb", 0)], allowed=ALLOWED)
    assert isinstance(plan, SlicePlan) and plan.device.start == want.start and not want.reuse
    assert plan.profile_id == A100.profile("1g.5gb").profile_id
    # an idle 1g.5gb beside it is not reused: a new one is made elsewhere
    seen = GpuSlices((_gi(1, "1g.5gb", 6),), seen.profile_ids)
    assert plan_slice(dev, A100.name, ALLOWED, seen).device.start != 6


def test_the_plan_refuses_what_cannot_be_made():
    ids = {p.nvml_constant: p.profile_id for p in A100.mig_profiles}
    full = GpuSlices((_gi(1, "7g.40gb", 0),), ids)
    assert "no free placement for 1g.5gb" in plan_slice(_dev("1g.5gb"), A100.name, ALLOWED, full).why
    assert "is not one of the profiles" in plan_slice(_dev("1g.10gb"), A100.name, ALLOWED, full).why
    assert "not gpushare's record" in plan_slice(_dev(""), A100.name, ALLOWED, full).why
    off = plan_slice(_dev("1g.5gb"), A100.name, ALLOWED, GpuSlices((), {}))
    assert isinstance(off, SliceRefused) and "is MIG mode on?" in off.why


def test_the_epilog_destroys_only_what_no_other_job_claims():
    mine = Journal(5, 1, 1, "n", "ready", (Device(0, 0, "GPU-a", "mig", gi=1, ci=0, profile="1g.5gb", start=6),))
    other = Journal(6, 1, 1, "n", "ready", (Device(0, 0, "GPU-a", "mig", gi=2, ci=0, profile="1g.5gb", start=6),))
    assert destroys(mine, {5: mine}) == [DestroySlice(mine.devices[0])]
    assert destroys(mine, {5: mine, 6: other}) == []
    assert Journal.from_json(mine.to_json()) == mine
    plain = Device(0, 0, "GPU-a", "mig", "MIG-1", 1, 0, "MIG-1")
    assert "profile" not in plain.to_json() and "start" not in plain.to_json()  # fixed MIG journals as before


def _dev(profile: str) -> Device:
    return Device(0, 0, "GPU-a", "mig", profile=profile)


def _gi(gi_id: int, profile: str, start: int):
    from slurm_gpushare.gpu.backend import GpuInstance

    p = A100.profile(profile)
    return GpuInstance(gi_id, p.profile_id, start, p.memory_slices, p.nvml_constant)


# ---- the hooks on the fake NVML ------------------------------------------------------------------------


def test_a_slice_is_made_beside_a_running_neighbour_and_handed_to_the_job(node):
    assert prolog_hook.main(env(node, 51, "3g.20gb"), runner=never_drain) == 0
    first = JournalStore(node.state_dir).read(51).devices[0]
    FakeNvml(node.state).add_process(0, 4242, first.gi, first.ci)  # the neighbour runs
    before = instances(node)
    assert prolog_hook.main(env(node, 52, "2g.10gb"), runner=never_drain) == 0
    dev = JournalStore(node.state_dir).read(52).devices[0]
    want = migplace.choose(A100, "2g.10gb", before, allowed=ALLOWED)
    assert (dev.profile, dev.start) == ("2g.10gb", want.start) and instances(node) == sorted(
        [*before, ("2g.10gb", want.start)]
    )
    with node.backend() as backend:
        uuid = next(m.uuid for m in backend.mig_devices(0) if (m.gi_id, m.ci_id) == (dev.gi, dev.ci))
        assert [p.pid for p in backend.processes(0)] == [4242]  # the neighbour was not disturbed
    assert dev.mig_uuid == dev.visible == uuid and uuid.startswith("MIG-")
    assert task_prolog(node, 52) == (0, f"export CUDA_DEVICE_ORDER=PCI_BUS_ID\nexport CUDA_VISIBLE_DEVICES={uuid}\n")


def test_an_occupied_gpu_refuses_the_job_not_the_node(node, capsys):
    assert prolog_hook.main(env(node, 61, "7g.40gb"), runner=never_drain) == 0
    assert prolog_hook.main(env(node, 62, "1g.5gb"), runner=never_drain) == 0
    journal = JournalStore(node.state_dir).read(62)
    assert journal.state == "ready" and journal.devices == ()
    assert "no free placement for 1g.5gb" in capsys.readouterr().err
    rc, out = task_prolog(node, 62)
    assert rc == 1 and out.startswith("print gpushare-task-prolog: job 62 is not run on this node: the MIG instance")
    assert "node stays in service" in out
    assert epilog_hook.main(env(node, 62, "1g.5gb"), runner=never_drain) == 0
    assert instances(node) == [("7g.40gb", 0)]  # the neighbour's instance is untouched


def test_a_bad_record_refuses_the_job(node):
    assert prolog_hook.main(node.env(71, "1", SLURM_JOB_EXTRA="gpushare-mig=1g.5gb;reboot"), runner=never_drain) == 0
    rc, out = task_prolog(node, 71, "1")
    assert rc == 1 and "not gpushare s record" in out and instances(node, 1) == []


def test_the_epilog_destroys_compute_then_gpu_instance(node):
    assert prolog_hook.main(env(node, 81, "4g.20gb"), runner=never_drain) == 0
    assert instances(node) == [("4g.20gb", 0)]
    assert epilog_hook.main(env(node, 81, "4g.20gb"), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []
    assert epilog_hook.main(env(node, 81, "4g.20gb"), runner=never_drain) == 0  # a second run: nothing to do


def test_a_crash_after_the_create_is_cleaned_by_the_epilog(node):
    """The prolog was killed after NVML made the GI and before the journal named it: the journal holds the
    intent (profile, start), and the epilog finds the GI by its start."""
    _crashed(node, 91)
    assert epilog_hook.main(env(node, 91, "2g.10gb"), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []


def test_a_crash_after_the_create_is_cleaned_by_the_health_checks_reconcile(node):
    _crashed(node, 92)
    store = JournalStore(node.state_dir)
    with node.backend() as backend, store.locked():
        journals = store.all()
        plan = plan_for_node(journals, set(), backend, str(node.state_dir), store)
        assert [type(a).__name__ for a in plan.orphans[92]] == ["WriteJournal", "DestroySlice", "RemoveJournal"]
        assert execute_reconcile(plan, store, node.mps, Killer(backend), journals) == []
    assert instances(node) == [] and node.journals() == []


def _crashed(node: HookNode, job: int) -> None:
    with node.backend() as backend:
        profile = A100.profile("2g.10gb")
        backend.create_gpu_instance(0, profile.profile_id, 4)
    intent = Device(0, 0, "GPU-x", "mig", profile="2g.10gb", start=4)
    JournalStore(node.state_dir).write(Journal(job, 1, 1, node.node, "preparing", (intent,)))


def test_latencies_change_nothing(node):
    fake = FakeNvml(node.state)
    for call in ("nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy"):
        fake.set_latency(call, 0.05)
    fake.set_latency("nvmlDeviceGetMigDeviceHandleByIndex", 0.01)
    for job, profile in ((101, "1g.5gb"), (102, "3g.20gb"), (103, "2g.10gb")):
        assert prolog_hook.main(env(node, job, profile), runner=never_drain) == 0
    made = instances(node)
    assert len(made) == 3 and len({s for _n, s in made}) == 3
    for job in (101, 102, 103):
        assert task_prolog(node, job)[0] == 0
        assert epilog_hook.main(env(node, job, None), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []


# ---- a whole GPU on a per-job GPU ----------------------------------------------------------------------


def test_a_whole_gpu_job_gets_the_full_instance_and_the_epilog_destroys_it(node):
    """No record in extra: Slurm gave the job the GPU as gpu, so no slice is on it; the job gets the model's full
    instance (7g.40gb) even though the policy's profiles limit slices, and its MIG UUID like a slice."""
    assert prolog_hook.main(env(node, 111, None), runner=never_drain) == 0
    assert instances(node) == [("7g.40gb", 0)]
    dev = JournalStore(node.state_dir).read(111).devices[0]
    assert (dev.profile, dev.start, dev.mode) == ("7g.40gb", 0, "mig-whole") and dev.mig_uuid.startswith("MIG-")
    assert task_prolog(node, 111) == (
        0,
        f"export CUDA_DEVICE_ORDER=PCI_BUS_ID\nexport CUDA_VISIBLE_DEVICES={dev.mig_uuid}\n",
    )
    assert epilog_hook.main(env(node, 111, None), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []


def test_the_full_instance_is_made_whatever_the_policys_profiles(node):
    dev = Device(0, 0, "GPU-a", "mig-whole", profile="7g.40gb")
    ids = {p.nvml_constant: p.profile_id for p in A100.mig_profiles}
    plan = plan_slice(dev, A100.name, ("1g.5gb",), GpuSlices((), ids))
    assert isinstance(plan, SlicePlan) and plan.device.start == 0
    assert plan.profile_id == A100.profile("7g.40gb").profile_id
    unknown = plan_slice(Device(0, 0, "GPU-a", "mig-whole", profile=""), "no-such-gpu", ALLOWED, GpuSlices((), ids))
    assert "no whole-GPU MIG profile for no-such-gpu" in unknown.why


def test_a_job_with_two_whole_per_job_gpus_gets_one_full_instance_on_each(node):
    assert prolog_hook.main(env(node, 112, None, gpus="0,1"), runner=never_drain) == 0
    assert instances(node, 0) == instances(node, 1) == [("7g.40gb", 0)]
    uuids = [d.visible for d in JournalStore(node.state_dir).read(112).devices]
    assert task_prolog(node, 112, "0,1")[1].endswith(f"export CUDA_VISIBLE_DEVICES={','.join(uuids)}\n")
    assert epilog_hook.main(env(node, 112, None, gpus="0,1"), runner=never_drain) == 0
    assert instances(node, 0) == instances(node, 1) == []


def test_a_whole_gpu_job_waits_for_an_ended_jobs_instance_then_gets_the_gpu(node, monkeypatch):
    """The ended job's epilog has not destroyed its instance yet: the prolog waits (holding no journal lock, so
    that epilog can run) and makes the full instance once it is gone."""
    import threading

    monkeypatch.setattr(perjob, "WHOLE_WAIT_STEP_S", 0.05)
    assert prolog_hook.main(env(node, 113, "3g.20gb"), runner=never_drain) == 0  # the job that ended
    epilog = threading.Timer(0.3, lambda: epilog_hook.main(env(node, 113, "3g.20gb"), runner=never_drain))
    epilog.start()
    try:
        assert prolog_hook.main(env(node, 114, None), runner=never_drain) == 0
    finally:
        epilog.join()
    assert instances(node) == [("7g.40gb", 0)] and JournalStore(node.state_dir).read(114).devices[0].mig_uuid


def test_a_whole_gpu_job_refused_after_the_wait_never_the_node(node, monkeypatch, capsys):
    monkeypatch.setattr(perjob, "WHOLE_WAIT_S", 0.2)
    monkeypatch.setattr(perjob, "WHOLE_WAIT_STEP_S", 0.05)
    with node.backend() as backend:
        backend.create_gpu_instance(0, A100.profile("1g.5gb").profile_id, 6)  # an ended job's, epilog not yet done
    assert prolog_hook.main(env(node, 115, None), runner=never_drain) == 0
    rc, out = task_prolog(node, 115)
    assert rc == 1 and "not run on this node" in out
    assert "still there after 0.2 s" in capsys.readouterr().err
    assert instances(node) == [("1g.5gb", 6)]
    assert epilog_hook.main(env(node, 115, None), runner=never_drain) == 0 and node.journals() == []


def test_a_refusal_on_the_second_gpu_keeps_the_first_instance_for_the_epilog(node, monkeypatch):
    """Two whole per-job GPUs, the second occupied: the job is refused, and the full instance made on the first
    stays in its journal, so the epilog destroys it (nothing is left that no journal names)."""
    monkeypatch.setattr(perjob, "WHOLE_WAIT_S", 0.0)
    with node.backend() as backend:
        backend.create_gpu_instance(1, A100.profile("1g.5gb").profile_id, 6)
    assert prolog_hook.main(env(node, 116, None, gpus="0,1"), runner=never_drain) == 0
    journal = JournalStore(node.state_dir).read(116)
    assert [d.gpu_index for d in journal.devices] == [0] and instances(node, 0) == [("7g.40gb", 0)]
    assert task_prolog(node, 116, "0,1")[0] == 1
    assert epilog_hook.main(env(node, 116, None, gpus="0,1"), runner=never_drain) == 0
    assert instances(node, 0) == [] and instances(node, 1) == [("1g.5gb", 6)] and node.journals() == []


# ---- a refused job is requeued (or fails, by policy) ------------------------------------------------------


def _occupy(node: HookNode) -> None:
    with node.backend() as backend:
        backend.create_gpu_instance(0, A100.profile("7g.40gb").profile_id, 0)  # no 1g.5gb fits beside it


def _health(node: HookNode, slurm):
    from slurm_gpushare.hooks import health as health_hook

    env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config)}
    return health_hook.health(env, runner=slurm, mps=node.mps, is_device=lambda _p: True, out=lambda _l: None)


def test_a_refused_batch_job_is_requeued_once_by_the_health_check(node):
    from tests.unit.hooks.test_repair import FakeSlurm

    _occupy(node)
    assert prolog_hook.main(env(node, 121, "1g.5gb"), runner=never_drain) == 0
    rc, out = task_prolog(node, 121)
    assert rc == 1 and "The job is requeued" in out
    assert perjob.requeue_requests(str(node.state_dir)).keys() == {121}
    assert epilog_hook.main(env(node, 121, "1g.5gb"), runner=never_drain) == 0  # its journal goes, the request stays
    slurm = FakeSlurm(node.node, "gpu:a100_40g:2,shard:30")
    slurm.ended = {121}  # the batch job failed in its task prolog; Slurm still knows it (MinJobAge)
    report = _health(node, slurm)
    assert slurm.requeued == [121] and any("job 121: its MIG instance" in r for r in report.findings.repaired)
    assert perjob.requeue_requests(str(node.state_dir)) == {}
    _health(node, slurm)
    assert slurm.requeued == [121]  # once


def test_an_interactive_job_cannot_be_requeued_and_fails_with_the_message(node):
    from tests.unit.hooks.test_repair import FakeSlurm

    _occupy(node)
    assert prolog_hook.main(env(node, 122, "1g.5gb"), runner=never_drain) == 0
    slurm = FakeSlurm(node.node, "gpu:a100_40g:2,shard:30", jobs={122: "gres/shard:2"})
    slurm.interactive = {122}
    report = _health(node, slurm)
    assert slurm.requeued == [] and any("job 122" in n and "Slurm refused" in n for n in report.findings.notes)
    assert perjob.requeue_requests(str(node.state_dir)) == {} and "DRAIN" not in slurm.flags


def test_no_requeue_after_the_limit_or_where_the_policy_says_fail(node, tmp_path):
    _occupy(node)
    restarts = {"SLURM_JOB_RESTART_COUNT": str(MAX_SLICE_REQUEUES)}
    assert prolog_hook.main({**env(node, 123, "1g.5gb"), **restarts}, runner=never_drain) == 0
    rc, out = task_prolog(node, 123)
    assert rc == 1 and f"not requeued again, requeued {MAX_SLICE_REQUEUES} times" in out and "Submit it again" in out
    assert perjob.requeue_requests(str(node.state_dir)) == {}
    raw = yaml.safe_load(POLICY.read_text())
    raw["node_groups"][3]["sharing"][0]["on_slice_failure"] = "fail"
    policy = tmp_path / "fail.yaml"
    policy.write_text(yaml.safe_dump(raw))
    (tmp_path / "fail").mkdir()
    failing = HookNode(tmp_path / "fail", node.node, policy)
    _occupy(failing)
    assert prolog_hook.main(env(failing, 124, "1g.5gb"), runner=never_drain) == 0
    assert task_prolog(failing, 124)[0] == 1 and perjob.requeue_requests(str(failing.state_dir)) == {}


# ---- instances nobody journaled ------------------------------------------------------------------------


def test_reconcile_destroys_instances_no_journal_names_and_keeps_a_live_jobs(node, capsys):
    """A GI on a per-job GPU that no journal names (a prolog killed between the create and the journal write, or
    one made by hand) is destroyed, under the GPU lock, when no process uses it; a live job's is never touched,
    nor one a process uses (a note)."""
    assert prolog_hook.main(env(node, 131, "3g.20gb"), runner=never_drain) == 0  # a live job
    live = JournalStore(node.state_dir).read(131).devices[0]
    free = migplace.legal_starts(A100, "1g.5gb", instances(node))[0]
    with node.backend() as backend:
        stray = backend.create_gpu_instance(0, A100.profile("1g.5gb").profile_id, free)
        used = backend.create_gpu_instance(1, A100.profile("2g.10gb").profile_id, 0)
        ci = backend.create_compute_instance(1, used.id, A100.profile("2g.10gb").full_compute_constant)
    FakeNvml(node.state).add_process(1, 4343, used.id, ci.id)
    store = JournalStore(node.state_dir)
    with node.backend() as backend, store.locked():
        journals = store.all()
        plan = plan_for_node(journals, {131}, backend, str(node.state_dir), store, per_job=(0, 1))
        assert [(a.device.gpu_index, a.device.gi, a.device.start) for a in plan.instances] == [(0, stray.id, free)]
        assert any("processes 4343 use it: left" in n for n in plan.notes)
        assert any("no journal names" in line for line in plan.lines(node.node))
        assert execute_reconcile(plan, store, node.mps, Killer(backend), journals) == []
    assert instances(node, 0) == [("3g.20gb", live.start)] and instances(node, 1) == [("2g.10gb", 0)]
    assert JournalStore(node.state_dir).read(131) is not None


def test_an_instance_is_not_destroyed_when_a_process_started_in_it_since_the_plan(node):
    from slurm_gpushare.node.perjob import destroy_unjournaled, unjournaled

    with node.backend() as backend:
        gi = backend.create_gpu_instance(0, A100.profile("1g.5gb").profile_id, 3)
        ci = backend.create_compute_instance(0, gi.id, A100.profile("1g.5gb").full_compute_constant)
        (found,), _ = unjournaled({}, 0, "GPU-x", backend.gpu_instances(0), backend.processes(0))
        FakeNvml(node.state).add_process(0, 5151, gi.id, ci.id)
        notes: list[str] = []
        assert destroy_unjournaled(backend, found, str(node.state_dir), notes) is None
        assert len(notes) == 1 and "processes [5151] use it" in notes[0]
    assert instances(node) == [("1g.5gb", 3)]


def test_an_instance_another_nvml_client_holds_is_a_note_never_a_failure(node):
    """An unjournaled instance held by another NVML client (a monitoring agent, an admin's tool): its destroy answers
    IN_USE; reconcile says so in a note and tries again at its next run instead of failing (which drains the node:
    no drain mends someone else's client). Once released, the next run destroys it."""
    from slurm_gpushare.node.perjob import destroy_unjournaled, unjournaled

    with node.backend() as backend:
        gi = backend.create_gpu_instance(0, A100.profile("4g.20gb").profile_id, 0)
        FakeNvml(node.state).hold_gpu_instance(0, gi.id)
        (found,), _ = unjournaled({}, 0, "GPU-x", backend.gpu_instances(0), backend.processes(0))
        notes: list[str] = []
        assert destroy_unjournaled(backend, found, str(node.state_dir), notes) is None
        assert len(notes) == 1 and "NVML_ERROR_IN_USE" in notes[0] and "another NVML client holds it" in notes[0]
        assert instances(node) == [("4g.20gb", 0)]
        FakeNvml(node.state).hold_gpu_instance(0, gi.id, held=False)
        assert destroy_unjournaled(backend, found, str(node.state_dir), notes) is None and len(notes) == 1
    assert instances(node) == []


def test_at_nvidias_latencies_the_hooks_stay_correct_within_the_rendered_prolog_timeout(node, monkeypatch):
    """The fake at the orders NVIDIA's driver code notes (fakenvml.DRA_OBSERVED_LATENCIES: a GPU's handle by UUID
    ~10 s, a MIG device walk ~10 s, a GI destroy ~1 s), counted instead of slept: slices and a whole GPU are made,
    handed over and destroyed as without them, and one GPU's seven slice prologs one after another (they share its
    lock) plus a whole-GPU job's wait fit the PrologEpilogTimeout render sets for per-job nodes."""
    import time

    from slurm_gpushare.gpu.fakenvml import DRA_OBSERVED_LATENCIES
    from slurm_gpushare.policy.share import PER_JOB_PROLOG_TIMEOUT_S

    fake = FakeNvml(node.state)
    for call, seconds in DRA_OBSERVED_LATENCIES.items():
        fake.set_latency(call, seconds)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # the fake sleeps its latencies through time.sleep

    def timed(hook, *args) -> float:
        slept.clear()
        assert hook(*args, runner=never_drain) == 0
        return sum(slept)

    jobs = ((141, "1g.5gb", "0"), (142, "3g.20gb", "0"), (143, None, "1"))
    prologs = [timed(prolog_hook.main, env(node, job, profile, gpus)) for job, profile, gpus in jobs]
    assert instances(node, 0) == sorted(instances(node, 0)) and len(instances(node, 0)) == 2
    assert instances(node, 1) == [("7g.40gb", 0)]
    for job, _profile, gpus in jobs:
        dev = JournalStore(node.state_dir).read(job).devices[0]
        assert task_prolog(node, job, gpus) == (
            0,
            f"export CUDA_DEVICE_ORDER=PCI_BUS_ID\nexport CUDA_VISIBLE_DEVICES={dev.mig_uuid}\n",
        )
    epilogs = [timed(epilog_hook.main, env(node, job, profile, gpus)) for job, profile, gpus in jobs]
    assert instances(node, 0) == instances(node, 1) == [] and node.journals() == []
    assert min(prologs) > 10 and min(epilogs) >= 1  # the latencies were in effect
    assert 7 * max(prologs) + perjob.WHOLE_WAIT_S <= PER_JOB_PROLOG_TIMEOUT_S, (prologs, epilogs)
    assert max(epilogs) <= PER_JOB_PROLOG_TIMEOUT_S
