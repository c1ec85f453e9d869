"""A job's process poses as an MPS server of another user's key and as that user's batch slurmstepd (issue 31
class 4): root's hooks never read its memory, so they neither kill it nor wait on it.

Two users' ``mps:25`` jobs on the small lab's MPS node. carol's job holds; alice's job starts a decoy that
names itself ``nvidia-cuda-mps`` (comm), titles itself ``slurmstepd: [<carol's job>.batch]`` (argv) and
carries carol's pipe dir in its environment, then holds too. carol's control daemon is SIGKILLed (as the OOM
killer would), so carol's epilog looks for what the daemon left by the pipe dir in processes' environments.
Her servers (carol's) are killed; alice's decoy is neither carol's nor root's, so its environment is never
read and it lives on. Before the fix the epilog read every process's environment and killed the decoy;
on a node where a user can back that memory with a FUSE file, the same read would have blocked carol's
epilog, and every later hook on the node, for as long as alice liked. The test cluster's nodes have no
/dev/fuse, so that blocking read is covered in the unit tier (tests/unit/node/test_procscan.py, with a FIFO);
here the decoy's survival shows the read is not made. The node is never drained.

Its own compose project (small-lab with the node hooks, as tests/cluster/test_node_runtime.py).
Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_proc_reads.py
"""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.test_node_runtime import (
    STATE,
    env_of,
    finished,
    hooks_policy,
    journals,
    node_shell,
    running,
    submit,
    wait_clean,
)

PROJECT = os.environ.get("GPUSHARE_PROC_READS_PROJECT", "gpsh31procreads")
NODE = "lab-mps01"
GO = f"/shared/proc-reads-go-{os.getpid()}"  # carol's job ends
GO_ALICE = GO + "-alice"  # alice's job ends (her decoy with it): only after carol's epilog was checked

HOLD = """set -e
echo "PIPE=$CUDA_MPS_PIPE_DIRECTORY"
for i in $(seq 480); do [ -e {go} ] && break; sleep 0.5; done
"""

# alice: the decoy. ``exec -a`` gives it the title (argv[0]); it names itself as the MPS processes are named
# (comm, as prctl(PR_SET_NAME) does); its environment names carol's pipe dir (her key, g0-u<uid>-p25, can be
# guessed). (Perl's $0 would overwrite the environment with the title: python3 keeps it.)
DECOY = (
    """victim={state}/mps/g0-u$(id -u carol)-p25/pipe
CUDA_MPS_PIPE_DIRECTORY=$victim bash -c 'exec -a "slurmstepd: [{job}.batch]" /usr/bin/python3 \\
  -c "open(\\"/proc/self/comm\\", \\"w\\").write(\\"nvidia-cuda-mps\\"); import time; time.sleep(900)"' \\
  </dev/null >/dev/null 2>&1 &
echo "DECOY=$!"
"""
    + HOLD
)


@pytest.fixture(scope="module")
def lab():
    yield from own_cluster(
        "procreads", PROJECT, lambda work: hooks_policy(work / "small-lab-hooks.yaml"), "GPUSHARE_PROC_READS_KEEP"
    )


def alive(c, pid: int) -> bool:
    state = node_shell(c, NODE, f"cat /proc/{pid}/stat 2>/dev/null || true").stdout
    return bool(state) and state.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def drained(c) -> dict[str, list[str]]:
    return {n: s["flags"] for n, s in c.node_states().items() if any(f.startswith("DRAIN") for f in s["flags"])}


def decoy_of(c, job: int) -> int | None:
    out = c.exec("slurmctld", ["cat", f"/shared/hooks-{job}.out"], check=False).stdout  # not there yet: ""
    pid = env_of(out).get("DECOY", "").strip()
    return int(pid) if pid.isdigit() else None


def test_a_decoy_posing_as_another_users_mps_server_and_slurmstepd_is_not_read(lab):
    c = lab
    uid = node_shell(c, NODE, "id -u carol").stdout.strip()
    pipe = f"{STATE}/mps/g0-u{uid}-p25/pipe"
    victim = submit(c, HOLD.format(go=GO), user="carol", account="biology", gres="mps:25")
    try:
        wait_for("carol's MPS job to run", lambda: running(c, victim), 120)
        attacker = submit(
            c, DECOY.format(state=STATE, job=victim, go=GO_ALICE), user="alice", account="physics", gres="mps:25"
        )
        wait_for("alice's job to run", lambda: running(c, attacker), 120)
        decoy = wait_for("alice's decoy", lambda: decoy_of(c, attacker), 60)
        wait_for(
            "the decoy's name",
            lambda: node_shell(c, NODE, f"cat /proc/{decoy}/comm").stdout.strip() == "nvidia-cuda-mps",
            30,
        )
        state = json.loads(node_shell(c, NODE, f"cat {pipe}/.fake-state.json").stdout)
        servers = [int(p) for p in state["servers"]]
        node_shell(c, NODE, f"kill -9 {state['pid']}")  # carol's daemon dies; her servers outlive it
        c.exec("slurmctld", ["touch", GO])  # carol's job ends; her epilog looks for what her daemon left
        finished(c, victim)
        wait_for("carol's epilog (her journal gone)", lambda: len(journals(c, NODE)) == 1, 60)
        assert not any(alive(c, p) for p in servers), f"carol's servers {servers} outlived her epilog"
        assert alive(c, decoy), f"alice's decoy {decoy} was killed by carol's epilog: its environment was read"
        assert drained(c) == {}
        c.exec("slurmctld", ["touch", GO_ALICE])
        finished(c, attacker)
    finally:
        c.exec("slurmctld", ["touch", GO, GO_ALICE], check=False)  # neither job holds past a failure
        node_shell(c, NODE, "pkill -9 -u alice -f 'slurmstepd: \\[' || true", check=False)
        c.exec("slurmctld", ["rm", "-f", GO, GO_ALICE], check=False)
    wait_clean(c, NODE)
    assert drained(c) == {}
