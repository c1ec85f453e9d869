"""Time the node hooks as Slurm runs them: one process per call, on the fake NVML.

    python bench/node_hooks.py [--runs 30] [--modes mig,mps,exclusive] [--metrics] [--against TREE]

The prolog, task prolog and epilog are on every job's start and end. Each is
started as Slurm starts it (the installed console script, a fresh process,
the environment slurmd gives it) on a test node built in a temporary
directory: the small-lab policy, a fake NVML with the node's layout, the
rendered gres.conf and MIG include, a node config naming them, and for MPS
the test-only nvidia-cuda-mps-control (docker/fakes; a real daemon process).
One run per job: prolog, task prolog (twice: the pip console script, and the
lean script the test image installs, which skips the wrapper's ``import re``), epilog. The baseline, measured in the
same run the same way, is a bare `python -c pass` of the same interpreter,
so the ratio says what the hook adds to interpreter start-up; it is also
measured once per job beside that job's hooks, and each mode's ratios are to
that (on a shared machine the load changes within a run). Prolog+epilog is
the p50 over jobs of the two hooks' sum, against the issue's target of at
most 150 ms per mode. The first
prolog (which builds the node spec cache from the policy) is reported
separately as the cold start. ``--metrics`` turns the policy's
cluster.metrics on (textfile collector file and dcgm-exporter job mapping in
the temporary directory), to see what writing them adds. ``--against TREE``
compares with another checkout (e.g. ``git archive COMMIT | tar -x -C TREE``):
per mode, a test node for each tree, job by job in turn (the order alternating),
TREE's package on PYTHONPATH (the lean task prolog, run with -I, is this tree's)
and its fake control client; prints both trees' prolog+epilog p50, so that a
before/after shares the machine's load. Figures only, no assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from slurm_gpushare.gpu import open_backend, read_mig_minors  # noqa: E402
from slurm_gpushare.gpu.fakenvml import FakeNvml  # noqa: E402
from slurm_gpushare.node.gresconf import node_gres_conf  # noqa: E402
from slurm_gpushare.node.mig import apply_actions, observe, plan_mig  # noqa: E402
from slurm_gpushare.policy import load_file  # noqa: E402
from slurm_gpushare.render import render_all  # noqa: E402

BIN = Path(sys.executable).parent
LEAN_TASK = "from slurm_gpushare.node.taskprolog import main; raise SystemExit(main())"
HOOKS = {  # name -> argv; "lean" is the script docker/Dockerfile installs as TaskProlog (no pip wrapper)
    "prolog": [str(BIN / "gpushare-prolog")],
    "task prolog (console script)": [str(BIN / "gpushare-task-prolog")],
    "task prolog (lean script)": [sys.executable, "-I", "-c", LEAN_TASK],
    "epilog": [str(BIN / "gpushare-epilog")],
}
BASELINE = "baseline: python -c pass"
TARGET_MS = 150.0  # issue 14: prolog+epilog p50 per mode on the fake backend
MODES = {"mig": ("lab-mig01", "0", None), "mps": ("lab-mps01", "0", 25), "exclusive": ("lab-excl01", "1", None)}


def build_node(tmp: Path, node: str, metrics: bool = False) -> Path:
    """The test node's files; returns its node config."""
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["cluster"]["paths"] = {"slurm_conf_dir": str(tmp / "etc"), "gres_include": str(tmp / "etc" / "gres.d" / "mig.conf"),
                               "state_dir": str(tmp / "state"), "log_dir": str(tmp / "log")}
    if metrics:
        raw["cluster"]["metrics"] = {"textfile_dir": str(tmp / "prom"), "dcgm_job_mapping_dir": str(tmp / "dcgm")}
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    site = load_file(policy)
    group = site.group_for_node(node)
    fake = FakeNvml.build(tmp / "nvml.json", model=group.model.name, count=len(group.gpus),
                          mig_enabled=[s.index for s in group.gpus if s.mode == "mig"], seed=node)
    with open_backend(fake.state_path) as backend:
        apply_actions(backend, plan_mig(group.gpus, observe(backend)))
        include = node_gres_conf(node, group.gpus, backend, read_mig_minors(backend.mig_minors_path))
    (tmp / "etc" / "gres.d").mkdir(parents=True)
    (tmp / "etc" / "gres.conf").write_text(render_all(site)["gres.conf"])
    (tmp / "etc" / "gres.d" / "mig.conf").write_text(include)
    config = tmp / "etc" / "node.yaml"
    config.write_text(f"policy: {policy}\nfake_nvml: {fake.state_path}\nstate_dir: {tmp / 'state'}\n"
                      f"mps_control: {ROOT / 'docker' / 'fakes' / 'nvidia-cuda-mps-control'}\n")
    return config


def against_node(tmp: Path, node: str, tree: Path) -> Path:
    """A test node whose node config names ``tree``'s fake control client."""
    config = build_node(tmp, node)
    config.write_text(config.read_text().replace(str(ROOT / "docker" / "fakes"), str(tree / "docker" / "fakes")))
    return config


def compare(mode: str, runs: int, tree: Path) -> tuple[list[float], list[float]]:
    """prolog+epilog per job on this tree and on ``tree`` (interleaved job by job)."""
    node, gpus, mps_pct = MODES[mode]
    sums: dict[str, list[float]] = {"this": [], "other": []}
    with tempfile.TemporaryDirectory(prefix=f"gpushare-bench-{mode}-") as tmp:
        (Path(tmp) / "this").mkdir()
        (Path(tmp) / "other").mkdir()
        configs = {"this": build_node(Path(tmp) / "this", node), "other": against_node(Path(tmp) / "other", node, tree)}
        for job in range(1, runs + 2):
            for which in ("this", "other") if job % 2 else ("other", "this"):
                took = {}
                for name, argv in HOOKS.items():
                    env = hook_env(configs[which], node, job, gpus, mps_pct, name.startswith("task prolog"))
                    if which == "other":
                        env["PYTHONPATH"] = str(tree)
                    took[name] = timed(argv, env)
                if job > 1:
                    sums[which].append(took["prolog"] + took["epilog"])
    return sums["this"], sums["other"]


def hook_env(config: Path, node: str, job: int, gpus: str, pct: int | None, task: bool) -> dict[str, str]:
    """What slurmd gives the hook (no PATH for root hooks), plus the config override."""
    env = {"SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid()),
           "SLURMD_NODENAME": node, "GPUSHARE_NODE_CONFIG": str(config)}
    if pct is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    if not task or pct is None:  # mps tasks get no CUDA_VISIBLE_DEVICES from Slurm
        env["SLURM_JOB_GPUS"] = gpus
        env["CUDA_VISIBLE_DEVICES"] = "0" if task else gpus
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{argv[0]} failed ({res.returncode}): {res.stderr.strip()}")
    return elapsed * 1000


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def bench_mode(mode: str, runs: int, metrics: bool = False) -> tuple[dict[str, list[float]], float]:
    node, gpus, mps_pct = MODES[mode]
    with tempfile.TemporaryDirectory(prefix=f"gpushare-bench-{mode}-") as tmp:
        config = build_node(Path(tmp), node, metrics)
        times: dict[str, list[float]] = {name: [] for name in (BASELINE, *HOOKS)}
        cold = 0.0
        for job in range(1, runs + 2):
            if job > 1:
                times[BASELINE].append(timed([sys.executable, "-c", "pass"], {}))
            for name, argv in HOOKS.items():
                ms = timed(argv, hook_env(config, node, job, gpus, mps_pct, name.startswith("task prolog")))
                if job == 1 and name == "prolog":
                    cold = ms
                elif job > 1:
                    times[name].append(ms)
    return times, cold


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="jobs per mode (prolog, task prolog, epilog each)")
    ap.add_argument("--modes", default="mig,mps,exclusive")
    ap.add_argument("--metrics", action="store_true", help="policy with cluster.metrics on (textfile + dcgm mapping)")
    ap.add_argument("--against", type=Path, default=None, metavar="TREE",
                    help="another checkout: its prolog+epilog beside this tree's, job by job")
    args = ap.parse_args(argv)
    missing = [argv[0] for argv in HOOKS.values() if not Path(argv[0]).exists()]
    if missing:
        raise SystemExit(f"console scripts missing: {', '.join(missing)} (pip install -e .)")
    base = [timed([sys.executable, "-c", "pass"], {}) for _ in range(args.runs)]
    b50 = statistics.median(base)
    print(f"node hooks, {args.runs} jobs per mode, wall ms per process (python {sys.version.split()[0]}, {os.cpu_count()} CPUs), "
          f"node metrics {'on' if args.metrics else 'off'}:")
    print(f"  {'baseline: python -c pass':32s} p50 {b50:7.1f}  p95 {pct(base, 0.95):7.1f}")
    for mode in args.modes.split(",") if args.against else ():
        this, other = compare(mode, args.runs, args.against.resolve())
        a, b = statistics.median(this), statistics.median(other)
        print(f"  {mode:10s} prolog+epilog p50 per job: {args.against} {b:6.1f}, this tree {a:6.1f} ({(a - b) / b * 100:+.0f} %)")
    for mode in args.modes.split(",") if not args.against else ():
        times, cold = bench_mode(mode, args.runs, args.metrics)
        m50 = statistics.median(times[BASELINE])  # this mode's own baseline, measured beside its hooks
        print(f"  {mode}: first prolog (builds the spec cache from the policy) {cold:.0f} ms")
        times["prolog+epilog (per job)"] = [p + e for p, e in zip(times["prolog"], times["epilog"])]
        for name, values in times.items():
            p50 = statistics.median(values)
            ratio = "" if name == BASELINE else f"  ({p50 / m50:4.1f}x baseline, +{p50 - m50:.0f} ms)"
            print(f"    {name:30s} p50 {p50:7.1f}  p95 {pct(values, 0.95):7.1f}{ratio}")
        both = statistics.median(times["prolog+epilog (per job)"])
        print(f"    target prolog+epilog p50 <= {TARGET_MS:g} ms: {'met' if both <= TARGET_MS else 'not met'} ({both:.1f} ms)")


if __name__ == "__main__":
    main()
