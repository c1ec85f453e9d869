"""The live MIG planner's loop in the simulator: a static layout against `plan_live`, same arrivals, one run.

    nice -n 19 python bench/live_loop.py [--seeds 1,2,3] [--nodes 16] [--gpus 8] [--hours 6] [--load 0.8]
                                         [--interval 300] [--min-dwell 3600] [--max-draining 1] [--max-wait 3600]
                                         [--change-cost 120] [--variant max_wait=14400,max_draining=2 ...]
                                         [--json out.json]

Cluster: ``--nodes`` nodes of ``--gpus`` A100-SXM4-40GB GPUs in MIG mode, 256 CPUs and 2,000,000 MB each,
one tier (live/sim.py). Arrivals (livesim.trace_jobs, seeded): three phases of ``--hours`` each,
A (40 % 1g.5gb, 40 % 1g.10gb, 20 % 3g.20gb), B (10 %, 10 %, 80 %), A again; Poisson arrivals whose rate
offers ``--load`` x the cluster's compute slices; each arrival is one of the trace's one-GPU fractional pods
whose share rounds up (S2's rule) to the drawn profile, with its CPUs, memory and runtime (deletion_time -
scheduled_time, capped at the tier's 1 day; a pod the trace never scheduled gets a runtime drawn from its
profile's known runtimes).

Both runs start from the static planner's layout for phase A (livesim.static_layouts: hardware.packing.pack of
phase A's running instances by Little's law, every node alike). "static" never changes it; "live" runs the
product's planner (live/plan.py plan_live, the policy's live: limits given here) every ``--interval`` s and
carries its proposals out as `gpushare live apply` does (lock, wait for the node's GPU jobs, change_cost of drain,
every GPU of the proposal in that one drain: with_layouts). Each ``--variant`` adds a live run whose limits differ
from the others' by the keys given. Figures per seed and their mean: pending time (mean, p95; a job still pending at
the end counts
until the end), GPU allocation (occupied MIG compute slices / 7 x GPUs, time-averaged over the run), jobs
finished, jobs not started, relayouts (node changes) and GPU layout changes; the ratio live / static; wall time
and max RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.live import sim as livesim  # noqa: E402 - after the checkout is put on sys.path
from slurm_gpushare.sim.trace import load_pod_times, load_pods  # noqa: E402

TRACE = Path("/work/shared/data/gpu-trace/openb_pod_list_default.csv")
if not TRACE.exists():
    TRACE = ROOT / "tests" / "data" / "gpu-trace" / "openb_pod_list_default.csv"

COLUMNS = ("pending_mean", "pending_p95", "allocation", "finished", "not_started", "relayouts", "gpu_changes")


def seeds_arg(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3", type=seeds_arg)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6.0, help="hours per phase (three phases: A, B, A)")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--interval", type=float, default=300.0)
    ap.add_argument("--min-dwell", type=int, default=3600)
    ap.add_argument("--min-pending", type=int, default=300)
    ap.add_argument("--min-benefit-jobs", type=int, default=1)
    ap.add_argument("--max-draining", type=int, default=1)
    ap.add_argument("--max-wait", type=int, default=3600)
    ap.add_argument("--change-cost", type=int, default=120)
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="another live run with these live: keys changed, e.g. max_wait=14400,max_draining=2 "
        "(default: that one; 'none' for no variant)",
    )
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    t0 = time.perf_counter()
    pool = livesim.trace_pool(load_pods(a.trace), load_pod_times(a.trace))
    phases = livesim.default_phases(a.hours, a.load)
    layouts = livesim.static_layouts(pool, phases[0], a.gpus)
    limits = {
        "enabled": True,
        "min_pending": a.min_pending,
        "min_dwell": a.min_dwell,
        "min_benefit_jobs": a.min_benefit_jobs,
        "max_draining": a.max_draining,
        "max_wait": a.max_wait,
        "change_cost": a.change_cost,
    }
    doc = livesim.site_doc(a.nodes, layouts, live=limits)
    docs = {"live": doc}
    for text in a.variant if a.variant is not None else ["max_wait=14400,max_draining=2"]:
        if text == "none":
            continue
        changed = dict(kv.split("=", 1) for kv in text.split(","))
        docs[f"live {text}"] = livesim.site_doc(
            a.nodes, layouts, live={**limits, **{k: int(v) for k, v in changed.items()}}
        )
    horizon = sum(p.hours for p in phases) * 3600.0
    gpus = a.nodes * a.gpus
    print(
        f"trace {a.trace}: pods per profile "
        + ", ".join(f"{k} {len(v)}" for k, v in pool.by_profile.items() if k in dict(phases[0].mix))
    )
    print(
        f"cluster {a.nodes} nodes x {a.gpus} A100-SXM4-40GB (MIG), starting layout per node (both runs): "
        + " | ".join("+".join(x) for x in layouts)
    )
    print(
        "phases: "
        + "; ".join(f"{p.name} {p.hours:g} h " + ", ".join(f"{k} {w:.0%}" for k, w in p.mix) for p in phases)
        + f"; load {a.load:g}"
    )
    print(
        "live limits: "
        + ", ".join(f"{k} {v}" for k, v in limits.items() if k != "enabled")
        + f"; loop every {a.interval:g} s"
    )
    rows: dict[str, list[livesim.SimResult]] = {"static": [], **{name: [] for name in docs}}
    for seed in a.seeds:
        jobs = livesim.trace_jobs(pool, phases, gpus, seed)
        for name, results in rows.items():
            t = time.perf_counter()
            r = livesim.simulate(
                docs.get(name, doc), jobs, horizon=horizon, live=name != "static", interval=a.interval, name=name
            )
            results.append(r)
            print(
                f"seed {seed}, {time.perf_counter() - t:.1f} s: {livesim.summary_line(r)}; "
                f"pending mean by phase "
                + ", ".join(f"{phases[k].name}{k + 1} {v:.0f} s" for k, v in r.pending_by_phase.items()),
                flush=True,
            )
    print()
    print(f"mean over seeds {','.join(map(str, a.seeds))}:")
    head = (
        "",
        "pending mean s",
        "pending p95 s",
        "allocation %",
        "finished",
        "not started",
        "relayouts",
        "GPU changes",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    means = {}
    for name, rs in rows.items():
        means[name] = {c: sum(getattr(r, c) for r in rs) / len(rs) for c in COLUMNS}
        m = means[name]
        print(
            f"| {name} | {m['pending_mean']:.0f} | {m['pending_p95']:.0f} | {m['allocation']:.2f} | "
            f"{m['finished']:.0f} | {m['not_started']:.0f} | {m['relayouts']:.1f} | {m['gpu_changes']:.1f} |"
        )
    ratios = {}
    for name in docs:
        ratio = ratios[name] = {
            c: (means[name][c] / means["static"][c] if means["static"][c] else float("nan")) for c in COLUMNS
        }
        print(
            f"| {name} / static | {ratio['pending_mean']:.3f} | {ratio['pending_p95']:.3f} | "
            f"{ratio['allocation']:.3f} | {ratio['finished']:.3f} | {ratio['not_started']:.3f} | - | - |"
        )
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nwall {wall:.1f} s, max RSS {rss:.0f} MiB, jobs per seed " + ", ".join(str(r.jobs) for r in rows["static"])
    )
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "seeds": a.seeds,
                    "means": means,
                    "ratio": ratios,
                    "wall_s": wall,
                    "max_rss_mib": rss,
                    "runs": {
                        n: [{c: getattr(r, c) for c in COLUMNS} | {"changes": r.changes} for r in rs]
                        for n, rs in rows.items()
                    },
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
