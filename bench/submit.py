"""Time the generated job_submit.lua per call under lupa, on Lua 5.1 and 5.4.

    python bench/submit.py [--calls 20000] [--policy etc/small-lab.yaml]
    python bench/submit.py --cluster     # sbatch throughput with vs without the plugin (not yet)

slurmctld calls slurm_job_submit under its locks for every submission, so its
cost is on the controller's critical path. Each call is timed from Python
(perf_counter_ns around one Lua call with a prepared job_desc table); the
baseline, measured the same way in the same run, is an empty Lua function
with the same arguments, so the ratio and the difference say what gpushare's
rules add on top of the Python-to-Lua crossing. Figures only, no assertions.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render.jobsubmit import job_submit_lua  # noqa: E402

VERSIONS = ("lua51", "lua54")
FAKE_SLURM = """
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_INVALID_GRES = 2072,
  log_user = function(fmt, ...) end, log_info = function(fmt, ...) end, log_error = function(fmt, ...) end }
function gpushare_empty(job_desc, part_list, uid) return 0 end
"""
JOBS = {
    "gpu request": {"tres_per_node": "gres/gpu:l40s:1", "partition": "batch"},
    "gpu alias (rewrite)": {"tres_per_node": "gres/gpu:small:1"},
    "rejected (2 shards)": {"tres_per_node": "gres/shard:2"},
    "no gpu": {"partition": "batch"},
}


def time_calls(lua, fn, job: dict, calls: int) -> list[int]:
    """ns per call; job_desc tables are built before timing, one per call (the script may change them)."""
    descs = [lua.table_from(job) for _ in range(calls)]
    parts = lua.table()
    out = []
    gc.disable()
    try:
        for desc in descs:
            t0 = time.perf_counter_ns()
            fn(desc, parts, 1000)
            out.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return out


def pct(values: list[int], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] / 1000


def bench(version: str, source: str, calls: int) -> None:
    lua = importlib.import_module(f"lupa.{version}").LuaRuntime()
    lua.execute(FAKE_SLURM)
    lua.execute(source)
    g = lua.globals()
    time_calls(lua, g.slurm_job_submit, JOBS["gpu request"], min(calls, 2000))  # warm up
    base = time_calls(lua, g.gpushare_empty, JOBS["gpu request"], calls)
    b50 = statistics.median(base) / 1000
    print(f"{lua.eval('_VERSION')} ({version}), {calls} calls each, microseconds per call:")
    print(f"  {'baseline: empty Lua function':30s} p50 {b50:7.2f}  p99 {pct(base, 0.99):7.2f}")
    for name, job in JOBS.items():
        t = time_calls(lua, g.slurm_job_submit, job, calls)
        p50 = statistics.median(t) / 1000
        print(f"  {name:30s} p50 {p50:7.2f}  p99 {pct(t, 0.99):7.2f}  ({p50 / b50:5.1f}x baseline, +{p50 - b50:.2f} us)")


def cluster_throughput() -> None:
    """sbatch submissions per second with and without JobSubmitPlugins=lua on the docker test cluster."""
    raise NotImplementedError("needs the docker test cluster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--policy", type=Path, default=ROOT / "etc" / "small-lab.yaml")
    ap.add_argument("--cluster", action="store_true", help="sbatch throughput on the docker test cluster (TODO)")
    args = ap.parse_args()
    if args.cluster:
        cluster_throughput()
    source = job_submit_lua(load_file(args.policy))
    print(f"policy {args.policy.name}; job_submit.lua {len(source) / 1e3:.1f} kB")
    for version in VERSIONS:
        bench(version, source, args.calls)


if __name__ == "__main__":
    main()
