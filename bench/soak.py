"""The 1,000-job soak on the test cluster: throughput and recovery under faults, as a benchmark.

CI runs tests/cluster/test_soak.py with 120 plain jobs (its default). This runs the same test, with
the same faults (an MPS daemon, slurmd, a prolog and an epilog SIGKILLed, slurmctld SIGKILLed with
jobs queued), at the size the figures in bench/RESULTS.md are quoted for, and prints the soak's own
lines (jobs submitted, drain time, jobs/s, final states by kind, requeues) and the wall time.

    .venv/bin/python bench/soak.py [--jobs 1000] [--project gpsoak-bench]

Needs docker and the test images (docker/bootstrap.sh). Exit status: the test's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="plain jobs (the soak adds 26 scavenger/cancel jobs)")
    ap.add_argument("--project", default="gpsoak-bench", help="compose project name of the soak's cluster")
    args = ap.parse_args()
    env = dict(
        os.environ, GPUSHARE_SOAK_JOBS=str(args.jobs), GPUSHARE_SOAK_PROJECT=args.project, GPUSHARE_REQUIRE_CLUSTER="1"
    )
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "tests/cluster/test_soak.py", "-q", "-s", "-p", "no:cacheprovider"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
    for line in out.stdout.splitlines():
        if line.startswith("soak:") or " passed" in line or " failed" in line:
            print(line)
    if out.returncode:
        print(out.stdout[-4000:], out.stderr[-2000:], sep="\n", file=sys.stderr)
    print(f"bench soak: {args.jobs} plain jobs, wall {time.monotonic() - start:.0f} s, exit {out.returncode}")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
