"""Validate and render a generated 10,000-node policy; print times and peak memory.

    python bench/render.py [--nodes 10000] [--group-size 50]

Baseline measured in the same run: yaml.safe_load of the same text with
libyaml (the floor any loader pays), so the ratios say what validation and
rendering add on top.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpushare.policy import load_bytes
from slurm_gpushare.render import render_all

SHAPES = [
    (
        "H100-SXM5-80GB",
        8,
        [
            {"gpus": "0-3", "mode": "exclusive"},
            {"gpus": "4-5", "mode": "mig", "layout": ["3g.40gb", "3g.40gb"]},
            {"gpus": 6, "mode": "shard", "replicas": 4},
        ],
    ),
    ("A100-SXM4-80GB", 8, [{"gpus": "0-7", "mode": "mig", "layout": "all-balanced"}]),
    ("L40S", 4, [{"gpus": "0-3", "mode": "mps", "units": 100}]),
    ("H200-141GB", 8, [{"gpus": "0-7", "mode": "exclusive"}]),
    ("A30-24GB", 4, [{"gpus": "0-3", "mode": "mig", "layout": "all-1g.6gb"}]),
]


def generate(nodes: int, group_size: int) -> bytes:
    groups = []
    for i in range(0, nodes, group_size):
        model, count, sharing = SHAPES[(i // group_size) % len(SHAPES)]
        n = min(group_size, nodes - i)
        groups.append(
            {
                "name": f"g{i // group_size:04d}",
                "nodes": f"n[{i:05d}-{i + n - 1:05d}]",
                "gpu": {"model": model, "count": count},
                "cpus": 64,
                "memory_mb": 512000,
                "sharing": sharing,
            }
        )
    by_shape: dict[int, list[str]] = {}
    for j, g in enumerate(groups):
        by_shape.setdefault(j % len(SHAPES), []).append(g["name"])
    tiers = [
        {"name": f"t{k}", "node_groups": names, "priority": 10 + k, "preempt_mode": "requeue"}
        for k, names in sorted(by_shape.items())
    ]
    tiers[0]["default"] = True
    tenants = [{"name": f"acct{k:03d}", "shares": k + 1, "users": [f"u{k:03d}a", f"u{k:03d}b"]} for k in range(200)]
    policy = {
        "version": 1,
        "cluster": {"name": "big", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": groups,
        "tenants": tenants,
        "tiers": tiers,
    }
    return yaml.safe_dump(policy, sort_keys=False).encode()


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--group-size", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    data = generate(args.nodes, args.group_size)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    parse_s, _ = timed(lambda: yaml.load(data, Loader=loader), args.repeat)
    validate_s, site = timed(lambda: load_bytes(data, "generated.yaml"), args.repeat)
    render_s, files = timed(lambda: render_all(site), args.repeat)
    tracemalloc.start()
    render_all(load_bytes(data, "generated.yaml"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    nodes = sum(len(g.nodes) for g in site.groups)
    gpus = sum(len(g.nodes) * len(g.gpus) for g in site.groups)
    size = sum(len(t) for t in files.values())
    print(
        f"policy: {nodes} nodes, {gpus} GPUs, {len(site.groups)} node groups, {len(site.tiers)} tiers, "
        f"{len(data) / 1e6:.2f} MB YAML"
    )
    print(f"baseline yaml.safe_load : {parse_s * 1000:8.1f} ms")
    print(f"validate (load+rules)   : {validate_s * 1000:8.1f} ms  ({validate_s / parse_s:.2f}x baseline)")
    print(
        f"render (4 files)        : {render_s * 1000:8.1f} ms  ({render_s / parse_s:.2f}x baseline), "
        f"{size / 1e3:.0f} kB output"
    )
    print(f"peak traced memory      : {peak / 2**20:8.1f} MiB (validate + render)")
    print(f"max RSS of this process : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:8.1f} MiB")


if __name__ == "__main__":
    main()
