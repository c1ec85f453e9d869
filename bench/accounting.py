"""Stream 1,000,000 sacct records through parsing and GPU-equivalent aggregation; print rates and memory.

    python bench/accounting.py [--records 1000000] [--json-records 100000]

The records are generated into a temporary file in the exact parsable2
format the live query uses (and a smaller --json file). Baseline measured in
the same run: reading the same file and splitting each line at ``|`` (the
floor any parsable2 reader pays), so the ratio says what parsing times,
TRES conversion and aggregation add. Memory: peak traced Python memory of a
parse+aggregate pass (tracemalloc, a separate pass since tracing slows it),
and the process's max RSS (ru_maxrss) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_gpushare.accounting.usage import aggregate
from slurm_gpushare.examples import example
from slurm_gpushare.policy import load_file
from slurm_gpushare.slurm.sacct import parse_json, parse_parsable2

UTC = UTC
SINCE = datetime(2025, 3, 1, tzinfo=UTC).timestamp()
UNTIL = SINCE + 30 * 86400
SHAPES = [  # (partition, AllocTRES) of the small-lab policy: whole GPUs, MIG, shards, MPS, untyped, CPU only
    ("batch", "billing=1,cpu=4,gres/gpu:l40s=1,gres/gpu=1,mem=8G,node=1"),
    ("batch", "billing=2,cpu=8,gres/gpu:l40s=2,gres/gpu=2,mem=16G,node=1"),
    ("batch", "billing=1,cpu=1,gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1,mem=2G,node=1"),
    ("batch", "billing=1,cpu=1,gres/shard=2,mem=2G,node=1"),
    ("batch", "billing=1,cpu=2,gres/mps=50,mem=4G,node=1"),
    ("scavenger", "billing=1,cpu=2,gres/gpu=1,mem=4G,node=1"),
    ("batch", "billing=1,cpu=2,gres/gpu:a30=1,gres/gpu=1,mem=4G,node=1"),
    ("batch", "billing=0,cpu=4,mem=8G,node=1"),
]
USERS = [("physics", "alice"), ("physics", "bob"), ("biology", "carol"), ("biology-imaging", "dave")] + [
    (f"acct{i:02d}", f"user{i:03d}") for i in range(60)
]
STATES = ["COMPLETED"] * 8 + ["FAILED", "TIMEOUT", "CANCELLED by 1001", "OUT_OF_MEMORY"]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _jobs(n: int, seed: int = 7):
    rnd = random.Random(seed)
    for i in range(n):
        part, tres = SHAPES[rnd.randrange(len(SHAPES))]
        acct, user = USERS[rnd.randrange(len(USERS))]
        start = SINCE - 3600 + rnd.random() * (UNTIL - SINCE)
        elapsed = int(rnd.expovariate(1 / 5400)) + 1
        yield i, user, acct, part, STATES[rnd.randrange(len(STATES))], start, elapsed, tres


def write_parsable2(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i, user, acct, part, state, start, elapsed, tres in _jobs(n):
            h, rem = divmod(elapsed, 3600)
            f.write(
                f"{1000000 + i}|{user}|{acct}|{part}|{state}|{_iso(start)}|{_iso(start + elapsed)}|"
                f"{h:02d}:{rem // 60:02d}:{rem % 60:02d}|{elapsed}|{tres}|{tres}|normal\n"
            )


def write_json(path: Path, n: int) -> None:
    with open(path, "w") as f:
        f.write('{"meta": {"plugin": {"data_parser": "data_parser/v0.0.42"}}, "jobs": [')
        for k, (i, user, acct, part, state, start, elapsed, tres) in enumerate(_jobs(n)):
            alloc = [
                {"type": key.split("/")[0], "name": key.partition("/")[2], "count": int(v.rstrip("G"))}
                for key, v in (item.split("=") for item in tres.split(","))
            ]
            job = {
                "job_id": 1000000 + i,
                "user": user,
                "account": acct,
                "partition": part,
                "qos": "normal",
                "state": {"current": [state.split()[0]], "reason": "None"},
                "time": {
                    "elapsed": elapsed,
                    "start": int(start),
                    "end": int(start) + elapsed,
                    "submission": int(start),
                },
                "tres": {"allocated": alloc, "requested": alloc},
            }
            f.write(("," if k else "") + json.dumps(job))
        f.write('], "warnings": [], "errors": []}\n')


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def baseline(path: Path) -> int:
    n = 0
    with open(path) as f:
        for line in f:
            line.split("|")
            n += 1
    return n


def parse_only(path: Path) -> int:
    with open(path) as f:
        return sum(1 for _ in parse_parsable2(f, tz=UTC))


def parse_and_aggregate(site, path: Path, by: str = "account", half_life=None):
    with open(path) as f:
        return aggregate(site, parse_parsable2(f, tz=UTC), SINCE, UNTIL, by=by, half_life=half_life)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--json-records", type=int, default=100_000)
    args = ap.parse_args()
    site = load_file(example("small-lab.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        path, jpath = Path(tmp) / "sacct.txt", Path(tmp) / "sacct.json"
        gen_s, _ = timed(lambda: write_parsable2(path, args.records))
        size = os.path.getsize(path)
        base_s, n = timed(lambda: baseline(path))
        parse_s, _ = timed(lambda: parse_only(path))
        agg_s, agg = timed(lambda: parse_and_aggregate(site, path))
        kind_s, _ = timed(lambda: parse_and_aggregate(site, path, "gpu-kind", 7 * 86400))
        tracemalloc.start()
        parse_and_aggregate(site, path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        write_json(jpath, args.json_records)
        jsize = os.path.getsize(jpath)
        json_s, jn = timed(lambda: sum(1 for _ in parse_json(open(jpath, "rb"))))
    rate = n / agg_s
    print(
        f"records: {n:,} parsable2 ({size / 1e6:.0f} MB, generated in {gen_s:.1f} s), "
        f"{jn:,} JSON ({jsize / 1e6:.0f} MB)"
    )
    print(f"baseline read + split('|')      : {base_s:6.2f} s  {n / base_s:12,.0f} rec/s")
    print(
        f"parse to JobRecord              : {parse_s:6.2f} s  {n / parse_s:12,.0f} rec/s  "
        f"({parse_s / base_s:.2f}x baseline)"
    )
    print(f"parse + GPU-eq by account       : {agg_s:6.2f} s  {rate:12,.0f} rec/s  ({agg_s / base_s:.2f}x baseline)")
    print(
        f"parse + by gpu-kind, decayed    : {kind_s:6.2f} s  {n / kind_s:12,.0f} rec/s  "
        f"({kind_s / base_s:.2f}x baseline)"
    )
    print(f"parse --json (streamed)         : {json_s:6.2f} s  {jn / json_s:12,.0f} rec/s")
    print(
        f"total {agg.total.gpu_seconds / 3600:,.0f} GPU-eq h over {len(agg.groups)} accounts, "
        f"{agg.outside:,} outside the window"
    )
    print(f"peak traced memory (parse+agg)  : {peak / 2**10:6.1f} KiB")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process         : {rss:6.1f} MiB")
    ok = agg_s < 10 and kind_s < 10 and rss < 1024
    print(f"target (< 10 s, < 1 GiB for {n:,} records): {'met' if ok else 'NOT met'} on {os.cpu_count()} CPU(s)")


if __name__ == "__main__":
    main()
