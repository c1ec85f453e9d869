"""A policy change re-rendered into the running cluster is picked up, and no node is left drained.

On the shared cluster, in any order: the test puts the bundled policy back and waits until the cluster is as
before (four shards registered, every node idle, none drained) whether it passed or failed.
"""

from __future__ import annotations

import time

from slurm_gpushare.policy import load_bytes


def _wait_shards(cluster, want: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    state = {}
    while time.monotonic() < deadline:
        state = cluster.node_states().get("lab-shard01", {})
        if f"shard:l40s:{want}" in state.get("gres", "") and state.get("base") == "IDLE" and not state.get("flags"):
            return state
        time.sleep(2)
    raise AssertionError(f"lab-shard01 did not register shard:{want}: {state}")


def test_replicas_change_is_picked_up(cluster):
    original = cluster.policy.read_bytes()
    changed = load_bytes(original.replace(b"replicas: 4", b"replicas: 2"), "small-lab-2.yaml")
    assert changed.group("lab-shard").gpus[0].replicas == 2
    try:
        cluster.reconfigure(changed)
        _wait_shards(cluster, 2)
        cluster.wait_idle(timeout=120)  # no node drained
        jobs = [
            cluster.sbatch("sleep 1\n", user="carol", account="biology", gres="shard:1", output="/dev/null")
            for _ in range(2)
        ]
        assert all(cluster.wait(j)["State"] == "COMPLETED" for j in jobs)
    finally:
        # the shared cluster as the other modules expect it, also after a failure above
        cluster.reconfigure(cluster.site)
        _wait_shards(cluster, 4)
        cluster.wait_idle(timeout=120)
