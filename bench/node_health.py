"""How long one `gpushare-node-health` run takes on the fake backend (no Slurm: a canned squeue/scontrol).

Prints the in-process run time (p50, max over --runs) per small-lab node, and the cost of a fresh
interpreter importing what the run imports (the console script's start-up). The cluster test
tests/cluster/test_node_health.py prints the same run timed inside the node containers.

    .venv/bin/python bench/node_health.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpushare.proc import Result
from tests.unit.hooks_support import HookNode


def canned(node: str):
    def runner(argv, **_kw):
        if argv[:2] == ["squeue", "-w"]:
            return Result(tuple(argv), 0, "", "")
        if argv[:3] == ["scontrol", "show", "node"]:
            return Result(tuple(argv), 0, json.dumps({"nodes": [{"name": node, "state": ["IDLE"], "reason": ""}]}), "")
        raise AssertionError(f"bench: unexpected command {argv}")

    return runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    from slurm_gpushare.hooks import health

    for name in ("lab-excl01", "lab-shard01", "lab-mig01", "lab-mps01"):
        with tempfile.TemporaryDirectory() as tmp:
            node = HookNode(Path(tmp), name)
            env = {"SLURMD_NODENAME": name, "GPUSHARE_NODE_CONFIG": str(node.config)}
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                health.health(env, runner=canned(name), mps=node.mps, is_device=lambda p: True, out=lambda line: None)
                times.append(time.perf_counter() - start)
            print(
                f"{name}: one run p50 {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
                f"({args.runs} runs, spec cache warm after the first)"
            )
    code = (
        "import slurm_gpushare.hooks.health, slurm_gpushare.node.health, slurm_gpushare.node.mig, "
        "slurm_gpushare.node.reconcile, slurm_gpushare.gpu, slurm_gpushare.slurm.cli_backend"
    )
    starts = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        starts.append(time.perf_counter() - start)
    print(f"fresh interpreter + the run's imports: p50 {statistics.median(starts) * 1000:.0f} ms (5 starts)")


if __name__ == "__main__":
    main()
