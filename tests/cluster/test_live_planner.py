"""The live planner on real Slurm (24.11): `gpushare live apply` changes a MIG layout for the queue.

Own compose project (GPUSHARE_LIVE_PROJECT, default "live") on the MIG part
of etc/small-lab.yaml with two A100 nodes: lab-mig01 laid out all-1g.5gb,
lab-mig02 laid out 3g.20gb+2g.10gb+1g.5gb and drained by the test ("out for
repair": Slurm only takes a job whose GPU type some node has, so the 3g and
1g types stay configured). ``live:`` is enabled with min_pending 0, a
min_dwell longer than the module, max_wait 240 s. Always taken down
(GPUSHARE_LIVE_KEEP=1 keeps it for debugging).

The scenarios, in order (each starts from where the last left the cluster):

1. a 1g job runs on lab-mig01 and three 3g jobs pend; two planner loops
   (`--every 3`, two processes started at once) run in slurmctld: one takes
   the lock (reservation gpushare-relayout-lab-mig01), the other finds it
   held; when the 1g job has ended, the root job relayouts the node; the 3g
   jobs run; every job COMPLETED 0:0, the 1g job's one record unchanged (never
   requeued), exactly one relayout job; SIGTERM ends both loops. The relayout
   job's elapsed time (drain, apply, reconfigure, re-registration, resume) is
   printed: live.change_cost's evidence;
2. demand alternating between 1g and 3g within min_dwell: no second change;
3. a mode change: lab-shard01's 4 shards are held by four running jobs and
   four more shard jobs pend; the planner turns an idle exclusive GPU of
   lab-excl01 into 4 shards (the same lock, live policy, render and root
   relayout job); the pending jobs run there; every job COMPLETED 0:0, the
   running ones with one record each;
4. node weights: a 2-GPU job pends while a 1-GPU job holds lab-excl01 (the
   only node with two L40S): one run raises lab-excl01's weight above
   lab-shard01's with `scontrol update` (no drain, no lock); once the 2-GPU
   job has run, the next run puts the policy's weight back;
5. min_dwell later (the state file's record moved back), a relayout that
   fails (the MIG capability device files nvidia-modprobe would make are
   missing): the node stays drained with the relayout's reason, the change is
   recorded failed, and the next runs do not try again.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.slurm.relayoutjob import LockHeld, create_lock
from tests.cluster.conftest import POLICY, own_cluster, wait_for
from tests.cluster.test_node_runtime import MAKE_CAPS

PROJECT = os.environ.get("GPUSHARE_LIVE_PROJECT", "live")
NODE, SPARE = "lab-mig01", "lab-mig02"
FAKE = "/var/lib/gpushare/fake-nvml.json"
T1G, T3G = "a100_40g_1g.5gb", "a100_40g_3g.20gb"
STATE = "/etc/slurm/gpushare-live-state.json"
LIVE = "/etc/slurm/gpushare-live.yaml"
PLAN = ["gpushare", "live", "report", "--policy", "/etc/gpushare/policy.yaml"]
APPLY = ["gpushare", "live", "apply", "--policy", "/etc/gpushare/policy.yaml"]
LOCK = f"gpushare-relayout-{NODE}"
MIN_DWELL = 1800

# What the driver (nvidia-modprobe) provides on a real node: a device file for every GI and CI access capability
# of GPU 0 (MAKE_CAPS of tests/cluster/test_node_runtime.py, which does the same before its relayout).
# The node without them: every capability file the present gres include does not name goes.
DROP_CAPS = """
import os, re
keep = set(re.findall(r'/dev/nvidia-caps/nvidia-cap\\d+', open('/etc/slurm/gres.d/gpushare-mig.conf').read()))
for name in os.listdir('/dev/nvidia-caps'):
    path = '/dev/nvidia-caps/' + name
    if path not in keep and name not in ('nvidia-cap1', 'nvidia-cap2'):
        os.unlink(path)
"""


def live_policy(path: Path) -> Path:
    raw = yaml.safe_load(POLICY.read_text())
    mig = next(g for g in raw["node_groups"] if g["name"] == "lab-mig")
    spare = {
        **mig,
        "name": "lab-mig3",
        "nodes": SPARE,
        "sharing": [{"gpus": 0, "mode": "mig", "layout": ["3g.20gb", "2g.10gb", "1g.5gb"]}],
    }
    # the L40S nodes for the mode change: lab-excl01 (2 exclusive), lab-shard01 (1 GPU in 4 shards)
    l40s = [g for g in raw["node_groups"] if g["name"] in ("lab-excl", "lab-shard")]
    raw["node_groups"] = [mig, spare] + l40s
    for tier in raw["tiers"]:
        tier["node_groups"] = ["lab-mig", "lab-mig3"] + [g["name"] for g in l40s]
    raw["submission"]["aliases"].pop("half", None)  # an mps alias, and no mps node is left
    raw["billing"]["gpu_weights"] = {"A100-SXM4-40GB": 100}
    raw["live"] = {
        "enabled": True,
        "min_pending": 0,
        "min_dwell": MIN_DWELL,
        "min_benefit_jobs": 1,
        "max_draining": 1,
        "max_wait": 240,
        "change_cost": 60,
    }
    text = "# small-lab.yaml, MIG nodes only, live planner on (tests/cluster/test_live_planner.py)\n"
    path.write_text(text + yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def live_cluster():
    yield from own_cluster("live", PROJECT, lambda work: live_policy(work / "live.yaml"), "GPUSHARE_LIVE_KEEP")


# ---- helpers ----------------------------------------------------------------------------


def submit(c, gres: str, seconds: int, user: str = "carol", account: str = "biology", limit: int = 1) -> int:
    return c.sbatch(
        f"sleep {seconds}\necho done\n",
        user=user,
        account=account,
        output="/shared/live-%j.out",
        gres=f"gpu:{gres}:1",
        time=limit,
    )


def held_until(go: str, most: int) -> str:
    """A job script that runs until the test makes the file ``go`` (in /shared), then ends: the test, not a
    sleep, decides when the job ends (after ``most`` seconds it ends anyway, inside its time limit)."""
    return f"end=$((SECONDS + {most}))\nwhile [ ! -e {go} ] && [ $SECONDS -lt $end ]; do sleep 0.2; done\necho done\n"


def release(c, go: str) -> None:
    c.exec("slurmctld", ["touch", go])


def state(c) -> dict:
    out = c.exec("slurmctld", ["bash", "-c", f"cat {STATE} 2>/dev/null || true"]).stdout
    return json.loads(out) if out.strip() else {}


def phase(c, name: str = NODE) -> str:
    return state(c).get("current", {}).get(name, {}).get("phase", "")


def relayout_jobs(c) -> list[dict]:
    fields = ["JobID", "State", "ExitCode", "Start", "End", "ElapsedRaw"]
    out = c.slurm(["sacct", "-a", "-X", "-n", "-P", f"--name={LOCK}", "-S", "now-1days", "-o", ",".join(fields)]).stdout
    return [dict(zip(fields, line.split("|"), strict=False)) for line in out.splitlines() if line.strip()]


def locks(c) -> list[str]:
    doc = json.loads(c.slurm(["scontrol", "show", "reservation", "--json"]).stdout)
    return [r["name"] for r in doc.get("reservations", []) if r["name"].startswith("gpushare-relayout-")]


def diagnose(c, name: str = NODE) -> str:
    """What a failed wait on the relayout job needs to be read: the jobs Slurm has on the node and named for the
    lock, the relayout jobs' logs, the node's journals and its record."""
    script = (
        f"squeue -a -w {name} -o '%A %T %u %b %R'; squeue -a --name={LOCK} -o '%A %T %R %S'; "
        f"scontrol show reservation {LOCK}; "
        f'for f in /var/log/slurm/{LOCK}-*.log; do echo "== $f"; tail -n 30 "$f"; done; '
        "ls -l /var/lib/gpushare/jobs /run/gpushare 2>&1 | head -40"
    )
    here = c.exec(name, ["bash", "-c", script], check=False)
    ctld = c.slurm(["bash", "-c", "squeue -a -o '%A %T %u %b %N %R'; sinfo -N -o '%N %T %E'"], check=False)
    return f"---- {name} ----\n{here.stdout}{here.stderr}---- slurmctld ----\n{ctld.stdout}{ctld.stderr}"


def once(c) -> str:
    res = c.slurm(APPLY, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def start_loop(c, tag: str) -> None:
    c.compose(
        "exec",
        "-d",
        "-T",
        "slurmctld",
        "bash",
        "-c",
        f"echo $$ >/run/gpushare-live-{tag}.pid; exec {' '.join(APPLY)} --every 3 "
        f">>/var/log/gpushare-live-{tag}.log 2>&1",
        timeout=60,
    )


def stop_loop(c, tag: str) -> str:
    c.slurm(["bash", "-c", f"kill -TERM $(cat /run/gpushare-live-{tag}.pid)"])
    log = f"/var/log/gpushare-live-{tag}.log"
    wait_for(f"planner {tag} to stop", lambda: "stopped" in c.slurm(["cat", log]).stdout, timeout=60)
    return c.slurm(["cat", log]).stdout


def node(c, name: str = NODE) -> dict:
    return c.node_states()[name]


# ---- the scenarios ----------------------------------------------------------------------


def test_pending_3g_jobs_get_lab_mig01_relaid_out_when_its_1g_job_ends(live_cluster):
    c = live_cluster
    t0 = time.monotonic()
    c.exec(NODE, ["python3", "-c", MAKE_CAPS])
    c.scontrol("update", f"nodename={SPARE}", "state=drain", "reason=test: out for repair")
    go = "/shared/live-go-1g"
    c.exec("slurmctld", ["rm", "-f", go])
    # runs until the lock is seen below (a fixed 90 s outlived the setup on a loaded machine; 40 s did not once)
    running = c.sbatch(
        held_until(go, 170), user="carol", account="biology", output="/shared/live-%j.out", gres=f"gpu:{T1G}:1", time=3
    )
    wait_for(f"job {running} running", lambda: c.job(running).get("JobState") == "RUNNING", timeout=90)
    pending = [
        submit(c, T3G, 5, user=u, account=a)
        for u, a in (("carol", "biology"), ("dave", "biology-imaging"), ("alice", "physics"))
    ]
    wait_for("the 3g jobs to pend", lambda: all(c.job(j).get("JobState") == "PENDING" for j in pending), timeout=60)
    time.sleep(3)  # a scheduling pass gives them their reason
    reasons = {j: c.job(j).get("Reason") for j in pending}
    print("3g jobs pending:", reasons)
    report = c.slurm(PLAN).stdout
    print("gpushare live report:\n" + report)
    assert LOCK not in locks(c)

    # two planners at once, each its own process
    start_loop(c, "a")
    start_loop(c, "b")
    wait_for("the lock", lambda: LOCK in locks(c), timeout=60)
    assert c.job(running).get("JobState") == "RUNNING"  # the lock does not touch the running job
    # a third would-be holder: Slurm 24.11 refuses the same name ("Duplicate reservation name"), read as LockHeld
    with pytest.raises(LockHeld):
        create_lock(c.client(), NODE, 60)
    release(c, go)  # the 1g job ends: the lock's holder relays the node out
    wait_for("the relayout to be done", lambda: phase(c) in ("done", "failed", "gave_up", "lost"), timeout=300, every=2)
    record = state(c)["current"][NODE]
    print("change record:", json.dumps(record, indent=1))
    assert record["phase"] == "done", record
    for j in pending:
        r = c.wait(j, timeout=180)
        assert (r["State"], r["ExitCode"]) == ("COMPLETED", "0:0"), r
    logs = {tag: stop_loop(c, tag) for tag in ("a", "b")}
    for tag, text in logs.items():
        print(f"---- planner {tag} log (last lines) ----\n" + "\n".join(text.splitlines()[-25:]))

    first = c.wait(running, timeout=60)
    assert (first["State"], first["ExitCode"]) == ("COMPLETED", "0:0"), first
    assert len(c.sacct(running, extra=["--duplicates"])) == 1  # one run: never requeued
    jobs = relayout_jobs(c)
    print("relayout jobs:", jobs)
    assert len(jobs) == 1 and jobs[0]["State"] == "COMPLETED", jobs
    assert not locks(c)
    assert sum(state(c)["counts"].get(NODE, {}).values()) == 1
    assert any(
        "holds the node" in t
        or "under relayout" in t
        or "relayout already started" in t
        or "another planner recorded a change" in t
        for t in logs.values()
    ), "neither planner saw the other's lock"
    after = node(c)
    print(f"{NODE} after: {after}")
    assert T3G in after["gres"] and not after["flags"] & {"DRAIN", "INVAL", "DOWN"}
    log = c.exec(NODE, ["bash", "-c", f"cat /var/log/slurm/{LOCK}-{jobs[0]['JobID']}.log"]).stdout
    print(f"relayout job log:\n{log}")
    assert f"node {NODE}: resumed" in log
    print(
        f"CHANGE COST (relayout job elapsed: drain, MIG apply, gres include, scontrol reconfigure, "
        f"re-registration, resume): {jobs[0]['ElapsedRaw']} s; lock -> relayout submitted (the 1g job ending): "
        f"{record['submitted_at'] - record['locked_at']:.1f} s; submitted -> recorded done (job start, the job, "
        f"the next planner run): {record['ended_at'] - record['submitted_at']:.1f} s; scenario "
        f"{time.monotonic() - t0:.0f} s"
    )


def test_demand_alternating_faster_than_min_dwell_changes_nothing_more(live_cluster):
    c = live_cluster
    layout = c.exec("slurmctld", ["grep", "-A3", f"nodes: {NODE}", LIVE], check=False).stdout
    print(f"live policy, {NODE}:\n{layout}")
    held = []
    for gres in (T1G, T3G, T1G):
        jobs = [submit(c, gres, 3, user=u, account=a) for u, a in (("carol", "biology"), ("alice", "physics"))]
        time.sleep(2)
        out = once(c)
        held += [line for line in out.splitlines() if "min_dwell" in line]
        for j in jobs:
            c.slurm(["scancel", str(j)])
    print("held back:", *held, sep="\n  ")
    assert len(relayout_jobs(c)) == 1 and not locks(c)
    assert state(c)["counts"] == {NODE: {"done": 1}}
    if T1G not in node(c)["gres"]:  # the new layout has no 1g.5gb: the 1g demand wanted a change back
        assert held, "1g jobs blocked, but no change held back by min_dwell"


def test_pending_shard_jobs_turn_an_idle_exclusive_gpu_into_shards(live_cluster):
    c = live_cluster
    t0 = time.monotonic()
    excl, shard = "lab-excl01", "lab-shard01"
    users = (("carol", "biology"), ("alice", "physics"), ("dave", "biology-imaging"), ("bob", "physics"))
    # one shard each (the policy's submission rules refuse shard:2: two shards are no more of the GPU than one)
    go = "/shared/live-go-shard"
    c.exec("slurmctld", ["rm", "-f", go])
    # they hold lab-shard01 until the mode change is done (released below)
    running = [
        c.sbatch(
            held_until(go, 110), user=u, account=a, output="/shared/live-%j.out", gres="shard:1", time=2, nodelist=shard
        )
        for u, a in users
    ]
    wait_for("the shard jobs to run", lambda: all(c.job(j).get("JobState") == "RUNNING" for j in running), timeout=90)
    pending = [
        c.sbatch("sleep 5\necho done\n", user=u, account=a, output="/shared/live-%j.out", gres="shard:1", time=1)
        for u, a in users
    ]
    wait_for("the shard jobs to pend", lambda: all(c.job(j).get("JobState") == "PENDING" for j in pending), timeout=60)
    time.sleep(3)
    print("shard jobs pending:", {j: c.job(j).get("Reason") for j in pending})
    report = c.slurm(PLAN).stdout
    print("gpushare live report:\n" + report)
    assert f"{excl} has 0 GPU jobs running: mode change GPU 0 exclusive -> shard (4 replicas)" in report, report
    out = once(c)  # no GPU job on lab-excl01: locked and the relayout job submitted in this one run
    print(out)

    def ended() -> bool:  # a planner run records the relayout job's end
        print(once(c))
        return phase(c, excl) in ("done", "failed", "gave_up", "lost")

    wait_for("the mode change to be done", ended, timeout=240, every=3)
    record = state(c)["current"][excl]
    print("change record:", json.dumps(record, indent=1))
    log = c.exec(excl, ["bash", "-c", f"cat /var/log/slurm/gpushare-relayout-{excl}-{record['job']}.log"], check=False)
    print(f"relayout job log:\n{log.stdout}{log.stderr}")
    print(f"{excl}: {node(c, excl)}")
    assert record["phase"] == "done", record
    assert record["modes"] == [[0, {"mode": "exclusive"}, {"mode": "shard", "replicas": 4}]], record
    after = node(c, excl)
    print(f"{excl} after: {after}")
    assert "shard" in after["gres"] and not after["flags"] & {"DRAIN", "INVAL", "DOWN"}, after
    # lab-shard01 is freed once every pending job has started (on lab-excl01's new shards)
    wait_for(
        "the pending shard jobs to start",
        lambda: all(c.job(j).get("JobState") != "PENDING" for j in pending),
        timeout=120,
    )
    release(c, go)
    for j in pending + running:
        r = c.wait(j, timeout=180)
        assert (r["State"], r["ExitCode"]) == ("COMPLETED", "0:0"), r
    assert {c.sacct(j)[0]["NodeList"] for j in pending} == {excl}, [c.sacct(j) for j in pending]
    for j in running:
        assert len(c.sacct(j, extra=["--duplicates"])) == 1  # never requeued by the other node's reconfigure
    out = c.slurm(
        [
            "sacct",
            "-a",
            "-X",
            "-n",
            "-P",
            f"--name=gpushare-relayout-{excl}",
            "-S",
            "now-1days",
            "-o",
            "JobID,State,ExitCode,ElapsedRaw",
        ]
    ).stdout
    print("relayout jobs:", out)
    assert len(out.split()) == 1 and "|COMPLETED|0:0|" in out, out
    print(f"MODE CHANGE: relayout job {out.strip()}; scenario {time.monotonic() - t0:.0f} s")


def weight(c, name: str) -> int:
    return next(n.weight for n in c.client(timeout=30).nodes() if n.name == name)


def test_a_blocked_two_gpu_job_raises_the_weight_of_the_node_it_needs(live_cluster):
    c = live_cluster
    excl = "lab-excl01"
    assert weight(c, excl) == 1
    go = "/shared/live-go-small"
    c.exec("slurmctld", ["rm", "-f", go])
    small = c.sbatch(
        held_until(go, 55),
        user="carol",
        account="biology",
        output="/shared/live-%j.out",
        gres="gpu:l40s:1",
        time=1,
        nodelist=excl,
    )  # holds one GPU until released below
    wait_for(f"job {small} running", lambda: c.job(small).get("JobState") == "RUNNING", timeout=90)
    large = c.sbatch(
        "sleep 3\necho done\n", user="alice", account="physics", output="/shared/live-%j.out", gres="gpu:l40s:2", time=1
    )
    wait_for(f"job {large} to pend", lambda: c.job(large).get("JobState") == "PENDING", timeout=60)
    time.sleep(3)
    print(f"job {large}:", c.job(large).get("Reason"))
    out = once(c)
    print(out)
    assert f"{excl}: weight 1 -> 2: job {large} has waited" in out, out
    assert weight(c, excl) == 2 and state(c)["weights"] == {excl: 2}
    assert not locks(c) and "DRAIN" not in node(c, excl)["flags"]  # no lock, no drain
    release(c, go)
    for j in (small, large):
        r = c.wait(j, timeout=180)
        assert (r["State"], r["ExitCode"]) == ("COMPLETED", "0:0"), r
    assert c.sacct(large)[0]["NodeList"] == excl
    out = once(c)
    print(out)
    assert f"{excl}: weight 2 -> 1: no job waits for several whole GPUs on one node" in out, out
    assert weight(c, excl) == 1 and state(c)["weights"] == {}


def test_a_failed_relayout_leaves_the_node_drained_and_is_not_retried(live_cluster):
    c = live_cluster
    c.exec(NODE, ["python3", "-c", DROP_CAPS])
    # min_dwell later: the record of the last change moved back (the planner reads the time from there)
    doc = state(c)
    for key in ("locked_at", "submitted_at", "ended_at"):
        doc["current"][NODE][key] -= MIN_DWELL + 60
    c.exec("slurmctld", ["bash", "-c", f"cat >{STATE}.tmp && mv {STATE}.tmp {STATE}"], input=json.dumps(doc))
    layout_now = node(c)["gres"]
    wanted = T1G if T1G not in layout_now else T3G
    jobs = [submit(c, wanted, 3, user=u, account=a, limit=1) for u, a in (("carol", "biology"), ("alice", "physics"))]
    time.sleep(2)
    print(once(c))

    def ended() -> bool:  # a planner run records the relayout job's end (from squeue, or sacct once it has gone)
        print(once(c))
        return phase(c) in ("done", "failed", "gave_up", "lost")

    try:
        wait_for("a planner run to record the relayout job's end", ended, timeout=240, every=3)
    finally:
        print(diagnose(c))
    record = state(c)["current"][NODE]
    print("change record:", json.dumps(record, indent=1))
    assert record["phase"] == "failed", record
    rec = node(c)
    print(f"{NODE}: {rec}")
    assert "DRAIN" in rec["flags"] and rec["reason"].startswith("gpushare relayout failed:"), rec
    assert re.search(r"device files that do not exist", rec["reason"]), rec
    assert not locks(c)
    for _ in range(2):
        print(once(c))
    wait_for("slurmdbd to have both relayout jobs", lambda: len(relayout_jobs(c)) == 2, timeout=60)
    assert len(relayout_jobs(c)) == 2 and not locks(c)  # not tried again
    assert state(c)["counts"][NODE] == {"done": 1, "failed": 1}
    for j in jobs:
        c.slurm(["scancel", str(j)])
