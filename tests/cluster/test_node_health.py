"""`gpushare node health` on the docker cluster: small-lab with the node hooks and the health
check on (HealthCheckProgram = the installed gpushare-node-health console script).

slurmd runs the program at its start (before it registers) and every interval; the interval
here is an hour so the scenarios below decide when it runs: directly, with docker exec on the
node. That the cluster came up idle already says the start-up runs drained nothing. The last test runs
nothing by hand: for it the interval is lowered to 10 s (``scontrol reconfigure``; the bundled policy's
minute, shorter) and put back afterwards. The cluster runs AuthInfo=cred_expire=30 (tests/cluster/tuning.py),
so a requeued job starts again 31 s after its requeue, not Slurm's default 121 s.

Run: GPUSHARE_HEALTH_PROJECT=gpsh5health .venv/bin/python -m pytest -q -s tests/cluster/test_node_health.py
"""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.node.health import PREFIX
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import ended_drain, own_cluster, wait_for
from tests.cluster.test_node_runtime import NODES, hooks_policy, journals
from tests.cluster.test_soak import kill_a_hook
from tests.cluster.tuning import FAST_REQUEUE, tuned

PROJECT = os.environ.get("GPUSHARE_HEALTH_PROJECT", "gpsh5health")
PROGRAM = "/opt/gpushare/bin/gpushare-node-health"  # the wheel's console script in the image


def health_policy(path: Path) -> Path:
    hooks_policy(path)
    raw = yaml.safe_load(path.read_text())
    raw["cluster"]["health"] = {"program": PROGRAM, "interval": 3600, "node_state": ["ANY"]}
    path.write_text(
        "# small-lab.yaml with the node hooks and the health check on (tests/cluster/test_node_health.py)\n"
        + yaml.safe_dump(raw, sort_keys=False)
    )
    return path


@pytest.fixture(scope="module")
def health_cluster():
    write, files = tuned(lambda work: health_policy(work / "small-lab-health.yaml"), FAST_REQUEUE)
    yield from own_cluster("health", PROJECT, write, "GPUSHARE_HEALTH_KEEP", conf_files=files)


def set_interval(c: TestCluster, seconds: int) -> None:
    """HealthCheckInterval in the cluster's live slurm.conf, read by `scontrol reconfigure` (24.11 restarts
    slurmctld and the slurmds with it); returns once slurmctld answers with the new value."""
    c.slurm(["sed", "-i", f"s/^HealthCheckInterval=.*/HealthCheckInterval={seconds}/", "/etc/slurm/slurm.conf"])
    c.scontrol("reconfigure")

    def applied() -> bool:
        res = c.slurm(["scontrol", "show", "config"], check=False)
        return (
            res.returncode == 0 and re.search(rf"^HealthCheckInterval\s*= {seconds} sec$", res.stdout, re.M) is not None
        )

    wait_for(f"slurmctld back with HealthCheckInterval={seconds}", applied, 120)
    c.wait_idle(timeout=120)


@contextmanager
def health_every(c: TestCluster, seconds: int):
    """slurmd runs the health check every ``seconds`` inside the block; every hour again after it."""
    set_interval(c, seconds)
    try:
        yield
    finally:
        set_interval(c, 3600)


def health(c: TestCluster, node: str) -> tuple[int, str, float]:
    """Run the program as slurmd would (root, no arguments, SLURMD_NODENAME), timed from here."""
    start = time.monotonic()
    res = c.exec(node, ["env", f"SLURMD_NODENAME={node}", PROGRAM], check=False, timeout=120)
    return res.returncode, res.stdout + res.stderr, time.monotonic() - start


def slurmd_health_runs(
    c: TestCluster, node: str, count: int, timeout: float, program: str = "gpushare-node-health"
) -> int:
    """Wait on ``node`` until ``count`` runs of the health ``program`` started by its slurmd (an ancestor is the
    pid in /run/slurmd.pid, so runs by docker exec do not count) have started and ended; their number. The
    node's processes are polled every 20 ms (a run takes a good part of a second)."""
    probe = (
        "import os, sys, time\n"
        "slurmd = open('/run/slurmd.pid').read().strip()\n"
        "def parent(pid):\n"
        "    return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
        "def by_slurmd(pid):\n"
        "    for _ in range(8):\n"
        "        pid = parent(pid)\n"
        "        if pid == slurmd: return True\n"
        "        if pid in ('0', '1'): return False\n"
        "    return False\n"
        "seen, ended = set(), set()\n"
        f"end = time.time() + {timeout}\n"
        f"while time.time() < end and len(ended) < {count}:\n"
        "    live = set()\n"
        "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "        try:\n"
        "            cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        f"            if any(part.endswith({program.encode()!r}) for part in cmd[:3]) and by_slurmd(pid):\n"
        "                live.add(pid)\n"
        "        except OSError:\n"
        "            continue\n"
        "    seen |= live\n"
        "    ended |= seen - live\n"
        "    time.sleep(0.02)\n"
        "print(len(ended))\n"
    )
    res = c.exec(node, ["python3", "-c", probe], timeout=timeout + 30)
    return int(res.stdout.split()[-1])


def state(c: TestCluster, node: str) -> dict:
    return c.node_states()[node]


def drained_state(s: dict) -> dict | None:
    return s if "DRAIN" in s["state"] else None


def undrained_state(s: dict) -> dict | None:
    return None if "DRAIN" in s["state"] else s


def test_rendered_and_healthy_nodes_are_left_alone(health_cluster):
    c = health_cluster
    conf = c.exec("slurmctld", ["scontrol", "show", "config"]).stdout
    assert re.search(rf"^HealthCheckProgram\s*= {re.escape(PROGRAM)}$", conf, re.MULTILINE), conf
    assert re.search(r"^HealthCheckInterval\s*= 3600 sec$", conf, re.MULTILINE), conf
    figures = []
    for node in NODES:
        code, out, took = health(c, node)
        assert code == 0 and out.strip().endswith(f"node {node}: healthy"), out
        assert "DRAIN" not in state(c, node)["flags"]
        figures.append(f"{node} {took:.2f} s")
    print("\ngpushare-node-health, one run per node (docker exec included): " + ", ".join(figures))
    # the in-container time alone, without docker exec's own start-up
    for node in NODES:
        res = c.exec(node, ["bash", "-c", f"TIMEFORMAT=%R; time (SLURMD_NODENAME={node} {PROGRAM} >/dev/null)"])
        figures_in = res.stderr.strip().splitlines()[-1]
        print(f"gpushare-node-health on {node}, timed in the container: {figures_in} s")


def test_missing_device_file_drains_then_resumes_once_restored(health_cluster):
    c, node = health_cluster, "lab-excl01"
    # keep the device node under another name in the same /dev (a hard link), then remove it
    c.exec(node, ["bash", "-c", "ln /dev/nvidia1 /dev/.gpushare-test-nvidia1 && rm /dev/nvidia1"])
    try:
        code, out, _ = health(c, node)
        assert code == 0, out
        s = state(c, node)
        assert "DRAIN" in s["flags"] and s["reason"].startswith(PREFIX) and "/dev/nvidia1" in s["reason"], (s, out)
        assert "PROBLEM: device files missing: /dev/nvidia1" in out
    finally:
        c.exec(node, ["bash", "-c", "mv /dev/.gpushare-test-nvidia1 /dev/nvidia1"])
    code, out, _ = health(c, node)
    assert code == 0 and "resume (drained by the health check" in out, out
    s = state(c, node)
    assert "DRAIN" not in s["flags"] and not s["reason"], s


def test_admin_drain_is_left_alone(health_cluster):
    c, node = health_cluster, "lab-shard01"
    c.scontrol("update", f"nodename={node}", "state=drain", "reason=admin")
    try:
        code, out, _ = health(c, node)
        assert code == 0 and "drained by someone else (admin), not resumed" in out, out
        s = state(c, node)
        assert "DRAIN" in s["flags"] and s["reason"] == "admin", s
    finally:
        c.scontrol("update", f"nodename={node}", "state=resume")


# ---- slurmd's own health runs, nobody's hand ---------------------------------------------------------------


def test_a_killed_prolog_is_healed_by_the_health_check_alone(health_cluster):
    """SIGKILL our prolog while it runs on lab-excl01: slurmctld drains the node ``Prolog error`` and requeues
    the job. Nobody runs anything by hand: slurmd's own health runs (every 10 s here) clean up and resume the
    node, and the requeued job runs again and completes."""
    c, node = health_cluster, "lab-excl01"
    ready = "/tmp/gpushare-test-prolog-killer.ready"
    with health_every(c, 10):
        conf = c.exec("slurmctld", ["scontrol", "show", "config"]).stdout
        assert re.search(rf"^HealthCheckProgram\s*= {re.escape(PROGRAM)}$", conf, re.MULTILINE), conf
        assert "DRAIN" not in state(c, node)["state"]
        c.exec(node, ["rm", "-f", ready])
        since = c.slurm(["date", "-u", "+%Y-%m-%dT%H:%M:%S"]).stdout.strip()
        killed = []
        killer = threading.Thread(
            target=lambda: killed.append(kill_a_hook(c, node, "gpushare-prolog", 90, ready=ready))
        )
        killer.start()
        wait_for(
            "the prolog killer to poll",
            lambda: c.exec(node, ["test", "-e", ready], check=False).returncode == 0,
            60,
            every=0.5,
        )
        job = c.sbatch("true\n", user="carol", account="biology", gres="gpu:l40s:1", nodelist=node, output="/dev/null")
        killer.join()
        assert killed == [True], "no prolog ran on lab-excl01 within 90 s"
        # the drain may last less than a poll (slurmd's next health run may come at once): slurmdbd's record of it
        try:
            drain = wait_for(
                f"{node}'s drain after the killed prolog, ended by slurmd's health runs",
                lambda: ended_drain(c, node, since),
                200,
                every=2,
            )
        except AssertionError:
            print(
                c.slurm(
                    ["sacctmgr", "-n", "-P", "list", "event", f"nodes={node}", f"start={since}"], check=False
                ).stdout,
                c.exec(
                    "slurmctld",
                    ["bash", "-c", f"grep -iE '{node}|drain|prolog' /var/log/slurm/slurmctld.log | tail -n 30"],
                    check=False,
                ).stdout,
                sep="\n",
            )
            raise
        healed = wait_for(f"{node} not drained", lambda: undrained_state(state(c, node)), 60)
        rec = c.wait(job, timeout=240)
        assert rec["State"] == "COMPLETED", rec
        wait_for(f"no journal on {node}", lambda: not journals(c, node), 90)
    print(
        f"\nprolog of job {job} SIGKILLed on {node}: drained '{drain['Reason']}' at {drain['Start']}, resumed by the "
        f"health check alone at {drain['End']} ({healed['state']}); the requeued job {rec['State']}"
    )
