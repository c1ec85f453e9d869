"""Per-job MIG on real Slurm (issue 35): a MIG slice made for each job on a GPU that keeps serving its others.

One node, lab-perjob01, with two A100-SXM4-40GB in MIG mode and no instances (the fake NVML), shared per job
with the profiles 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb and 7g.40gb. Users ask as for fixed MIG
(``--gres=gpu:a100_40g_<profile>:1`` or an alias); the submission filter rewrites the slice to its carrier
(``shard:<weight>``, so that Slurm's shard count per GPU admits exactly the sets of slices that fit) and records
the profile in the job's extra field; the prolog makes the GPU instance and its compute instance at the
least-blocking placement on the GPU Slurm gave the job; the task prolog hands the job ``MIG-<uuid>``; the epilog
destroys the instance. Checked here:

- jobs of several profiles run at once on the node, each with its own instance of its profile on the GPU
  Slurm allocated, and every instance is gone after they end;
- a slice that cannot be placed (a held instance in the way) is refused with the reason in its output and
  requeued by the health check, while the node stays in service and runs the next job; it completes once the
  way is free;
- a whole-GPU job waits for a GPU to empty and gets the model's full instance;
- a prolog killed (SIGKILL) between making the GPU instance and recording it is healed by slurmd's own health
  runs: the node is back, the half-made instance gone, the job run again;
- a restart of the node (its container: the fake NVML loses every instance, as a reboot does) while slices
  exist: the node comes back idle, not drained, and makes slices again;
- isolation (the policy's default, ``isolation: namespace``): two jobs on one GPU each see, in their own
  /dev/nvidia-caps, only their instance's GI and CI capability files, though the node's /dev/nvidia-caps holds
  every capability (as nvidia-modprobe leaves a real node); the neighbour's file is not there (ENOENT), and
  nothing can be made there (EROFS).

Own compose project (GPUSHARE_PERJOB_PROJECT, default "perjob"); always taken down (GPUSHARE_PERJOB_KEEP=1
keeps it for debugging).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import ended_drain, own_cluster, wait_for
from tests.cluster.tuning import FAST_REQUEUE, tuned

PROJECT = os.environ.get("GPUSHARE_PERJOB_PROJECT", "perjob")
NODE = "lab-perjob01"
FAKE = "/var/lib/gpushare/fake-nvml.json"
STATE = "/var/lib/gpushare"
SUITE = os.environ.get("SLURM_SUITE", "trixie")
SLURM_VERSIONS = {"trixie": "24.11", "sid": "26.05"}  # Debian's Slurm in each image suite (docker/bootstrap.sh)
PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
ENV_SCRIPT = "env | grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS|SLURM_JOB_ID)=' | sort\n"

POLICY = {
    "version": 1,
    "cluster": {
        "name": "lab",
        # rendered for the suite's Slurm: job_container/tmpfs on 24.11, namespace/tmpfs on 26.05 (SLURM_SUITE=sid)
        "slurm_version": "26.05" if os.environ.get("SLURM_SUITE") == "sid" else "24.11",
        "controller": "slurmctld",
        "accounting": {"host": "slurmdbd"},
        "slurmd_config_overrides": True,
        "hooks": {
            "prolog": "/usr/local/sbin/gpushare-prolog",
            "epilog": "/usr/local/sbin/gpushare-epilog",
            "task_prolog": "/usr/local/bin/gpushare-task-prolog",
            "job_submit_lua": True,
        },
        # slurmd's own health runs heal a killed prolog (every 10 s here: the test waits on them)
        "health": {"program": "/opt/gpushare/bin/gpushare-node-health", "interval": 10, "node_state": ["ANY"]},
    },
    "node_groups": [
        {
            "name": "lab-perjob",
            "nodes": NODE,
            "gpu": {"model": "A100-SXM4-40GB", "count": 2},
            "cpus": 8,
            "memory_mb": 16000,
            "sharing": [{"gpus": "0-1", "mode": "mig", "per_job": True, "profiles": PROFILES}],
        }
    ],
    "tenants": [{"name": "physics", "shares": 60, "users": ["alice", "bob"]}],
    "tiers": [{"name": "perjob", "default": True, "node_groups": ["lab-perjob"], "priority": 10}],
    "submission": {"aliases": {"small": "gpu:a100_40g_1g.5gb"}},
    "billing": {"gpu_weights": {"A100-SXM4-40GB": 100}},
}

# Runs on the node with the image's python: the node's GPU backend over the fake NVML.
NODE_PY = r"""
import json, sys
from slurm_gpushare.gpu import open_backend
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hardware import get_model
state, op, args = sys.argv[1], sys.argv[2], sys.argv[3:]
b = open_backend(state)
model = get_model("A100-SXM4-40GB")
if op == "instances":
    out = []
    for i in (0, 1):
        devs = {(d.gi_id, d.ci_id): d.uuid for d in b.mig_devices(i)}
        for g in b.gpu_instances(i):
            name = model.profile_for_constant(g.profile_constant).name
            uuids = [u for (gi, ci), u in devs.items() if gi == g.id]
            cis = [ci for (gi, ci) in devs if gi == g.id]
            out.append({"gpu": i, "gi": g.id, "profile": name, "start": g.start, "uuids": uuids, "cis": cis})
    print(json.dumps(out))
elif op == "caps":  # every GI and CI capability file of GPUs 0-1 in the node's /dev/nvidia-caps, or none of them
    import os
    from slurm_gpushare.gpu.migminors import FAKE_CAPS_MAJOR, mig_minors_path, read_mig_minors
    made = 0
    os.makedirs("/dev/nvidia-caps", mode=0o755, exist_ok=True)
    for (gpu, gi, ci), minor in read_mig_minors(mig_minors_path(state)).items():
        path = f"/dev/nvidia-caps/nvidia-cap{minor}"
        if gpu > 1:
            continue
        if args[0] == "make" and not os.path.exists(path):
            os.mknod(path, 0o20444, os.makedev(FAKE_CAPS_MAJOR, minor))
            made += 1
        elif args[0] == "remove" and os.path.exists(path):
            os.unlink(path)
            made += 1
    print(json.dumps({"files": made}))
elif op == "block":  # an instance nobody's job owns, held by another NVML client: in the way of every slice
    index, profile, start = int(args[0]), model.profile(args[1]), int(args[2])
    ids = {p.constant: p.id for p in b.gpu_instance_profiles(index)}
    gi = b.create_gpu_instance(index, ids[profile.nvml_constant], start)
    FakeNvml(state).hold_gpu_instance(index, gi.id)
    print(json.dumps({"gi": gi.id}))
elif op == "unblock":
    index, gi = int(args[0]), int(args[1])
    FakeNvml(state).hold_gpu_instance(index, gi, held=False)
    b.destroy_gpu_instance(index, gi)
    print(json.dumps({"ok": True}))
elif op == "latency":
    FakeNvml(state).set_latency(args[0], float(args[1]))
    print(json.dumps({"ok": True}))
"""


def write_policy(work: Path) -> Path:
    """The policy, rendered for the Slurm the images run (SLURM_SUITE=sid: 26.05, the 26.05 subset)."""
    path = work / "perjob.yaml"
    raw = {**POLICY, "cluster": {**POLICY["cluster"], "slurm_version": SLURM_VERSIONS[SUITE]}}
    path.write_text("# per-job MIG test cluster (tests/cluster/test_per_job_mig.py)\n" + yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def perjob_cluster():
    write, files = tuned(write_policy, FAST_REQUEUE)
    yield from own_cluster("perjob", PROJECT, write, "GPUSHARE_PERJOB_KEEP", conf_files=files)


# ---- helpers ----------------------------------------------------------------------------


def node_py(c: TestCluster, *args: str):
    out = c.exec(NODE, ["/opt/gpushare/bin/python", "-", FAKE, *args], input=NODE_PY).stdout
    return json.loads(out.strip().splitlines()[-1])


def submit(c: TestCluster, gres: str, script: str = "sleep 300\n", user: str = "alice") -> int:
    return c.sbatch(ENV_SCRIPT + script, user=user, account="physics", output="/shared/perjob-%j.out", gres=gres)


def output(c: TestCluster, job: int) -> str:
    return c.exec("slurmctld", ["bash", "-c", f"cat /shared/perjob-{job}.out 2>/dev/null || true"]).stdout


def env_of(c: TestCluster, job: int) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output(c, job).splitlines() if "=" in line)


def state_of(c: TestCluster, job: int) -> str:
    return c.job(job).get("JobState", "")


def node_flags(c: TestCluster) -> set[str]:
    return c.node_states()[NODE]["flags"]


def slurmd_started(c: TestCluster) -> str:
    out = c.scontrol("-o", "show", "node", NODE).stdout
    return next((f for f in out.split() if f.startswith("SlurmdStartTime=")), "")


def restarts(c: TestCluster, job: int) -> int:
    return int(c.job(job).get("Restarts", "0") or 0)


def journals(c: TestCluster) -> list[str]:
    out = c.exec(NODE, ["bash", "-c", f"ls {STATE}/jobs 2>/dev/null || true"]).stdout
    return [n for n in out.split() if n.endswith(".json")]


def cancel(c: TestCluster, *jobs: int) -> None:
    c.slurm(["scancel", *map(str, jobs)], check=False)


def quiet(c: TestCluster, timeout: float = 120) -> None:
    """No job in the queue, no journal left on the node, no instance left on its GPUs."""
    wait_for("an empty queue", lambda: not c.slurm(["squeue", "-h", "-o", "%i"]).stdout.strip(), timeout)
    wait_for("no journal on the node", lambda: not journals(c), timeout)
    wait_for("no instance on the node's GPUs", lambda: not node_py(c, "instances"), timeout)


# ---- the scenarios ------------------------------------------------------------------------


def test_slices_of_several_profiles_run_side_by_side_each_on_its_own_instance(perjob_cluster):
    c = perjob_cluster
    asks = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb", "4g.20gb"]
    jobs = [submit(c, f"gpu:a100_40g_{p}:1") for p in asks[:-1]] + [submit(c, "gpu:small:1")]
    asks[-1] = "1g.5gb"  # the alias
    try:
        for job in jobs:
            wait_for(f"job {job} running", lambda job=job: state_of(c, job) == "RUNNING", 120)
        envs = {
            job: wait_for(f"job {job}'s environment", lambda job=job: env_of(c, job).get("CUDA_VISIBLE_DEVICES"), 60)
            and env_of(c, job)
            for job in jobs
        }
        made = node_py(c, "instances")
        by_uuid = {u: inst for inst in made for u in inst["uuids"]}
        seen = []
        for job, profile in zip(jobs, asks, strict=True):
            visible = envs[job]["CUDA_VISIBLE_DEVICES"]
            assert visible.startswith("MIG-") and "," not in visible, (job, envs[job])
            inst = by_uuid.get(visible)
            assert inst is not None, f"job {job}'s {visible} is no instance of the node: {made}"
            assert inst["profile"] == profile, (job, profile, inst)
            assert str(inst["gpu"]) == envs[job]["SLURM_JOB_GPUS"], (job, envs[job], inst)
            seen.append(visible)
        assert len(set(seen)) == len(jobs), f"two jobs share an instance: {envs}"
        assert len(made) == len(jobs), f"instances beyond the jobs': {made}"
        extra = c.job(jobs[0]).get("Extra", "")
        assert extra == "gpushare-mig=3g.20gb", c.job(jobs[0])
        print(
            "\nslices:",
            [(j, p, by_uuid[v]["gpu"], by_uuid[v]["start"]) for j, p, v in zip(jobs, asks, seen, strict=True)],
        )
    finally:
        cancel(c, *jobs)
    quiet(c)
    assert "DRAIN" not in node_flags(c)


def test_a_slice_that_cannot_be_placed_is_requeued_and_affects_only_its_job(perjob_cluster):
    """A 4g.20gb held by another NVML client at slice 0 of each GPU: Slurm's shard count still admits a 4g.20gb
    (it knows nothing of the held instance), but no 4g.20gb placement is left. The job's tasks are refused with the
    reason, the health check requeues it (on_slice_failure: requeue, the default), the node stays in service and
    runs a 1g.5gb meanwhile; once the held instances go, the requeued job gets its slice and completes."""
    c = perjob_cluster
    blocks = [node_py(c, "block", str(i), "4g.20gb", "0")["gi"] for i in (0, 1)]
    try:
        doomed = submit(c, "gpu:a100_40g_4g.20gb:1", script="echo ran\n")
        refused = wait_for(f"job {doomed} refused", lambda: "is not run on this node" in output(c, doomed), 120)
        text = output(c, doomed)
        assert refused and "4g.20gb" in text and "requeued" in text, text
        wait_for(f"job {doomed} requeued by the health check", lambda: restarts(c, doomed) >= 1, 120)
        assert "DRAIN" not in node_flags(c), c.node_states()[NODE]
        fine = submit(c, "gpu:a100_40g_1g.5gb:1", script="echo ran\n")
        rec = c.wait(fine, timeout=180)
        assert rec["State"] == "COMPLETED", (rec, output(c, fine))
    finally:
        for i, gi in enumerate(blocks):
            node_py(c, "unblock", str(i), str(gi))
    rec = c.wait(doomed, timeout=300)
    assert rec["State"] == "COMPLETED" and "ran" in output(c, doomed), (rec, output(c, doomed), c.job(doomed))
    quiet(c, timeout=240)
    assert "DRAIN" not in node_flags(c)
    print(f"\nunplaceable 4g.20gb: job {doomed} refused ({text.strip()[:300]}), requeued, then {rec['State']}")


def test_a_whole_gpu_job_waits_for_the_gpu_to_empty_and_gets_the_full_instance(perjob_cluster):
    """Two slices, one on each GPU (LL_SHARED_GRES spreads them); an untyped whole-GPU request (a whole GPU on
    this tier) waits: Slurm never allocates a GPU as gpu and as shards at once. Once one slice ends, the whole-GPU
    job runs on that GPU with the model's full instance (7g.40gb)."""
    c = perjob_cluster
    slices = [submit(c, "gpu:a100_40g_1g.5gb:1"), submit(c, "gpu:a100_40g_1g.5gb:1")]
    try:
        gpus = [wait_for(f"job {j}'s GPU", lambda j=j: env_of(c, j).get("SLURM_JOB_GPUS"), 120) for j in slices]
        assert sorted(gpus) == ["0", "1"], f"LL_SHARED_GRES put both slices on one GPU: {gpus}"
        whole = submit(c, "gpu:1", script="sleep 5\n")
        time.sleep(15)  # a scheduling pass or more: it must still wait
        assert state_of(c, whole) == "PENDING", c.job(whole)
        cancel(c, slices[0])
        env = wait_for(f"job {whole}'s instance", lambda: env_of(c, whole).get("CUDA_VISIBLE_DEVICES"), 180)
        inst = next((i for i in node_py(c, "instances") if env in i["uuids"]), None)
        assert inst is not None and inst["profile"] == "7g.40gb" and str(inst["gpu"]) == gpus[0], (env, inst)
        rec = c.wait(whole, timeout=120)
        assert rec["State"] == "COMPLETED", rec
    finally:
        cancel(c, *slices)
    quiet(c)
    print(f"\nwhole GPU: job {whole} waited for GPU {gpus[0]} to empty, then ran on its 7g.40gb ({rec['State']})")


def test_a_prolog_killed_between_making_the_instance_and_recording_it_is_healed_by_the_health_check(perjob_cluster):
    """The fake NVML takes 40 s to answer the GPU instance's creation (the instance exists at once, as on a
    driver that made it and has not returned): the prolog is SIGKILLed then. slurmctld drains the node
    ``Prolog error`` and requeues the job; slurmd's own health runs (every 10 s) destroy the instance the
    journal's intent names, resume the node, and the requeued job runs and completes. Nobody acts by hand."""
    c = perjob_cluster
    since = c.slurm(["date", "-u", "+%Y-%m-%dT%H:%M:%S"]).stdout.strip()
    node_py(c, "latency", "nvmlDeviceCreateGpuInstanceWithPlacement", "40")
    try:
        job = submit(c, "gpu:a100_40g_2g.10gb:1", script="echo ran\n")
        wait_for("the job's GPU instance, made and not yet answered", lambda: node_py(c, "instances"), 120, every=0.5)
        killed = c.exec(NODE, ["pkill", "-9", "-f", "gpushare-prolog"], check=False)
        assert killed.returncode == 0, "no gpushare-prolog was running while its instance was being made"
    finally:
        node_py(c, "latency", "nvmlDeviceCreateGpuInstanceWithPlacement", "0")
    drain = wait_for(
        "the node's drain after the killed prolog, ended by the health runs",
        lambda: ended_drain(c, NODE, since),
        240,
        every=2,
    )
    rec = c.wait(job, timeout=300)
    assert rec["State"] == "COMPLETED", (rec, output(c, job))
    assert "ran" in output(c, job)
    quiet(c)
    assert "DRAIN" not in node_flags(c)
    print(
        f"\nprolog of job {job} killed mid-creation: drained '{drain['Reason']}' {drain['Start']} - {drain['End']}, "
        f"the requeued job {rec['State']}"
    )


def test_a_node_restart_while_slices_exist_comes_back_idle_and_makes_slices_again(perjob_cluster):
    """Restart the node's container while two jobs hold slices (the fake NVML starts over with MIG mode on and
    no instance, as a reboot leaves an A100). The node registers again with the same GRES, not drained; the
    jobs' journals are cleaned; the next slice job gets an instance and completes."""
    c = perjob_cluster
    jobs = [submit(c, "gpu:a100_40g_3g.20gb:1"), submit(c, "gpu:a100_40g_1g.5gb:1")]
    for job in jobs:
        wait_for(f"job {job}'s instance", lambda job=job: env_of(c, job).get("CUDA_VISIBLE_DEVICES"), 120)
    assert len(node_py(c, "instances")) == 2
    before = slurmd_started(c)
    c.compose("restart", "-t", "5", NODE, timeout=240)
    # slurmctld holds the jobs RUNNING until it gives up on them (about two minutes); an admin cancels them
    wait_for("the node's slurmd registered again", lambda: slurmd_started(c) != before, 120)
    wait_for("the node responding", lambda: not node_flags(c) & {"DOWN", "NOT_RESPONDING"}, 120)
    cancel(c, *jobs)
    quiet(c, timeout=240)
    states = c.node_states()[NODE]
    assert not states["flags"] & {"DRAIN", "INVAL", "DOWN"}, states
    job = submit(c, "gpu:a100_40g_4g.20gb:1", script="echo ran\n")
    rec = c.wait(job, timeout=180)
    assert rec["State"] == "COMPLETED" and "MIG-" in output(c, job), (rec, output(c, job))
    quiet(c)
    print(f"\nnode restarted under jobs {jobs}: back {states['state']}; the next slice job {rec['State']}")


# The job's view of /dev/nvidia-caps (as its user): what it holds, how it is mounted, and, once the test names
# them in /shared/pjiso-<job>.in, whether the neighbour's capability files can be stat()ed, and whether a file or
# a device node can be made there.
ISOLATION_SCRIPT = r"""python3 - <<'PY'
import errno, json, os, time
job = os.environ["SLURM_JOB_ID"]
caps = "/dev/nvidia-caps"
out = {"own": sorted(os.listdir(caps))}
out["mount"] = [l.split(" - ")[1].split()[0] + " " + l.split()[5] for l in open("/proc/self/mountinfo")
                if l.split()[4] == caps]
path = f"/shared/pjiso-{job}.in"
deadline = time.time() + 120
while not (os.path.exists(path) and os.path.getsize(path)) and time.time() < deadline:
    time.sleep(0.5)
def errname(call):
    try:
        call()
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
out["neighbour"] = {p: errname(lambda p=p: os.stat(p)) for p in json.load(open(path))}
out["create"] = errname(lambda: open(caps + "/made-by-job", "w"))
out["mknod"] = errname(lambda: os.mknod(caps + "/nvidia-cap9999", 0o20444, os.makedev(509, 9999)))
print("RESULT " + json.dumps(out))
PY
"""


def cap_files(instance: dict) -> list[str]:
    """The GI and CI capability files of a fake-NVML instance (the fake's GPU minor is its index)."""
    from slurm_gpushare.gpu.migminors import ci_access_minor, gi_access_minor

    gpu, gi = instance["gpu"], instance["gi"]
    minors = [gi_access_minor(gpu, gi)] + [ci_access_minor(gpu, gi, ci) for ci in instance["cis"]]
    return sorted(f"nvidia-cap{m}" for m in minors)


def test_two_jobs_on_one_gpu_each_see_only_their_own_capabilities(perjob_cluster):
    c = perjob_cluster
    assert node_py(c, "caps", "make")["files"] > 0
    big = submit(c, "gpu:a100_40g_7g.40gb:1")  # fills one GPU, so the two slices share the other
    jobs: list[int] = []
    try:
        wait_for(f"job {big} running", lambda: env_of(c, big).get("CUDA_VISIBLE_DEVICES"), 120)
        jobs = [submit(c, "gpu:a100_40g_1g.5gb:1", script=ISOLATION_SCRIPT) for _ in range(2)]
        envs = {
            j: wait_for(
                f"job {j}'s instance", lambda j=j: env_of(c, j).get("CUDA_VISIBLE_DEVICES") and env_of(c, j), 120
            )
            for j in jobs
        }
        assert envs[jobs[0]]["SLURM_JOB_GPUS"] == envs[jobs[1]]["SLURM_JOB_GPUS"], envs
        by_uuid = {u: inst for inst in node_py(c, "instances") for u in inst["uuids"]}
        own = {j: cap_files(by_uuid[envs[j]["CUDA_VISIBLE_DEVICES"]]) for j in jobs}
        for j, other in ((jobs[0], jobs[1]), (jobs[1], jobs[0])):
            paths = [f"/dev/nvidia-caps/{n}" for n in own[other]]
            for p in paths:  # the node has them: the job's private view hides them
                c.exec(NODE, ["stat", "-c", "%F %t:%T", p])
            text = json.dumps(paths)
            c.exec(
                "slurmctld",
                [
                    "bash",
                    "-c",
                    f"echo '{text}' >/shared/pjiso-{j}.tmp && mv /shared/pjiso-{j}.tmp /shared/pjiso-{j}.in",
                ],
            )
        results = {}
        for j in jobs:
            rec = c.wait(j, timeout=180)
            line = next((t for t in output(c, j).splitlines() if t.startswith("RESULT ")), None)
            assert rec["State"] == "COMPLETED" and line, (rec, output(c, j))
            results[j] = json.loads(line[len("RESULT ") :])
        for j, other in ((jobs[0], jobs[1]), (jobs[1], jobs[0])):
            got = results[j]
            assert got["own"] == own[j], f"job {j} sees {got['own']}, its own capabilities are {own[j]}"
            assert got["mount"] and got["mount"][-1].startswith("tmpfs ro"), got["mount"]
            assert set(got["neighbour"].values()) == {"ENOENT"}, (own[other], got["neighbour"])
            assert got["create"] == "EROFS" and got["mknod"] == "EROFS", got
        print(f"\nisolation: jobs {jobs} on GPU {envs[jobs[0]]['SLURM_JOB_GPUS']}: " + json.dumps(results))
    finally:
        cancel(c, big, *jobs)
        node_py(c, "caps", "remove")
        c.exec("slurmctld", ["bash", "-c", "rm -f /shared/pjiso-*"], check=False)
    quiet(c)
    assert "DRAIN" not in node_flags(c)
