"""One bad journal does not stop the node (issue 21 part 3), on the small lab's MPS node.

Root plants an unreadable journal (garbage bytes) for a job Slurm does not run on lab-mps01; then an
unrelated user's ``mps:25`` job runs to completion: its prolog and epilog succeed, its MPS daemon is gone
afterwards, the bad file is set aside (``<id>.json.bad-<UTC time>``, its bytes kept for the admin), and the
node is not drained (no GPU is in doubt: docs/admins/journal.md). Before the fix the prolog failed on the
file (``JournalStore.all()`` raised), the job was requeued and the node drained.

Its own compose project (small-lab with the node hooks, as tests/cluster/test_node_runtime.py).
Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_bad_journal.py
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.test_node_runtime import (
    ENV_SCRIPT,
    STATE,
    env_of,
    finished,
    hooks_policy,
    mps_daemons,
    node_shell,
    submit,
    wait_clean,
)

PROJECT = os.environ.get("GPUSHARE_BAD_JOURNAL_PROJECT", "gpsh21badjournal")
NODE = "lab-mps01"
BAD = 987654  # a job id this cluster never reaches
GARBAGE = r"\x8b\xff\x00not a journal\xfe"  # printf's escapes: not UTF-8, not JSON


@pytest.fixture(scope="module")
def lab():
    yield from own_cluster(
        "badjournal", PROJECT, lambda work: hooks_policy(work / "small-lab-hooks.yaml"), "GPUSHARE_BAD_JOURNAL_KEEP"
    )


def jobs_dir(c) -> list[str]:
    return node_shell(c, NODE, f"ls -A {STATE}/jobs").stdout.split()


def test_an_unrelated_mps_job_runs_and_ends_cleanly_beside_a_bad_journal(lab):
    c = lab
    node_shell(
        c,
        NODE,
        f"mkdir -p {STATE}/jobs && printf '{GARBAGE}' > {STATE}/jobs/{BAD}.json && "
        f"cp {STATE}/jobs/{BAD}.json /root/bad-journal.bytes",
    )
    job = submit(c, ENV_SCRIPT + "sleep 2\n", gres="mps:25")
    rec, out = finished(c, job)  # prolog failed -> requeued/held and never COMPLETED
    assert rec["State"] == "COMPLETED" and rec["NodeList"] == NODE, rec
    env = env_of(out)
    assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25" and env.get("CUDA_MPS_PIPE_DIRECTORY"), out
    wait_clean(c, NODE)  # the epilog removed the job's own journal
    wait_for(f"no MPS daemon left on {NODE}", lambda: not mps_daemons(c, NODE), 60)
    names = jobs_dir(c)
    aside = [n for n in names if n.startswith(f"{BAD}.json.bad-")]
    assert len(aside) == 1 and f"{BAD}.json" not in names, names
    node_shell(c, NODE, f"cmp {STATE}/jobs/{aside[0]} /root/bad-journal.bytes")  # set aside as it was
    state = c.node_states()[NODE]
    assert not any(f.startswith("DRAIN") for f in state["flags"]) and "DRAIN" not in state["state"], state
    modes = node_shell(c, NODE, f"stat -c '%a %U' {STATE}/jobs").stdout.split()
    assert modes == ["711", "root"], modes  # root's, not listable by the job's user
    print(f"\njob {job} COMPLETED beside a bad journal; set aside as {aside[0]}; {NODE}: {state['state']}")
