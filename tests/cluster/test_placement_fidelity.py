"""The placement simulator against real Slurm: the same trace sample, placed job for job.

Issue 13 part 4. A sample of the GPU trace, scaled to the test cluster's
nodes, is submitted through real sbatch (and job_submit.lua) one job at a
time, in arrival order, as long-running jobs so nothing departs. Each job is
tried once, as in the paper's experiment: once Slurm has either started it
or given it a pending reason, a job that did not start is cancelled before
the next one is submitted. Where Slurm put each job (node, GPU record index,
MIG instance, mps GPU) is read from ``scontrol -d show job`` and compared with
the simulator's placement of the same sample (``planner.slurmmodel`` over
``planner.frompolicy``): they must agree job for job.

Each job is what the simulator's router says its user submits
(``SubmitRouter.submitted``): where the submission filter refuses a pod's
untyped whole-GPU request (``UNTYPED``: no one whole GPU on the models it
allows), the modelled user names the type the refusal names, and the replay
does the same: it submits the untyped request, checks that job_submit.lua
refuses it with UNTYPED, then submits the typed one. The simulator and Slurm
are compared on the request that was accepted.

Runs on the small lab (the shared session cluster) and on a policy the
planner wrote for the sample's demand (its own compose project).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from slurm_gpushare.planner.demand import from_pods
from slurm_gpushare.planner.frompolicy import SubmitRouter, sim_cluster, spec_models
from slurm_gpushare.planner.plan import plan
from slurm_gpushare.policy import load_file
from slurm_gpushare.sim.cluster import GPU_MILLI, Pod
from slurm_gpushare.sim.paper.workloads import TRACE_DIR
from slurm_gpushare.sim.slurmmodel import SlurmState
from slurm_gpushare.sim.trace import load_pods
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import POLICY, own_cluster, wait_quiet

USER, ACCOUNT = "carol", "biology"  # no quota: only the hardware limits placement
MIG_TYPE = "a100_40g_1g.5gb"
PLANNED_PROJECT = os.environ.get("GPUSHARE_PLANNED_PROJECT", "planned")
SETTLE_S = 30  # seconds for slurmctld to start a job or give it a pending reason
# The planned half's sample: the planner writes the policy for this sample's demand. Seed 13's sample (the small
# lab's) asks about 20 GPUs of the 5: on the plan its first 7 GPU jobs take every GPU and the rest cannot start
# (7 placed, simulator and Slurm agreeing), under the guard of 8 below. Seed 1's sample places 12 on its plan and
# makes the planner split a tier by mps billing weight (tiers frac, gpu, gpu-2), so the split is replayed too.
PLANNED_SEED = 1
# GPU-model specs, the trace's gpuspec form over the lab's models (L40S on lab-excl01 and lab-shard01, the A100 on
# lab-mig01 in 1g.5gb slices, the A30 on lab-mps01 with MPS)
SPECS = ("A30|A100_40G", "L40S|A30", "A100_40G", "A30|A100_40G|L40S", "L40S", "A100_40G|A30")

# ---- the sample ---------------------------------------------------------------------------


def scaled(pod: Pod, spec: str = "") -> Pod:
    """A trace pod shrunk to the lab's 8-CPU, 16,000 MB nodes (CPUs / 8, memory / 16, at least 1 CPU, 100 MB)."""
    cpu = min(8000, max(1000, math.ceil(pod.cpu_milli / 8 / 1000) * 1000))
    mem = min(16000, max(100, pod.memory_mib // 16))
    return Pod(pod.name, cpu, mem, min(pod.num_gpu, 2), pod.gpu_milli if pod.num_gpu <= 2 else GPU_MILLI, "", spec)


def trace_sample(count: int = 28, seed: int = 13) -> list[Pod]:
    """Trace pods in a seeded order, scaled; every fifth GPU pod asks for the MIG slice type by name."""
    pods = load_pods(TRACE_DIR / "openb_pod_list_default.csv")
    order = np.random.default_rng(seed).permutation(len(pods))
    out, gpu_pods = [], 0
    for i in order[:count]:
        pod = pods[int(i)]
        spec = ""
        if pod.num_gpu == 1:
            gpu_pods += 1
            spec = MIG_TYPE if gpu_pods % 5 == 0 else ""
        out.append(scaled(pod, spec))
    return out


# ---- the simulator's side ---------------------------------------------------------------------


def simulated(site, pods: list[Pod], router: SubmitRouter) -> list[tuple | None]:
    """(node, GRES name, indexes) per pod as the Slurm model places them; None where not placed."""
    cluster = sim_cluster(site)
    state = SlurmState(cluster)
    out = []
    for pod in pods:
        req = router(pod)
        node = state.choose_node(req) if req is not None else -1
        if node < 0:
            out.append(None)
            continue
        used = state.allocate(req, node)
        out.append((state.names[node], req.gres or "-", tuple(sorted(used))))
    return out


# ---- real Slurm's side --------------------------------------------------------------------------


def sbatch_argv(pod: Pod, job: dict, prefix: str) -> list[str]:
    """sbatch for this pod asking what ``job`` (the router's job_submit fields) asks: its GRES (``prefix``, the
    site's gres/ or gres: taken off) as --gres, its features (the spec's GPU models) as --constraint."""
    argv = [
        "sbatch",
        "--parsable",
        "-A",
        ACCOUNT,
        "-c",
        str(pod.cpu_milli // 1000),
        f"--mem={pod.memory_mib}",
        "-t",
        "60",
        "-o",
        "/dev/null",
        "-J",
        pod.name,
    ]
    if job["tres_per_node"]:
        argv.append("--gres=" + job["tres_per_node"].removeprefix(prefix))
    if job["features"]:
        argv.append(f"--constraint={job['features']}")
    return argv + ["--wrap", "sleep 3600"]


def tries(pod: Pod, router: SubmitRouter) -> list[list[str]]:
    """The modelled user's submissions of this pod: the untyped request the filter refuses (UNTYPED), where it
    does, then what the user resubmits (``SubmitRouter.submitted``); else the one request."""
    first, last = router.job(pod), router.submitted(pod)
    argv = [sbatch_argv(pod, job, router.tables.prefix) for job in (first, last)]
    return argv if first != last else argv[1:]


_NODE_GRES = re.compile(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\d+ GRES=(\S*)")


def placement_of(detail: str) -> tuple:
    """(node, GRES name, indexes) from `scontrol -d show job`: IDX ranges for gpu, the device with a share for
    mps/shard."""
    m = _NODE_GRES.search(detail)
    assert m, f"no Nodes=... GRES= line in:\n{detail}"
    node, gres = m[1], m[2]
    if not gres or gres == "(null)":
        return node, "-", ()
    name = gres.split(":", 1)[0]
    idx = re.search(r"\(IDX:([0-9,-]+)\)", gres)
    if idx:
        return node, name, tuple(_expand(idx[1]))
    shares = re.search(r"\(([0-9/,]+)\)", gres)
    assert shares, f"cannot read the device of {gres!r}"
    used = [i for i, part in enumerate(shares[1].split(",")) if int(part.split("/")[0]) > 0]
    return node, name, tuple(used)


def _expand(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


# Runs inside the slurmctld container as the submitting user: one `docker exec` for the whole sample
# instead of several per job. argv lists come as JSON on stdin; one JSON line per job comes back:
# {"state": "RUNNING"|"PENDING"|"REFUSED", "job": id, "detail": `scontrol -d show job` text or sbatch's stderr}.
REPLAY = rf"""
import json, subprocess, sys, time
def out(argv):
    return subprocess.run(argv, capture_output=True, text=True)
for argv in json.load(sys.stdin):
    res = out(argv)
    if res.returncode != 0:
        print(json.dumps({{"state": "REFUSED", "job": None, "detail": res.stderr.strip()}}), flush=True)
        continue
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + {SETTLE_S}
    while True:
        state, _, reason = out(["squeue", "-h", "-j", job, "-o", "%T|%r"]).stdout.strip().partition("|")
        if state == "RUNNING" or (state == "PENDING" and reason not in ("None", "")) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if state == "RUNNING":
        detail = out(["scontrol", "-d", "show", "job", job]).stdout
    else:
        out(["scancel", job])
        detail = state + " " + reason
    print(json.dumps({{"state": state, "job": job, "detail": detail}}), flush=True)
"""


def replayed(c: TestCluster, pods: list[Pod], router: SubmitRouter) -> list[tuple | None]:
    """Submit each pod once, in order (an untyped request the filter refuses, then the typed one its user
    resubmits); keep what starts, cancel what pends (inside the controller container)."""
    per_pod = [tries(p, router) for p in pods]
    argvs = [argv for t in per_pod for argv in t]
    try:
        res = c.exec(
            "slurmctld",
            ["python3", "-c", REPLAY],
            user=USER,
            input=json.dumps(argvs),
            timeout=60 + len(pods) * SETTLE_S,
        )
    finally:
        c.slurm(["scancel", "-u", USER], check=False)
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert len(lines) == len(argvs), res.stdout + res.stderr
    out, at = [], 0
    for t in per_pod:
        for refused in lines[at : at + len(t) - 1]:  # the untyped request the router says the filter refuses
            assert refused["state"] == "REFUSED" and "UNTYPED" in refused["detail"], (t[0], refused)
        rec = lines[at + len(t) - 1]
        at += len(t)
        if rec["state"] not in ("RUNNING", "PENDING", "REFUSED"):
            raise AssertionError(f"job {rec['job']} neither started nor got a pending reason in {SETTLE_S} s: {rec}")
        out.append(placement_of(rec["detail"]) if rec["state"] == "RUNNING" else None)
    return out


def compare(pods: list[Pod], sim: list, real: list, router: SubmitRouter) -> list[str]:
    return [
        f"{p.name} ({tries(p, router)[-1][5:-2]}): simulator {s}, Slurm {r}"
        for p, s, r in zip(pods, sim, real, strict=True)
        if s != r
    ]


# ---- the tests ---------------------------------------------------------------------------------


def _check(c: TestCluster, site, pods: list[Pod]) -> None:
    wait_quiet(c)
    router = SubmitRouter(site)
    sim = simulated(site, pods, router)
    real = replayed(c, pods, router)
    wait_quiet(c)
    placed = [r for r in real if r]
    kinds = {r[1] for r in placed}
    assert sim == real, "simulator and Slurm disagree:\n" + "\n".join(compare(pods, sim, real, router))
    assert len(placed) >= 8 and {"gpu", "mps"} <= kinds and len(placed) < len(pods), (
        f"the sample exercised too little: {len(placed)} of {len(pods)} placed, GRES kinds {kinds}"
    )


def test_simulator_places_a_trace_sample_as_slurm_does_on_the_small_lab(cluster):
    _check(cluster, load_file(POLICY), trace_sample())


def spec_sample(count: int = 24, seed: int = 5) -> list[Pod]:
    """The trace sample with every GPU pod given one of SPECS in turn: jobs that may run on any of several models."""
    pods = trace_sample(count, seed)
    gpu = [i for i, p in enumerate(pods) if p.num_gpu]
    for k, i in enumerate(gpu):
        p = pods[i]
        pods[i] = Pod(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.qos, SPECS[k % len(SPECS)])
    return pods


def test_jobs_for_several_gpu_models_land_only_on_those_models(cluster):
    """sbatch --constraint='a30|a100_40g' (and the like) runs on a node of an allowed model only, wherever Slurm
    would put the job without it; a share keeps its models; the simulator places every job as Slurm does."""
    site = load_file(POLICY)
    model_of = {n: g.model_feature for g in site.groups for n in g.nodes}
    pods = spec_sample()
    router = SubmitRouter(site)
    wait_quiet(cluster)
    sim = simulated(site, pods, router)
    real = replayed(cluster, pods, router)
    wait_quiet(cluster)
    assert sim == real, "simulator and Slurm disagree:\n" + "\n".join(compare(pods, sim, real, router))
    wrong = [
        (p.gpu_spec, r)
        for p, r in zip(pods, real, strict=False)
        if r and p.num_gpu and model_of[r[0]] not in spec_models(p.gpu_spec)
    ]
    assert wrong == [], f"jobs on a model their constraint does not allow: {wrong}"
    placed = [(p, r) for p, r in zip(pods, real, strict=False) if r and p.num_gpu]
    several = [r for p, r in placed if "|" in p.gpu_spec]
    shares = [r for p, r in placed if p.gpu_milli < GPU_MILLI]
    models = {model_of[r[0]] for _p, r in placed}
    assert len(several) >= 4 and shares and len(models) >= 2, (
        f"the sample exercised too little: {len(placed)} GPU jobs placed, {len(several)} with several models, "
        f"{len(shares)} shares, models {models}"
    )
    # refusals are the product's own, at submission: a share whose models offer no MPS (CONSTRAINT mps)
    refused = [p for p, r in zip(pods, real, strict=False) if r is None and router(p) is None]
    assert all(router.refusal(p)[0].startswith("CONSTRAINT") for p in refused), [router.refusal(p) for p in refused]


def planned_raw(pods: list[Pod]) -> dict:
    base = yaml.safe_load(POLICY.read_text())
    return plan(base, from_pods(pods, "fidelity sample")).policy


def write_planned(work: Path) -> Path:
    path = work / "planned.yaml"
    raw = planned_raw(trace_sample(seed=PLANNED_SEED))
    path.write_text("# planned by gpushare plan for the fidelity sample\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def planned_cluster():
    for c in own_cluster("planned", PLANNED_PROJECT, write_planned):
        yield c, c.policy


def test_simulator_places_a_trace_sample_as_slurm_does_on_a_planned_policy(planned_cluster):
    c, path = planned_cluster
    site = load_file(path)
    assert site.policy != load_file(POLICY).policy, "the planner changed nothing: this would repeat the small-lab test"
    _check(c, site, trace_sample(seed=PLANNED_SEED))
