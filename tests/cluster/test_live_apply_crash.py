"""The live apply path killed mid-change on real Slurm (24.11): `kill -9` of `gpushare live apply` right
after its relayout job was submitted, before it recorded the job; the next run finds the job by its name and
finishes the change: one relayout job, the node relaid out and back in service, no lock left.

Own compose project (GPUSHARE_LIVECRASH_PROJECT, default "livecrash") on the policy of
tests/cluster/test_live_planner.py (lab-mig01 all-1g.5gb; lab-mig02 3g.20gb+2g.10gb+1g.5gb, drained by the test
so the 3g type stays configured; live planner on). Always taken down (GPUSHARE_LIVECRASH_KEEP=1 keeps it).

The kill is timed by the one step that matters, not by a sleep: the applier runs with a directory first on its
PATH holding an `sbatch` that runs the real one, marks the submission in a file, and does not return; the
test kills the applier with SIGKILL once the mark is there, so the job exists and the applier never read its
id. Nothing of the product is changed for this: the applier runs Slurm's commands from its PATH as in any
installation.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.test_live_planner import (
    APPLY,
    LIVE,
    LOCK,
    NODE,
    SPARE,
    T3G,
    live_policy,
    locks,
    node,
    once,
    phase,
    relayout_jobs,
    state,
    submit,
)
from tests.cluster.test_node_runtime import MAKE_CAPS

PROJECT = os.environ.get("GPUSHARE_LIVECRASH_PROJECT", "livecrash")
SHIM_DIR = "/run/gpushare-test-bin"
SUBMITTED = "/run/gpushare-test-submitted"  # the shim's mark: "<job id> <shim pid>"
APPLIER_PID = "/run/gpushare-test-applier.pid"
APPLIER_LOG = "/var/log/gpushare-test-applier.log"
ENDED = ("done", "failed", "gave_up", "lost")

# The real sbatch, its output passed on, then the mark, then no return (the applier waits on its output).
SHIM = """#!/bin/sh
out=$({real} "$@") || exit $?
echo "$out"
echo "$out $$" >{mark}.tmp && mv {mark}.tmp {mark}
exec sleep 600
"""


@pytest.fixture(scope="module")
def crash_cluster():
    yield from own_cluster(
        "livecrash", PROJECT, lambda work: live_policy(work / "live.yaml"), "GPUSHARE_LIVECRASH_KEEP"
    )


def sh(c, line: str, check: bool = True) -> str:
    return c.exec("slurmctld", ["bash", "-c", line], check=check).stdout


def start_applier(c) -> None:
    real = sh(c, "command -v sbatch").strip()
    sh(c, f"mkdir -p {SHIM_DIR} && rm -f {SUBMITTED}")
    c.exec(
        "slurmctld",
        ["bash", "-c", f"cat >{SHIM_DIR}/sbatch && chmod 755 {SHIM_DIR}/sbatch"],
        input=SHIM.format(real=real, mark=SUBMITTED),
    )
    c.compose(
        "exec",
        "-d",
        "-T",
        "slurmctld",
        "bash",
        "-c",
        f"echo $$ >{APPLIER_PID}; PATH={SHIM_DIR}:$PATH exec {' '.join(APPLY)} >{APPLIER_LOG} 2>&1",
        timeout=60,
    )


def alive(c, pid: int) -> bool:
    return sh(c, f"kill -0 {pid} 2>/dev/null && echo yes || echo no").strip() == "yes"


def test_killed_after_submitting_the_relayout_job_the_next_run_finishes_the_change(crash_cluster):
    c = crash_cluster
    t0 = time.monotonic()
    c.exec(NODE, ["python3", "-c", MAKE_CAPS])
    c.scontrol("update", f"nodename={SPARE}", "state=drain", "reason=test: out for repair")
    pending = [submit(c, T3G, 5, user=u, account=a) for u, a in (("carol", "biology"), ("alice", "physics"))]
    wait_for("the 3g jobs to pend", lambda: all(c.job(j).get("JobState") == "PENDING" for j in pending), timeout=60)
    wait_for(
        "a scheduling pass to give them their reason",
        lambda: all(c.job(j).get("Reason") not in (None, "None") for j in pending),
        timeout=60,
        every=0.5,
    )

    start_applier(c)
    mark = wait_for(
        "the relayout job's submission",
        lambda: sh(c, f"cat {SUBMITTED} 2>/dev/null || true").split(),
        timeout=120,
        every=0.5,
    )
    job, shim = int(mark[0]), int(mark[1])
    applier = int(sh(c, f"cat {APPLIER_PID}").strip())
    sh(c, f"kill -KILL {applier}")
    wait_for("the applier to be gone", lambda: not alive(c, applier), timeout=30)
    sh(c, f"kill -KILL {shim}; rm -rf {SHIM_DIR}", check=False)
    print("killed applier log:\n" + sh(c, f"cat {APPLIER_LOG}", check=False))

    record = state(c)["current"][NODE]
    print("record after the kill:", json.dumps(record, indent=1))
    assert record["phase"] == "submitting" and record["job"] is None, record  # the job was never recorded
    assert LOCK in locks(c)

    outs = []

    def ended() -> bool:
        outs.append(once(c))
        print(outs[-1])
        return phase(c) in ENDED

    wait_for("the next runs to end the change", ended, timeout=300, every=3)
    record = state(c)["current"][NODE]
    print("change record:", json.dumps(record, indent=1))
    jobs = relayout_jobs(c)
    print("relayout jobs:", jobs)
    assert [(int(j["JobID"]), j["State"], j["ExitCode"]) for j in jobs] == [(job, "COMPLETED", "0:0")], jobs
    assert record["phase"] == "done" and record["job"] == job, record
    assert any(f"relayout job {job} found by its name {LOCK}" in out for out in outs), outs[0]
    assert not locks(c)
    after = node(c)
    print(f"{NODE} after: {after}")
    assert T3G in after["gres"] and not after["flags"] & {"DRAIN", "INVAL", "DOWN"}, after
    live_doc = yaml.safe_load(sh(c, f"cat {LIVE}"))
    sharing = next(g["sharing"] for g in live_doc["node_groups"] if g["nodes"] == NODE)
    assert sharing[0]["layout"] == record["layouts"][0][2], sharing  # the live policy says what the node has (GPU 0)
    for j in pending:
        r = c.wait(j, timeout=180)
        assert (r["State"], r["ExitCode"]) == ("COMPLETED", "0:0"), r
    print(
        f"KILLED MID-CHANGE: applier pid {applier} killed after submitting job {job}; the next runs found it and "
        f"recorded the change done; scenario {time.monotonic() - t0:.0f} s"
    )
