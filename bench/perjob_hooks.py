"""Per-job MIG hook latency: the prolog and epilog of slice and whole-GPU jobs on the fake NVML, at zero latency
and at the latencies NVIDIA's driver code notes, one by one and several on one GPU at once.

    nice -n 19 python bench/perjob_hooks.py [--runs 3] [--slow-runs 2] [--burst 7]

The test node is bench/node_hooks.py's (the hook scripts ``gpushare node install`` writes, one fresh process
per hook, the environment slurmd gives it), on the perjob-lab test policy's node lab-perjob01 (2 x
A100-SXM4-40GB per-job MIG, profiles 1g.5gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb). A slice job carries
``SLURM_JOB_EXTRA=gpushare-mig=<profile>``; a whole-GPU job carries none and gets the GPU's full instance.

Latencies (FakeNvml.set_latency; the calling hook sleeps them): ``fakenvml.DRA_OBSERVED_LATENCIES`` (author
comments in NVIDIA's k8s-dra-driver-gpu, not benchmarks: a device handle by UUID ~10 s uncached, walking the
MIG devices ~10 s spread over a 7-slice GPU's indexes, a GI destroy ~1 s) and, where no public figure exists
(creating a GI or CI, destroying a CI), 1 s each: the order of the GI destroy, a judgement. Zero latency, in
the same run, is the baseline.

- single: per profile (1g.5gb slice, 7g.40gb slice) and for a whole GPU, ``--runs`` jobs one after another
  (``--slow-runs`` at the latencies), each a prolog then an epilog on GPU 0: wall time per hook;
- burst: ``--burst`` 1g.5gb prologs started together on GPU 0 (they queue on the GPU's lock), then their
  epilogs together: each hook's wall time from the common start; the last one is the wait a job sees when
  a GPU's slots fill at once.

Figures: wall ms per hook (median and max), the ratio latency / zero, and the longest prolog against the
PrologEpilogTimeout that ``gpushare render`` sets for per-job nodes (policy.share.PER_JOB_PROLOG_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.node_hooks import build_node, hook_env, load, timed, write_scripts  # noqa: E402
from slurm_gpushare.gpu import open_backend  # noqa: E402
from slurm_gpushare.gpu.fakenvml import DRA_OBSERVED_LATENCIES, FakeNvml  # noqa: E402
from slurm_gpushare.node import install  # noqa: E402
from slurm_gpushare.policy.share import PER_JOB_PROLOG_TIMEOUT_S  # noqa: E402

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
NODE = "lab-perjob01"
JUDGED = {  # no public figure: the GI destroy's order
    "nvmlDeviceCreateGpuInstanceWithPlacement": 1.0,
    "nvmlGpuInstanceCreateComputeInstance": 1.0,
    "nvmlComputeInstanceDestroy": 1.0,
}
LATENCIES = DRA_OBSERVED_LATENCIES | JUDGED
JOBS = (("1g.5gb slice", "1g.5gb"), ("7g.40gb slice", "7g.40gb"), ("whole GPU", None))


class Node:
    """A per-job test node in a temporary directory, its hook scripts and its fake NVML."""

    def __init__(self, tmp: Path):
        self.config = build_node(tmp, NODE, policy_file=POLICY)
        self.hooks = write_scripts(tmp / "bin", install.probe_import_dirs(sys.executable))
        self.fake = FakeNvml(tmp / "nvml.json")
        self.job = 0

    def latencies(self, on: bool) -> None:
        for call, seconds in LATENCIES.items():
            self.fake.set_latency(call, seconds if on else 0)

    def env(self, job: int, profile: str | None) -> dict[str, str]:
        env = hook_env(self.config, NODE, job, "0", None, False)
        if profile is not None:
            env["SLURM_JOB_EXTRA"] = f"gpushare-mig={profile}"
        return env

    def hook(self, name: str, job: int, profile: str | None) -> float:
        """One hook's wall ms; a hook that fails (or a prolog that refused the job) stops the benchmark."""
        ms = timed(self.hooks[name], self.env(job, profile))
        self.check(name, 1)
        return ms

    def check(self, name: str, count: int) -> None:
        """After prologs GPU 0 holds ``count`` instances, after epilogs none (a refused job exits 0 too)."""
        with open_backend(self.fake.state_path) as backend:
            held = len(backend.gpu_instances(0))
        if held != (count if name == "prolog" else 0):
            raise SystemExit(f"GPU 0 holds {held} instances after the {name}: a job was refused or left one")

    def single(self, profile: str | None, runs: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"prolog": [], "epilog": []}
        for _ in range(runs):
            self.job += 1
            out["prolog"].append(self.hook("prolog", self.job, profile))
            out["epilog"].append(self.hook("epilog", self.job, profile))
        return out

    def burst(self, count: int) -> dict[str, list[float]]:
        """``count`` 1g.5gb prologs at once on GPU 0, then their epilogs at once: each one's wall ms."""
        jobs = list(range(self.job + 1, self.job + count + 1))
        self.job += count
        return {name: self._together(name, jobs) for name in ("prolog", "epilog")}

    def _together(self, name: str, jobs: list[int]) -> list[float]:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(self.hooks[name], env=self.env(j, "1g.5gb"), stdout=subprocess.DEVNULL) for j in jobs]
        done: list[float] = []
        while procs:  # each one's end as it comes (polled every 20 ms), not in the order they started
            for proc in [p for p in procs if p.poll() is not None]:
                if proc.returncode != 0:
                    raise SystemExit(f"a {name} exited {proc.returncode}")
                done.append((time.perf_counter() - t0) * 1000)
                procs.remove(proc)
            time.sleep(0.02)
        self.check(name, len(jobs))
        return sorted(done)


def row(label: str, zero: list[float], slow: list[float]) -> None:
    z, s = statistics.median(zero), statistics.median(slow)
    share = 100 * max(slow) / 1000 / PER_JOB_PROLOG_TIMEOUT_S
    print(
        f"  {label:28s} zero {z:8.0f} ms (max {max(zero):8.0f}) | latencies {s:8.0f} ms (max {max(slow):8.0f})"
        f" | x {s / z:6.1f} | max {share:5.1f} % of {PER_JOB_PROLOG_TIMEOUT_S} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="jobs per kind at zero latency (0: the burst alone)")
    ap.add_argument("--slow-runs", type=int, default=2, help="jobs per kind at NVIDIA's latencies")
    ap.add_argument("--burst", type=int, default=7, help="1g.5gb jobs started together on one GPU")
    args = ap.parse_args()
    began = time.perf_counter()
    print(f"per-job hooks on {NODE} (perjob-lab), load {load()}; latencies (s): {LATENCIES}")
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-perjob-") as tmp:
        node = Node(Path(tmp))
        node.hook("prolog", 999, "1g.5gb")  # the cold start (spec cache), not counted
        node.hook("epilog", 999, "1g.5gb")
        got: dict[bool, dict] = {}
        for slow in (False, True):
            node.latencies(slow)
            runs = args.slow_runs if slow else args.runs
            got[slow] = {label: node.single(profile, runs) for label, profile in JOBS} if args.runs else {}
            got[slow]["burst"] = node.burst(args.burst)
        node.latencies(False)
    print("wall per hook, one job at a time (median of the runs):")
    for label, _ in JOBS if args.runs else ():
        for hook in ("prolog", "epilog"):
            row(f"{label} {hook}", got[False][label][hook], got[True][label][hook])
    print(f"{args.burst} x 1g.5gb started together on GPU 0 (wall from the common start; max = the last):")
    for hook in ("prolog", "epilog"):
        row(f"burst {hook}", got[False]["burst"][hook], got[True]["burst"][hook])
    print(f"load {load()}; wall {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
