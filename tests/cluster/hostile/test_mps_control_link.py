"""A job turns its MPS pipe dir's ``control`` into a link to another user's socket (issue 21 part 1).

Two users' ``mps:25`` jobs on the small lab's MPS node, each with its own root control daemon. The
victim (carol) holds her job; the attacker (alice) replaces ``control`` in her own pipe dir (hers once
the daemon is up) with a symbolic link to carol's control socket (carol's key is ``g0-u<uid>-p25``:
guessable even where ``<state_dir>/mps`` cannot be listed) and ends. Her epilog must stop her own daemon
by the pid recorded at its start and leave carol's alone: carol's daemon process lives on and answers
her job's client, alice's daemon and server are gone, and no node is drained. Before the fix the epilog
quit carol's daemon through the link and left alice's running.

Its own compose project (small-lab with the node hooks, as tests/cluster/test_node_runtime.py).
Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_mps_control_link.py
"""

from __future__ import annotations

import json
import os

import pytest

from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.test_node_runtime import (
    STATE,
    env_of,
    finished,
    hooks_policy,
    journals,
    mps_daemons,
    node_shell,
    running,
    submit,
    wait_clean,
)

PROJECT = os.environ.get("GPUSHARE_MPS_CONTROL_LINK_PROJECT", "gpsh21mpslink")
NODE = "lab-mps01"
GO = f"/shared/control-link-go-{os.getpid()}"

# carol: holds until the test says go, then asks her daemon for its servers (fails the job if it cannot)
VICTIM = f"""set -e
echo "PIPE=$CUDA_MPS_PIPE_DIRECTORY"
for i in $(seq 480); do [ -e {GO} ] && break; sleep 0.5; done
echo "SERVERS=$(echo get_server_list | nvidia-cuda-mps-control | tr '\\n' ' ')"
"""

# alice: her own daemon's pid (from the fake's state file in her pipe dir), whether she can list the keys, then
# the link in place of her control socket; the job ends at once
ATTACKER = f"""echo "PIPE=$CUDA_MPS_PIPE_DIRECTORY"
echo "OWN_DAEMON=$(sed -n 's/.*"pid": \\([0-9]*\\).*/\\1/p' "$CUDA_MPS_PIPE_DIRECTORY/.fake-state.json")"
echo "LISTED=$(ls {STATE}/mps 2>/dev/null | tr '\\n' ' ')"
victim={STATE}/mps/g0-u$(id -u carol)-p25/pipe
rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" && ln -s "$victim/control" "$CUDA_MPS_PIPE_DIRECTORY/control" && echo LINKED=1
ls -l "$CUDA_MPS_PIPE_DIRECTORY/"
"""


@pytest.fixture(scope="module")
def lab():
    yield from own_cluster(
        "mpscontrollink",
        PROJECT,
        lambda work: hooks_policy(work / "small-lab-hooks.yaml"),
        "GPUSHARE_MPS_CONTROL_LINK_KEEP",
    )


def daemon_of(c: TestCluster, pipe: str) -> int:
    """The control daemon's pid, from the fake's state file in the pipe dir (read as root)."""
    return json.loads(node_shell(c, NODE, f"cat {pipe}/.fake-state.json").stdout)["pid"]


def alive(c: TestCluster, pid: int) -> bool:
    state = node_shell(c, NODE, f"cat /proc/{pid}/stat 2>/dev/null || true").stdout
    return bool(state) and state.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def drained(c: TestCluster) -> dict[str, list[str]]:
    return {n: s["flags"] for n, s in c.node_states().items() if any(f.startswith("DRAIN") for f in s["flags"])}


def test_attackers_epilog_stops_its_own_daemon_and_not_the_victims(lab):
    c = lab
    uid = node_shell(c, NODE, "id -u carol").stdout.strip()
    pipe = f"{STATE}/mps/g0-u{uid}-p25/pipe"
    victim = submit(c, VICTIM, user="carol", account="biology", gres="mps:25")
    try:
        wait_for("carol's MPS job to run", lambda: running(c, victim), 120)
        wait_for("carol's daemon", lambda: len(mps_daemons(c)) == 1, 30)
        victim_daemon = daemon_of(c, pipe)
        _rec, out = finished(c, submit(c, ATTACKER, user="alice", account="physics", gres="mps:25"))
        told = env_of(out)
        assert told.get("LINKED") == "1", f"the attack was not played: {out}"
        wait_for("alice's epilog (her journal gone)", lambda: len(journals(c, NODE)) == 1, 60)
        assert alive(c, victim_daemon), f"carol's daemon {victim_daemon} was stopped by alice's epilog: {out}"
        attacker_daemon = int(told["OWN_DAEMON"])
        assert not alive(c, attacker_daemon), f"alice's daemon {attacker_daemon} outlived her epilog"
        assert len(mps_daemons(c)) == 1, mps_daemons(c)
        assert drained(c) == {}
        print(
            f"\nalice listed under {STATE}/mps: {told.get('LISTED') or '(nothing: not listable)'}; "
            f"carol's daemon {victim_daemon} alive, alice's {attacker_daemon} gone"
        )
        c.exec("slurmctld", ["touch", GO])
        _rec, out = finished(c, victim)
        assert env_of(out)["SERVERS"].split(), f"carol's daemon did not answer her job: {out}"
    finally:
        c.exec("slurmctld", ["rm", "-f", GO], check=False)
    wait_clean(c, NODE)
    assert mps_daemons(c) == [] and drained(c) == {}
