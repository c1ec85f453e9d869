"""An interactive job never drains a node (issue 21 part 2), on the newcomer's cluster: etc/small-lab.yaml as
bundled, the health check on (slurmd runs it every minute).

A user runs ``salloc`` on lab-excl01 itself and is placed there: squeue's batch host for a job with no batch
script is its submit host (lab-excl01), and there is no ``slurmstepd: [JOB.batch]`` on the node. Before the
fix the health check took it for a lost launch once it had run 120 s, ``scontrol requeue`` refused it (batch
jobs only), and the refusal drained the node on every run. Here the job is held past the lost-launch
threshold, lowered to 5 s for the runs made by hand (``gpushare node health --lost-after 5``, the admin form
of the same check), while slurmd's own runs go on: the node is never drained, the job is never requeued.
slurmctld is given the node's name for the container's address (``name_the_node_as_its_host``), so the
batch host is the node's name, as on a real cluster.

Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_interactive_drain.py
"""

from __future__ import annotations

import time

from tests.cluster.conftest import wait_for
from tests.cluster.test_node_runtime import FAKE, node_shell

NODE = "lab-excl01"
USER, ACCOUNT = "carol", "biology"
THRESHOLD = 5
RUNS = 3


def drained(c) -> bool:
    state = c.node_states()[NODE]
    return "DRAIN" in state["flags"] or "DRAIN" in state["state"]


def salloc_job(c) -> int | None:
    out = c.slurm(["squeue", "-h", "-u", USER, "-n", "interactive-on-node", "-o", "%A %T"], check=False).stdout.split()
    return int(out[0]) if len(out) == 2 and out[1] == "RUNNING" else None


def name_the_node_as_its_host(c) -> None:
    """slurmctld names an allocation's submit host by the peer address of salloc's request. Docker's resolver
    names a container's address by the container (gpusharetest_lab-excl01_1); on a real cluster it is the
    node's host name. /etc/hosts, read first, gives slurmctld the node's name for it, as a site's DNS does."""
    ip = c.exec("slurmctld", ["bash", "-c", f"getent hosts {NODE} | awk '{{print $1; exit}}'"]).stdout.strip()
    c.exec(
        "slurmctld",
        ["bash", "-c", f"cp /etc/hosts /tmp/hosts.orig; {{ echo '{ip} {NODE}'; cat /tmp/hosts.orig; }} > /etc/hosts"],
    )
    assert c.exec("slurmctld", ["getent", "hosts", ip]).stdout.split()[1:2] == [NODE]
    # slurmctld caches the names of addresses for a minute (getnameinfo cache, Slurm 24.11): a name it cached
    # before the change holds until then. A restarted slurmctld has none (24.11's reconfigure re-executes it).
    if submit_host(c) != NODE:
        c.scontrol("reconfigure")
        wait_for("slurmctld to answer again", lambda: "is UP" in c.slurm(["scontrol", "ping"], check=False).stdout, 120)
    wait_for(f"slurmctld to name {ip} {NODE}", lambda: submit_host(c) == NODE, 90, every=2)


def submit_host(c) -> str:
    """The host slurmctld names for a request from the node: a held batch job's AllocNode (the same lookup of the
    peer's address as for salloc's request), the job cancelled at once."""
    job = (
        node_shell(
            c,
            NODE,
            f"su -s /bin/bash {USER} -c 'sbatch --parsable -H -A {ACCOUNT} -J name-probe -o /dev/null --wrap true'",
            check=False,
        )
        .stdout.strip()
        .split(";")[0]
    )
    if not job.isdigit():
        return ""  # slurmctld not answering yet
    try:
        host = c.job(int(job)).get("AllocNode:Sid", "").split(":")[0]
    finally:
        c.slurm(["scancel", job], check=False)
    return host


def test_an_salloc_job_from_the_node_held_past_the_threshold_never_drains_it(cluster):
    c = cluster
    assert not drained(c)
    name_the_node_as_its_host(c)
    # salloc from the compute node's container, placed on that node; it holds the allocation with no batch script
    node_shell(
        c,
        NODE,
        f"su -s /bin/bash {USER} -c 'setsid nohup salloc -Q -A {ACCOUNT} -w {NODE} "
        "--gres=gpu:l40s:1 -J interactive-on-node sleep 240 </dev/null >/tmp/salloc.out 2>&1 &'",
    )
    job = wait_for("the salloc job to run", lambda: salloc_job(c), 120)
    running = time.monotonic()
    try:
        fields = c.slurm(["squeue", "-h", "-j", str(job), "--Format", "BatchHost:|,BatchFlag:"]).stdout.strip()
        assert fields == f"{NODE}|0", fields  # the premise: batch host = this node, no batch script
        health = [
            "gpushare",
            "node",
            "health",
            "--policy",
            "/etc/gpushare/policy.yaml",
            "--node",
            NODE,
            "--fake-nvml",
            FAKE,
            "--lost-after",
            str(THRESHOLD),
        ]
        outputs = []
        # the job has run since before `running`: past the threshold from THRESHOLD + 1 s after it
        time.sleep(max(0.0, running + THRESHOLD + 1 - time.monotonic()))
        for _ in range(RUNS):  # several runs, each past the threshold
            res = c.exec(NODE, health, check=False, timeout=120)
            outputs.append(res.stdout + res.stderr)
            assert res.returncode == 0, outputs[-1]
            assert "requeue" not in outputs[-1] and not drained(c), outputs[-1]
        assert salloc_job(c) == job  # still running, never requeued
        assert not drained(c), c.node_states()[NODE]
        print(
            f"\nsalloc job {job} on {NODE} (batch host {NODE}, batch flag 0): {len(outputs)} health runs with a "
            f"{THRESHOLD} s threshold, node never drained; last run: {outputs[-1].strip().splitlines()[-1]}"
        )
    finally:
        c.slurm(["scancel", str(job)], check=False)
        c.exec("slurmctld", ["bash", "-c", "cat /tmp/hosts.orig > /etc/hosts"], check=False)
    wait_for(f"{NODE} idle again", lambda: c.node_states()[NODE]["state"] == "IDLE", 120)
    assert not drained(c)
