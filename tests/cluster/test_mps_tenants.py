"""Two tenants on one MPS GPU, in both compute modes, on real Slurm (issue 14 part 8).

Its own compose project ("mpstenants"): two MPS nodes with one A30 each and the node hooks on.
lab-mps01 is in DEFAULT compute mode (the policy's default; partition batch): two users' MPS jobs
run on its GPU at once, each with its own control daemon and server. lab-mpsx01's MPS GPU has
``compute_mode: exclusive_process``: node setup puts the fake GPU in EXCLUSIVE_PROCESS
(`nvidia-smi -c`), where one process (one MPS server) may hold it, and the policy renders its
partition mpsx with ExclusiveUser=YES, so Slurm runs one user's jobs there at a time; that
user's jobs share one daemon whatever their percentages. No job fails, no node drains, nothing
is left behind.

Run: flock /tmp/gpushare-cluster.lock env GPUSHARE_MPS_TENANTS_PROJECT=mpstenants \
  .venv/bin/python -m pytest -q -s tests/cluster/test_mps_tenants.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import POLICY, own_cluster, wait_for

PROJECT = os.environ.get("GPUSHARE_MPS_TENANTS_PROJECT", "mpstenants")
STATE = "/var/lib/gpushare"
FAKE = f"{STATE}/fake-nvml.json"
HOLD = 6  # seconds each job runs: long enough to overlap, short for CI


def tenants_policy(path: Path) -> Path:
    """small-lab.yaml's cluster, tenants and hooks; two one-A30 MPS nodes, one per compute mode."""
    raw = yaml.safe_load(POLICY.read_text())
    group = {"gpu": {"model": "A30-24GB", "count": 1}, "cpus": 8, "memory_mb": 16000}
    raw["node_groups"] = [
        {"name": "lab-mps", "nodes": "lab-mps01", **group, "sharing": [{"gpus": 0, "mode": "mps", "units": 100}]},
        {
            "name": "lab-mpsx",
            "nodes": "lab-mpsx01",
            **group,
            "sharing": [{"gpus": 0, "mode": "mps", "units": 100, "compute_mode": "exclusive_process"}],
        },
    ]
    raw["tiers"] = [
        {"name": "batch", "default": True, "node_groups": ["lab-mps"], "priority": 10, "preempt_mode": "off"},
        {"name": "mpsx", "node_groups": ["lab-mpsx"], "priority": 10, "preempt_mode": "off"},
    ]
    raw.pop("submission", None)
    raw["billing"] = {"gpu_weights": {"A30-24GB": 50}, "cpu": 0.0}
    path.write_text(
        "# two MPS nodes, DEFAULT and EXCLUSIVE_PROCESS (tests/cluster/test_mps_tenants.py)\n"
        + yaml.safe_dump(raw, sort_keys=False)
    )
    return path


@pytest.fixture(scope="module")
def tenants_cluster():
    yield from own_cluster(
        "mpstenants", PROJECT, lambda work: tenants_policy(work / "mps-tenants.yaml"), "GPUSHARE_MPS_TENANTS_KEEP"
    )


SCRIPT = f"""echo "PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
echo "PIPE=$CUDA_MPS_PIPE_DIRECTORY"
echo "SERVERS=$(echo get_server_list | nvidia-cuda-mps-control | wc -l)"
sleep {HOLD}
"""
# DEFAULT: each job waits (at most 60 s) until two MPS servers run on the node at once, then holds 3 s more so
# the other job sees them too: how far apart Slurm starts the two jobs (a busy CI machine) does not matter.
BOTH = """for i in $(seq 120); do n=$(pgrep -c -f '[n]vidia-cuda-mps-server'); [ "$n" -ge 2 ] && break; sleep 0.5; done
echo "HELD=$n"
sleep 3
"""


def submit(c: TestCluster, user: str, account: str, pct: int, partition: str, script: str = SCRIPT) -> int:
    return c.sbatch(
        script, user=user, account=account, output="/shared/tenants-%j.out", gres=f"mps:{pct}", partition=partition
    )


def finished(c: TestCluster, job: int) -> tuple[dict, dict[str, str]]:
    rec = c.wait(job, timeout=180)
    assert rec["State"] == "COMPLETED", (rec, c.job(job))
    out = c.read_shared(f"tenants-{job}.out")
    return rec, dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def node_shell(c: TestCluster, node: str, script: str) -> str:
    return c.exec(node, ["bash", "-c", script]).stdout


def mps_logs(c: TestCluster, node: str) -> str:
    return node_shell(
        c,
        node,
        "tail -n 40 /var/log/slurm/gpushare-mps/*/*.log; ps -eo pid,user,args | grep [n]vidia; "
        f"ls -l {FAKE}.mps-contexts",
    )


def left_behind(c: TestCluster, node: str) -> str:
    """Journals, MPS daemons or servers still on the node (empty when clean)."""
    return node_shell(
        c, node, f"ls {STATE}/jobs/*.json 2>/dev/null; pgrep -a -f '[n]vidia-cuda-mps-control' || true"
    ).strip()


def assert_clean(c: TestCluster, node: str) -> None:
    wait_for(f"nothing left on {node}", lambda: not left_behind(c, node), 60)
    state = c.node_states()[node]
    assert not any(f.startswith("DRAIN") for f in state["flags"]), state


def considered(job: dict) -> dict | None:
    """The job once the scheduler has looked at it (started, or pending with a reason)."""
    return job if job.get("JobState") != "PENDING" or job.get("Reason") not in (None, "None") else None


def overlap(a: dict, b: dict) -> bool:
    return max(a["Start"], b["Start"]) < min(a["End"], b["End"])


def test_default_mode_runs_two_users_servers_on_one_gpu_at_once(tenants_cluster):
    c = tenants_cluster
    assert (
        node_shell(
            c, "lab-mps01", f"GPUSHARE_FAKE_NVML={FAKE} nvidia-smi --query-gpu=compute_mode --format=csv,noheader"
        ).strip()
        == "Default"
    )
    script = SCRIPT.replace(f"sleep {HOLD}\n", BOTH)
    jobs = [submit(c, "alice", "physics", 25, "batch", script), submit(c, "carol", "biology", 25, "batch", script)]
    (ra, ea), (rc, ec) = [finished(c, j) for j in jobs]
    held = (ea["HELD"], ec["HELD"])
    assert held == ("2", "2"), f"two users' servers on one DEFAULT GPU at once, seen {held}: {mps_logs(c, 'lab-mps01')}"
    assert overlap(ra, rc), (
        f"DEFAULT: the two users' jobs did not overlap: {ra['Start']}-{ra['End']}, {rc['Start']}-{rc['End']}"
    )
    assert ea["PIPE"] != ec["PIPE"] and ea["PCT"] == ec["PCT"] == "25"
    assert ea["SERVERS"] == ec["SERVERS"] == "1"  # each daemon runs its own user's server
    print(f"\nDEFAULT: alice {ra['Start']}-{ra['End']}, carol {rc['Start']}-{rc['End']}, servers seen at once: {held}")
    assert_clean(c, "lab-mps01")


def test_exclusive_process_keeps_the_gpu_to_one_user_at_a_time(tenants_cluster):
    c = tenants_cluster
    assert (
        node_shell(
            c, "lab-mpsx01", f"GPUSHARE_FAKE_NVML={FAKE} nvidia-smi --query-gpu=compute_mode --format=csv,noheader"
        ).strip()
        == "Exclusive_Process"
    )
    assert "ExclusiveUser=YES" in c.scontrol("show", "partition", "mpsx").stdout
    go = f"/shared/tenants-go-{os.getpid()}"  # alice's jobs hold the node until the test has seen carol wait
    hold = SCRIPT.replace(
        f"sleep {HOLD}\n", f"for i in $(seq 120); do [ -e {go} ] && break; sleep 0.5; done\nsleep 1\n"
    )
    alice = [submit(c, "alice", "physics", 25, "mpsx", hold), submit(c, "alice", "physics", 50, "mpsx", hold)]
    wait_for("alice's two jobs running", lambda: all(c.job(j).get("JobState") == "RUNNING" for j in alice), 90, 0.5)
    carol = submit(c, "carol", "biology", 25, "mpsx")
    waiting = wait_for("carol's job considered by the scheduler", lambda: considered(c.job(carol)), 30, 0.5)
    assert waiting["JobState"] == "PENDING", waiting  # alice holds the node: Slurm keeps carol off it
    assert all(c.job(j).get("JobState") == "RUNNING" for j in alice)
    c.exec("slurmctld", ["touch", go])
    (r1, e1), (r2, e2), (r3, e3) = [finished(c, j) for j in (*alice, carol)]
    c.exec("slurmctld", ["rm", "-f", go])
    assert overlap(r1, r2), (
        f"alice's two jobs should share the GPU: {r1['Start']}-{r1['End']}, {r2['Start']}-{r2['End']}"
    )
    assert e1["PIPE"] == e2["PIPE"] and (e1["PCT"], e2["PCT"]) == ("25", "50")  # one daemon, each job its own limit
    assert not overlap(r1, r3) and not overlap(r2, r3), (
        f"EXCLUSIVE_PROCESS: carol ran beside alice: {r1['Start']}-{r1['End']}, {r2['Start']}-{r2['End']}, "
        f"{r3['Start']}-{r3['End']}"
    )
    assert e3["SERVERS"] == "1" and e3["PIPE"] != e1["PIPE"]
    print(
        f"\nEXCLUSIVE_PROCESS: alice {r1['Start']}-{r1['End']} and {r2['Start']}-{r2['End']}, "
        f"carol {r3['Start']}-{r3['End']} (pending meanwhile: Reason={waiting['Reason']})"
    )
    assert_clean(c, "lab-mpsx01")
