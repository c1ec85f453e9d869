"""A per-job MIG prolog run again for the same job (node/perjob.py: ``earlier``, ``plan_reuse``, ``prolog_slices``):
Slurm runs the prolog again when it retries it, and a heal of the node may. The instance the job's journal records
on that GPU is handed to the job again while NVML has it whole; a new one is made only when it is gone, and what
is left of a half-gone one is destroyed first, so the journal names exactly the GPU's instances of the job. On the
fake NVML, through the hooks' entry points (tests/unit/hooks_support.HookNode, the perjob-lab test policy)."""

from __future__ import annotations

import pytest

from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import perjob
from slurm_gpushare.node.journal import Device, Journal, JournalStore
from slurm_gpushare.node.perjob import GpuSlices, earlier, leftover, plan_reuse
from tests.unit.hooks.test_perjob import A100, _gi, env, instances, never_drain, task_prolog
from tests.unit.hooks_support import HookNode

IDS = {p.nvml_constant: p.profile_id for p in A100.mig_profiles}


@pytest.fixture
def node(tmp_path):
    from tests.unit.hooks.test_perjob import POLICY

    return HookNode(tmp_path, "lab-perjob01", POLICY)


def journal(node: HookNode, job: int) -> Journal:
    got = JournalStore(node.state_dir).read(job)
    assert got is not None
    return got


def rerun(node: HookNode, job: int, profile: str | None) -> Device:
    """The prolog run once more for the job: its device afterwards, after checking the task prolog hands it out."""
    assert prolog_hook.main(env(node, job, profile), runner=never_drain) == 0
    dev = journal(node, job).devices[0]
    rc, out = task_prolog(node, job)
    assert rc == 0 and out.endswith(f"export CUDA_VISIBLE_DEVICES={dev.mig_uuid}\n"), out
    return dev


def test_a_rerun_hands_the_job_the_instance_it_made_before(node):
    first = rerun(node, 201, "2g.10gb")
    before = instances(node)
    again = rerun(node, 201, "2g.10gb")
    assert again == first and instances(node) == before == [("2g.10gb", first.start)]
    assert epilog_hook.main(env(node, 201, "2g.10gb"), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []


def test_a_rerun_beside_a_neighbour_keeps_both(node):
    mine = rerun(node, 202, "1g.5gb")
    other = rerun(node, 203, "3g.20gb")
    assert rerun(node, 202, "1g.5gb") == mine
    assert journal(node, 203).devices[0] == other
    assert instances(node) == sorted([("1g.5gb", mine.start), ("3g.20gb", other.start)])


def test_a_gone_instance_is_made_again_and_the_journal_names_the_new_one(node):
    first = rerun(node, 204, "3g.20gb")
    with node.backend() as backend:  # gone since (destroyed by hand, or by a reconcile)
        backend.destroy_compute_instance(0, first.gi, first.ci)
        backend.destroy_gpu_instance(0, first.gi)
    again = rerun(node, 204, "3g.20gb")
    assert again.mig_uuid != first.mig_uuid and instances(node) == [("3g.20gb", again.start)]
    with node.backend() as backend:
        assert [m.uuid for m in backend.mig_devices(0)] == [again.mig_uuid]


def test_what_is_left_of_a_half_gone_instance_is_destroyed_before_a_new_one(node):
    first = rerun(node, 205, "4g.20gb")
    with node.backend() as backend:  # its compute instance is gone, the GPU instance is left
        backend.destroy_compute_instance(0, first.gi, first.ci)
    again = rerun(node, 205, "4g.20gb")
    assert again.mig_uuid != first.mig_uuid
    assert instances(node) == [("4g.20gb", again.start)]  # one instance, the one the journal names
    assert epilog_hook.main(env(node, 205, "4g.20gb"), runner=never_drain) == 0
    assert instances(node) == [] and node.journals() == []


def test_a_whole_gpu_job_run_again_neither_waits_for_nor_refuses_over_its_own_instance(node, monkeypatch):
    first = rerun(node, 206, None)
    assert (first.mode, first.profile) == (perjob.WHOLE_MODE, "7g.40gb")

    def no_wait(_s):
        raise AssertionError("the prolog waited for the job's own instance to leave the GPU")

    monkeypatch.setattr(perjob.time, "sleep", no_wait)
    assert rerun(node, 206, None) == first and instances(node) == [("7g.40gb", 0)]


def test_a_journal_from_a_profile_the_job_no_longer_asks_is_not_reused(node):
    """The same job id with another record (the job was changed and requeued): its old instance is not the one
    asked for; the new one is made beside it, and the old one, which the journal no longer names, is left to
    reconcile (it destroys instances no journal names)."""
    first = rerun(node, 207, "1g.5gb")
    again = rerun(node, 207, "2g.10gb")
    assert again.profile == "2g.10gb" and again.mig_uuid != first.mig_uuid


# ---- the pure parts ------------------------------------------------------------------------------------


def _old(**kw) -> Device:
    base = {"gi": 3, "ci": 0, "mig_uuid": "MIG-a", "visible": "MIG-a", "profile": "2g.10gb", "start": 4}
    return Device(0, 0, "GPU-a", "mig", **{**base, **kw})


def test_the_earlier_instance_must_be_the_same_gpu_profile_and_mode_and_nobody_elses():
    old = _old()
    journals = {7: Journal(7, 1, 1, "n", "ready", (old,))}
    want = Device(0, 0, "GPU-a", "mig", profile="2g.10gb")
    assert earlier(want, journals, 7) == old
    assert earlier(want, journals, 8) is None  # another job's
    for other in (
        Device(0, 1, "GPU-a", "mig", profile="2g.10gb"),
        Device(0, 0, "GPU-b", "mig", profile="2g.10gb"),
        Device(0, 0, "GPU-a", "mig", profile="1g.5gb"),
        Device(0, 0, "GPU-a", perjob.WHOLE_MODE, profile="2g.10gb"),
    ):
        assert earlier(other, journals, 7) is None, other
    assert earlier(want, {7: Journal(7, 1, 1, "n", "ready", (_old(gi=None),))}, 7) is None  # never made
    claimed = Journal(9, 1, 1, "n", "preparing", (_old(gi=None, ci=None, mig_uuid=None),))
    assert earlier(want, {**journals, 9: claimed}, 7) is None  # its start is another job's now


def test_reuse_needs_the_gi_at_its_start_of_its_profile_with_its_ci_and_mig_device():
    from slurm_gpushare.gpu.backend import MigDevice

    old = _old()
    seen = GpuSlices((_gi(3, "2g.10gb", 4),), IDS)
    mig = [MigDevice("MIG-a", 3, 0, "A100 2g.10gb", 10240)]
    assert plan_reuse(old, A100.name, seen, mig, [0]) == old
    assert plan_reuse(old, A100.name, seen, mig, []) is None and leftover(old, A100.name, seen)  # CI gone
    assert plan_reuse(old, A100.name, seen, [], [0]) is None
    assert plan_reuse(old, A100.name, seen, [MigDevice("MIG-b", 3, 0, "x", 1)], [0]) is None
    for gis in ((_gi(4, "2g.10gb", 4),), (_gi(3, "1g.5gb", 4),), (_gi(3, "2g.10gb", 0),), ()):
        other = GpuSlices(gis, IDS)
        assert plan_reuse(old, A100.name, other, mig, [0]) is None and not leftover(old, A100.name, other), gis
