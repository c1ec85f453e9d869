"""Time one `plan_live` decision on a large made-up cluster; print the figures.

    python bench/live_plan.py [--nodes 50] [--gpus 8] [--pending 2000] [--history 0] [--repeat 3]

Every node has GPUS A100-40GB laid out 7x1g.5gb, every slice busy with a 1g job ending within 50 minutes;
PENDING 3g.20gb jobs and 20 lower-priority 1g.5gb jobs wait. Prints the best of REPEAT wall-clock times of
``plan_live`` (the layout catalogue is enumerated once, before timing) and what it decided. HISTORY: that
many 1g.5gb jobs ended on the nodes (round robin) within live.history_window, as ``Snapshot.history``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpushare.live.plan import plan_live
from slurm_gpushare.live.view import ClusterView, NodeView, PendingJob, RecentJob, RunningJob
from slurm_gpushare.policy import build_site

T1, T3 = "gpu:a100_40g_1g.5gb", "gpu:a100_40g_3g.20gb"
NOW = 1_800_000_000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pending", type=int, default=2000)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    site = build_site(
        {
            "version": 1,
            "cluster": {"name": "b", "slurm_version": "24.11", "controller": "ctl"},
            "node_groups": [
                {
                    "name": "mig",
                    "nodes": f"m[001-{a.nodes:03d}]",
                    "gpu": {"model": "A100-SXM4-40GB", "count": a.gpus},
                    "cpus": 64,
                    "memory_mb": 512000,
                    "sharing": [
                        {"gpus": f"0-{a.gpus - 1}" if a.gpus > 1 else 0, "mode": "mig", "layout": "all-1g.5gb"}
                    ],
                }
            ],
            "tiers": [{"name": "batch", "node_groups": ["mig"], "default": True}],
            "live": {"enabled": True, "max_draining": 3},
        },
        "bench",
    )
    names = [f"m{i:03d}" for i in range(1, a.nodes + 1)]
    slices = 7 * a.gpus
    nodes = {n: NodeView(n, ("ALLOCATED",), "", {T1: slices}) for n in names}
    running = tuple(
        RunningJob(10_000 + k, names[k % a.nodes], {T1: 1}, NOW + 60 * (k % 50)) for k in range(slices * a.nodes)
    )
    pending = tuple(PendingJob(100 + i, T3, 1, 1500.0, 10, "Resources", "batch") for i in range(a.pending))
    pending += tuple(PendingJob(1_000_000 + i, T1, 1, 1500.0, 1, "Priority", "batch") for i in range(20))
    history = tuple(
        RecentJob(str(2_000_000 + i), names[i % a.nodes], {T1: 1}, NOW - 7200, NOW - 3600) for i in range(a.history)
    )
    snap = ClusterView(NOW, pending, running, nodes, {}, frozenset(), history)
    plan_live(site, ClusterView(NOW, (), (), {}, {}, frozenset()))  # warm: nothing to plan
    best = float("inf")
    for _ in range(a.repeat):
        t = time.perf_counter()
        plan = plan_live(site, snap)
        best = min(best, time.perf_counter() - t)
    print(
        f"plan_live: {a.nodes} nodes x {a.gpus} A100-40GB (7x1g.5gb, all busy), {len(running)} running, "
        f"{len(pending)} pending, {len(history)} in the history: best of {a.repeat}: {best:.3f} s; "
        f"{len(plan.proposals)} proposals, "
        f"{len(plan.held)} held"
    )
    for p in plan.proposals:
        print(f"  {p.line}")
    for h in plan.held[:2] if not plan.proposals else ():
        print(f"  {h.line}")


if __name__ == "__main__":
    main()
