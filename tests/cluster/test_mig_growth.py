"""S2's open question on real Slurm (24.11): can a MIG GPU's layout grow in place while a job runs?

The node lab-mig01 starts with a partial A100-SXM4-40GB layout, 1g.5gb x2 at
memory slices 0 and 1 (5 of 7 compute slices free). A job holds one
instance, with a pretend CUDA process on it in the fake NVML. Then, while it
runs, the layout is grown in place the way a node would do it:

1. the fake NVML (the node's own GPU backend, ``gpu.backend``) creates a third
   1g.5gb GPU instance at memory slice 2 and its full compute instance; the
   busy instance cannot be destroyed (NVML_ERROR_IN_USE), and
   `gpushare node mig apply` with the grown policy is refused (it rebuilds a
   GPU whose profile multiset differs: not an in-place tool);
2. `gpushare node gres-conf` with the grown policy rewrites the MIG include:
   the two old lines unchanged (same device files, same order), one new line;
3. the controller gets the grown slurm.conf (NodeName ... Gres=gpu:...:3) and
   ``scontrol reconfigure`` (24.11: slurmctld and every slurmd re-exec).

What Slurm 24.11.5 does, asserted here: on `scontrol reconfigure` slurmctld
re-executes, and while recovering its jobs it kills every job that holds
GRES on the node ("_find_invalid_job_gres_on_node: Killing job N: gres/gpu
count mismatch on node lab-mig01 (2 != 3)", "Aborting JobId=N due to use of
invalid GRES configuration") and requeues it (sacct -D: a REQUEUED run, the
job's output "CANCELLED ... DUE TO NODE FAILURE"); the node itself then
registers three instances, not drained, and serves three jobs at once, one
on the new instance. The other route fails the same way: a SIGHUP to the
node's slurmd alone (slurm.conf still at 3) ignores the new instance
("has 1 more configured than expected in slurm.conf. Ignoring extra GRES",
the job runs on); restarting slurmctld with the grown slurm.conf (4) then
kills and requeues the running job (3 != 4) and drains the node INVAL
("gres/gpu count reported lower than configured (3 < 4)"), its slurmd not
having re-read slurm.conf. So a GPU grows in place under NVML, but Slurm
cannot take the new count while a job holds the node's GPUs: growth needs
the drain (`gpushare node relayout`), i.e. it is a relayout, not in place.

Own compose project (GPUSHARE_GROWTH_PROJECT, default "growth") on a policy
that has only the MIG node group of etc/small-lab.yaml; always taken down
(GPUSHARE_GROWTH_KEEP=1 keeps it for debugging).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.node.relayout import parse_node_gres
from slurm_gpushare.policy import load_file
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import POLICY, own_cluster, wait_for

PROJECT = os.environ.get("GPUSHARE_GROWTH_PROJECT", "growth")
NODE = "lab-mig01"
FAKE = "/var/lib/gpushare/fake-nvml.json"
MIG_TYPE = "a100_40g_1g.5gb"
ENV_SCRIPT = "env | grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS)=' | sort\n"

# Runs on the node with the image's python: the node's GPU backend over the fake NVML.
NODE_PY = r"""
import json, sys
from slurm_gpushare.gpu import open_backend
from slurm_gpushare.hardware import get_model
b = open_backend(sys.argv[1])
op = sys.argv[2]
if op == "devices":
    starts = {g.id: g.start for g in b.gpu_instances(0)}
    devices = [{"uuid": d.uuid, "gi": d.gi_id, "ci": d.ci_id, "start": starts[d.gi_id]} for d in b.mig_devices(0)]
    print(json.dumps(devices))
elif op == "grow":
    start = int(sys.argv[3])
    p = get_model("A100-SXM4-40GB").profile("1g.5gb")
    try:
        gi = b.create_gpu_instance(0, p.profile_id, start)
        ci = b.create_compute_instance(0, gi.id, dict(p.compute_profiles)[p.name])
        print(json.dumps({"ok": True, "gi": gi.id, "ci": ci.id}))
    except Exception as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
elif op == "destroy":
    gi, ci = int(sys.argv[3]), int(sys.argv[4])
    try:
        b.destroy_compute_instance(0, gi, ci)
        print(json.dumps({"ok": True}))
    except Exception as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def growth_policy(path: Path, count: int) -> Path:
    """etc/small-lab.yaml cut down to its MIG node group, with the A100 at 1g.5gb x ``count``."""
    raw = yaml.safe_load(POLICY.read_text())
    raw["node_groups"] = [g for g in raw["node_groups"] if g["name"] == "lab-mig"]
    raw["node_groups"][0]["sharing"] = [{"gpus": 0, "mode": "mig", "layout": ["1g.5gb"] * count}]
    for tier in raw["tiers"]:
        tier["node_groups"] = ["lab-mig"]
    raw["submission"]["aliases"].pop("half", None)  # an mps alias, and no mps node is left
    raw["billing"]["gpu_weights"] = {"A100-SXM4-40GB": 100}
    text = f"# small-lab.yaml, MIG node only, 1g.5gb x{count} (tests/cluster/test_mig_growth.py)\n"
    path.write_text(text + yaml.safe_dump(raw, sort_keys=False))  # same inode: the nodes' bind mount sees it
    return path


@pytest.fixture(scope="module")
def growth_cluster():
    yield from own_cluster(
        "growth", PROJECT, lambda work: growth_policy(work / "growth.yaml", 2), "GPUSHARE_GROWTH_KEEP"
    )


# ---- helpers ----------------------------------------------------------------------------


def node_py(c: TestCluster, *args: str):
    out = c.exec(NODE, ["/opt/gpushare/bin/python", "-", FAKE, *args], input=NODE_PY).stdout
    return json.loads(out.strip().splitlines()[-1])


def submit(c: TestCluster, script: str, user: str = "carol", account: str = "biology") -> int:
    return c.sbatch(
        ENV_SCRIPT + script, user=user, account=account, output="/shared/growth-%j.out", gres=f"gpu:{MIG_TYPE}:1"
    )


def job_state(c: TestCluster, job: int) -> str:
    return c.job(job).get("JobState", "")


def env_of(c: TestCluster, job: int) -> dict[str, str]:
    text = c.exec("slurmctld", ["bash", "-c", f"cat /shared/growth-{job}.out 2>/dev/null || true"]).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def node_record(c: TestCluster) -> dict:
    return c.node_states()[NODE]


def gpu_count(rec: dict) -> int:
    return parse_node_gres(rec["gres"]).get(("gpu", MIG_TYPE), 0)


def watch_node(c: TestCluster, want: int, seconds: float = 40) -> tuple[dict, list[str]]:
    """Poll the node until it shows ``want`` instances and no bad flag (or ``seconds`` pass); every state seen."""
    seen, deadline, rec = [], time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        try:
            rec = node_record(c)
        except Exception as exc:  # slurmctld re-executing: the client cannot reach it for a moment
            seen.append(f"unreachable: {type(exc).__name__}")
            time.sleep(1)
            continue
        line = f"State={rec['state']} Gres={rec['gres']} Reason={rec['reason']}"
        if not seen or seen[-1] != line:
            seen.append(line)
        if gpu_count(rec) == want and not rec["flags"] & {"DRAIN", "INVAL", "DOWN", "NOT_RESPONDING", "FAIL"}:
            break
        time.sleep(1)
    return rec, seen


def slurmd_log(c: TestCluster, pattern: str) -> str:
    return c.exec(
        NODE, ["bash", "-c", f"grep -hE '{pattern}' /var/log/slurm/slurmd*.log 2>/dev/null | tail -n 20 || true"]
    ).stdout


def grow(c: TestCluster, count: int) -> tuple[list[dict], str]:
    """Create one more 1g.5gb at the next free slice, make its device files, rewrite the include from a
    grown policy (the host policy file too: the nodes and slurmctld mount it); (devices, include)."""
    before = node_py(c, "devices")
    made = node_py(c, "grow", str(count - 1))  # 1g.5gb x(count-1) sit at slices 0..count-2
    assert made["ok"], f"creating a GPU instance in the free slices failed: {made}"
    grown = growth_policy(Path(c.policy), count)
    c.exec(NODE, ["bash", "-c", "cat >/tmp/grown.yaml"], input=grown.read_text())
    c.exec(NODE, ["gpushare", "node", "gres-conf", "--policy", "/tmp/grown.yaml", "--node", NODE, "--fake-nvml", FAKE])
    # The new GI/CI capability device files (nvidia-modprobe on a real node; a missing one makes slurmd exit).
    c.exec(
        NODE,
        [
            "python3",
            "/usr/local/lib/gpushare-docker/fake_gpus.py",
            "--gres-conf",
            "/etc/slurm/gres.conf",
            "--node",
            NODE,
        ],
    )
    after = node_py(c, "devices")
    assert [d["uuid"] for d in after[: len(before)]] == [d["uuid"] for d in before], (before, after)
    assert len(after) == count
    return after, c.exec(NODE, ["cat", "/etc/slurm/gres.d/gpushare-mig.conf"]).stdout


def ctld_log(c: TestCluster, pattern: str) -> str:
    return c.exec("slurmctld", ["bash", "-c", f"grep -hE '{pattern}' /var/log/slurm/slurmctld.log || true"]).stdout


def runs(c: TestCluster, job: int) -> list[dict]:
    """Every sacct record of the job, requeued runs included (sacct -D)."""
    return c.sacct(job, extra=["--duplicates"])


# ---- the scenario -----------------------------------------------------------------------


def test_grow_mig_layout_in_place_while_a_job_runs(growth_cluster):
    c = growth_cluster
    t0 = time.monotonic()
    assert gpu_count(node_record(c)) == 2
    include_before = c.exec(NODE, ["cat", "/etc/slurm/gres.d/gpushare-mig.conf"]).stdout
    old_lines = [line for line in include_before.splitlines() if line.startswith("NodeName=")]
    assert len(old_lines) == 2

    # A long job on one instance, with a pretend CUDA process on it.
    long_job = submit(c, "sleep 150\necho long-done\n")
    wait_for(f"job {long_job} running", lambda: job_state(c, long_job) == "RUNNING", timeout=90)
    env = wait_for(f"job {long_job}'s environment", lambda: env_of(c, long_job).get("CUDA_VISIBLE_DEVICES"), timeout=90)
    mine = next(d for d in node_py(c, "devices") if d["uuid"] == env)
    c.exec(
        NODE,
        [
            "gpushare",
            "node",
            "fake-nvml",
            "add-process",
            "--state",
            FAKE,
            "--gpu",
            "0",
            "--pid",
            "4242",
            "--gi",
            str(mine["gi"]),
            "--ci",
            str(mine["ci"]),
            "--used-mib",
            "1000",
        ],
    )

    # NVML's rules (MIG user guide), as the fake follows them: a busy instance cannot be destroyed ...
    refused = node_py(c, "destroy", str(mine["gi"]), str(mine["ci"]))
    assert not refused["ok"] and "IN_USE" in refused["error"].upper().replace(" ", "_"), refused
    # ... `gpushare node mig apply` rebuilds a GPU whose multiset differs, so it refuses while busy ...
    grown3 = growth_policy(Path(tempfile.mkdtemp(prefix="gpushare-growth-")) / "g3.yaml", 3)
    c.exec(NODE, ["bash", "-c", "cat >/tmp/grown.yaml"], input=grown3.read_text())
    apply = c.exec(
        NODE,
        ["gpushare", "node", "mig", "apply", "--policy", "/tmp/grown.yaml", "--node", NODE, "--fake-nvml", FAKE],
        check=False,
    )
    assert apply.returncode == 1 and "processes are running" in apply.stderr, apply
    # ... but a new GPU instance in the free slices is created beside the busy one: the GPU grows in place.
    devices3, include3 = grow(c, 3)
    new_lines = [line for line in include3.splitlines() if line.startswith("NodeName=")]
    assert new_lines[:2] == old_lines and len(new_lines) == 3, include3
    print("include after growth:\n" + include3)
    c.exec(NODE, ["gpushare", "node", "fake-nvml", "remove-process", "--state", FAKE, "--pid", "4242"])
    assert job_state(c, long_job) == "RUNNING"

    # Route 1: the grown slurm.conf (Gres=gpu:a100_40g_1g.5gb:3) and `scontrol reconfigure`.
    c.reconfigure(load_file(c.policy))
    rec, seen = watch_node(c, 3)
    print("node after scontrol reconfigure:", *seen, sep="\n  ")
    # The node takes the new count, no drain, no INVAL ...
    assert gpu_count(rec) == 3 and not rec["flags"] & {"DRAIN", "INVAL", "DOWN"}, seen
    # ... but slurmctld, recovering its jobs, kills the one holding the node's GRES and requeues it.
    killed = ctld_log(c, f"Killing job {long_job}|JobId={long_job} due to|Requeue job JobId={long_job}")
    print("slurmctld log:\n" + killed)
    assert (
        f"_find_invalid_job_gres_on_node: Killing job {long_job}: gres/gpu count mismatch on node {NODE} (2 != 3)"
        in killed
    )
    assert f"Aborting JobId={long_job} due to use of invalid GRES configuration" in killed
    first = wait_for(
        f"job {long_job}'s first run ended",
        lambda: [r for r in runs(c, long_job) if r["State"] == "REQUEUED"],
        timeout=90,
    )
    print("sacct -D:", *runs(c, long_job), sep="\n  ")
    assert first[0]["End"] != "Unknown"
    out = c.read_shared(f"growth-{long_job}.out")
    assert "DUE TO NODE FAILURE" in out and "long-done" not in out, out
    c.slurm(["scancel", str(long_job)])

    # With no job on it, the grown node serves three jobs at once, one of them on the new instance.
    jobs = [
        submit(c, "sleep 15\n", user=u, account=a)
        for u, a in (("carol", "biology"), ("dave", "biology-imaging"), ("alice", "physics"))
    ]
    wait_for("three jobs running at once", lambda: all(job_state(c, j) == "RUNNING" for j in jobs), timeout=90)
    uuids = {wait_for(f"job {j}'s env", lambda j=j: env_of(c, j).get("CUDA_VISIBLE_DEVICES"), timeout=90) for j in jobs}
    assert uuids == {d["uuid"] for d in devices3}, (uuids, devices3)
    for j in jobs:
        r = c.wait(j, timeout=120)
        assert (r["State"], r["ExitCode"]) == ("COMPLETED", "0:0"), r

    # Route 2: only the node's slurmd re-reads its gres.conf (SIGHUP); slurmctld keeps slurm.conf's 3.
    job2 = submit(c, "sleep 120\necho second-done\n")
    wait_for(f"job {job2} running", lambda: job_state(c, job2) == "RUNNING", timeout=90)
    grow(c, 4)
    c.exec(NODE, ["bash", "-c", "kill -HUP $(cat /run/slurmd.pid)"])
    ignored = wait_for("slurmd's re-read of gres.conf", lambda: slurmd_log(c, "Ignoring extra GRES"), timeout=30)
    rec_hup, seen_hup = watch_node(c, 4, seconds=10)
    print("node after SIGHUP of slurmd only (slurm.conf still says 3):", *seen_hup, ignored, sep="\n  ")
    # slurmd keeps slurm.conf's count: the new instance is ignored, the job runs on.
    assert "has 1 more configured than expected in slurm.conf. Ignoring extra GRES." in ignored
    assert gpu_count(rec_hup) == 3 and not rec_hup["flags"] & {"DRAIN", "INVAL", "DOWN"}, seen_hup
    assert job_state(c, job2) == "RUNNING"
    # Then the controller's slurm.conf (4) and a restart of slurmctld: the job is killed and requeued as
    # before, and the node, whose slurmd still counts 3, is drained as invalid.
    c.write_config(load_file(c.policy))
    c.compose("run", "--rm", "--no-deps", "config", timeout=120)
    c.compose("restart", "-t", "10", "slurmctld", timeout=180)
    want = "gres/gpu count reported lower than configured (3 < 4)"
    rec_ctld = wait_for(
        "the node's drain", lambda: (lambda r: r if want in r["reason"] else None)(node_record(c)), timeout=90
    )
    print("node after restarting slurmctld with the grown slurm.conf:", rec_ctld)
    assert {"DRAIN", "INVALID_REG"} <= rec_ctld["flags"] | set(rec_ctld["state"].split("+")), rec_ctld
    killed2 = ctld_log(c, f"Killing job {job2}|JobId={job2} due to|Requeue job JobId={job2}")
    print("slurmctld log:\n" + killed2)
    assert (
        f"_find_invalid_job_gres_on_node: Killing job {job2}: gres/gpu count mismatch on node {NODE} (3 != 4)"
        in killed2
    )
    assert [r["State"] for r in runs(c, job2)][0] == "REQUEUED"
    assert "second-done" not in c.read_shared(f"growth-{job2}.out")
    print(f"scenario took {time.monotonic() - t0:.0f} s")
