"""Per-job MIG in the node textfile (metrics/textfile.py): the instances jobs hold and how many more of each
profile fit, per GPU; how long the prolog took to make a job's instance (a histogram); the jobs it refused, by
reason. Real hook runs on the fake NVML with the perjob-lab test policy."""

from __future__ import annotations

import json

import pytest

from slurm_gpushare.hardware import get_model, migplace
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.metrics import textfile
from slurm_gpushare.node.journal import Device, Journal
from slurm_gpushare.node.nodeconfig import GpuSpec
from slurm_gpushare.node.perjob import GpuSlices, plan_slice
from slurm_gpushare.policy.share import Mode, Share
from tests.unit.hooks_support import ROOT, no_scontrol
from tests.unit.node.test_metrics import metered, samples, value

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
A100 = get_model("A100-SXM4-40GB")
ALLOWED = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
EMPTY = {"1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}  # an empty A100's room per profile


def prolog(node, job: int, profile: str, gpu: str = "0") -> int:
    env = node.env(job, gpu, SLURM_JOB_EXTRA=f"gpushare-mig={profile}")
    return prolog_hook.main(env, runner=no_scontrol, mps=node.mps)


def epilog(node, job: int, gpu: str = "0") -> int:
    return epilog_hook.main(node.env(job, gpu), runner=no_scontrol, mps=node.mps)


def per_profile(node, name: str, gpu: int) -> dict[str, float]:
    return {p: value(node.prom, name, gpu=gpu, profile=p) for p in ALLOWED}


@pytest.fixture
def node(tmp_path):
    return metered(tmp_path, "lab-perjob01", mapping_dir=None, policy=POLICY)


def test_room_counts_the_instances_of_one_profile_that_still_fit():
    assert {p: migplace.room(A100, p, []) for p in ALLOWED} == EMPTY
    beside = [("1g.5gb", 2)]  # holds memory slice 2: no 3g at 0, no 4g, no 7g
    assert {p: migplace.room(A100, p, beside) for p in ALLOWED} == {
        "1g.5gb": 6,
        "2g.10gb": 2,
        "3g.20gb": 1,
        "4g.20gb": 0,
        "7g.40gb": 0,
    }
    assert migplace.room(A100, "1g.5gb", [("4g.20gb", 0)]) == 3  # compute: 4 + 3 of 7


def test_running_and_free_follow_the_jobs(node):
    assert prolog(node, 11, "7g.40gb", "0") == 0
    assert prolog(node, 12, "3g.20gb", "1") == 0
    assert per_profile(node, "gpushare_node_mig_per_job_slices", 0) == {p: float(p == "7g.40gb") for p in ALLOWED}
    assert per_profile(node, "gpushare_node_mig_per_job_free", 0) == dict.fromkeys(ALLOWED, 0.0)
    start = next(d.start for d in node_journal(node, 12).devices)
    assert per_profile(node, "gpushare_node_mig_per_job_free", 1) == {
        p: float(migplace.room(A100, p, [("3g.20gb", start)])) for p in ALLOWED
    }
    assert value(node.prom, "gpushare_node_mig_per_job_free", gpu=1, profile="3g.20gb") == 1.0
    assert epilog(node, 11, "0") == 0
    assert per_profile(node, "gpushare_node_mig_per_job_free", 0) == {p: float(n) for p, n in EMPTY.items()}
    assert per_profile(node, "gpushare_node_mig_per_job_slices", 0) == dict.fromkeys(ALLOWED, 0.0)


def test_making_is_timed_and_refusals_are_counted_by_reason(node):
    assert prolog(node, 21, "7g.40gb") == 0
    assert prolog(node, 22, "1g.5gb") == 0  # refused: the 7g holds the GPU
    assert prolog(node, 23, "1g.10gb", "1") == 0  # refused: not a profile these GPUs make
    got = samples(node.prom)
    refusals = {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "gpushare_node_mig_slice_refusals_total"}
    assert refusals == {"placement": 1.0, "profile": 1.0, "mig_off": 0.0, "nvml": 0.0}
    name = "gpushare_node_mig_slice_create_seconds"
    assert got[(f"{name}_count", ())] == 1.0 and got[(f"{name}_bucket", (("le", "+Inf"),))] == 1.0
    assert 0.0 < got[(f"{name}_sum", ())] <= 30.0
    buckets = [got[(f"{name}_bucket", (("le", str(le)),))] for le in textfile.CREATE_BUCKETS]
    assert buckets == sorted(buckets) and buckets[-1] == 1.0  # cumulative
    assert value(node.prom, "gpushare_node_hook_runs_total", hook="prolog", result="ok") == 3  # no failed run


def test_every_refusal_code_the_plan_gives_is_one_the_textfile_counts():
    ids = {p.nvml_constant: p.profile_id for p in A100.mig_profiles}
    full = GpuSlices(((_gi(1, "7g.40gb", 0)),), ids)
    codes = {
        plan_slice(Device(0, 0, "GPU-a", "mig", profile=p), A100.name, ALLOWED, seen).code
        for p, seen in (("1g.5gb", full), ("1g.10gb", full), ("", full), ("1g.5gb", GpuSlices((), {})))
    }
    assert codes == {"placement", "profile", "mig_off"} and codes < set(textfile.SLICE_REFUSALS)
    with pytest.raises(ValueError, match="slice refusal 'full'"):
        textfile.observed(textfile.empty_state(), textfile.NodeObservation(slice_refused="full"))


def test_a_node_without_per_job_gpus_writes_none_of_it(tmp_path):
    node = metered(tmp_path, "lab-mig01", mapping_dir=None, policy=POLICY)
    assert prolog_hook.main(node.env(31, "0"), runner=no_scontrol, mps=node.mps) == 0
    assert "gpushare_node_mig_per_job" not in node.prom.read_text()
    assert "gpushare_node_mig_slice" not in node.prom.read_text()


def test_a_whole_gpu_job_leaves_no_room_and_a_bad_journal_no_figure():
    share = Share(Mode.MIG, per_job=True, profiles=ALLOWED, weights=(2, 4, 7, 8, 14), capacity=15)
    gpus = (GpuSpec(0, A100.name, share), GpuSpec(1, A100.name, share), GpuSpec(2, "L40S", Share()))
    whole = Journal(1, 1, 1, "n", "ready", (Device(0, 0, "GPU-a", "mig-whole"),))
    clash = Journal(
        2, 1, 1, "n", "ready", tuple(Device(i, 1, "GPU-b", "mig", profile="4g.20gb", start=0) for i in (1, 2))
    )
    running, free = textfile.per_job_slices([whole, clash], gpus)
    assert free == {0: dict.fromkeys(ALLOWED, 0)} and running[1]["4g.20gb"] == 2  # GPU 1: two 4g at 0 cannot be
    assert textfile.per_job_slices([whole], gpus[2:]) is None


def test_a_state_written_before_per_job_mig_keeps_its_counters(tmp_path):
    old = textfile.empty_state()
    for key in ("slices", "free", "refusals", "create"):
        del old[key]
    old["runs"] = {"prolog": {"ok": 5}}
    (tmp_path / textfile.STATE_NAME).write_text(json.dumps(old))
    state = textfile.read_state(tmp_path / textfile.STATE_NAME)
    assert state["runs"] == {"prolog": {"ok": 5}} and state["create"]["count"] == 0


def node_journal(node, job: int) -> Journal:
    from slurm_gpushare.node.journal import JournalStore

    return JournalStore(node.state_dir).read(job)


def _gi(gi_id: int, profile: str, start: int):
    from slurm_gpushare.gpu.backend import GpuInstance

    p = A100.profile(profile)
    return GpuInstance(gi_id, p.profile_id, start, p.memory_slices, p.nvml_constant)
