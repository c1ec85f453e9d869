"""Per-job MIG placement rules and carrier reserves against requeues: the trace replay and the synthetic churn.

    nice -n 19 python bench/permig_rules.py [--rules first,least-blocking,...] [--trace-seeds 1-3]
        [--churn-seeds 1-3] [--mixes NAME=P:W,...;...] [--loads 0.8] [--reserves 0] [--picks ...]
        [--raise 'P=W,...;...'] [--churn-raise 'capacity=C,P=W,...;...'] [--skip trace|churn] [--json out]

For each placement rule (hardware.migplace.RULES), carrier reserve r (the exact weights of
hardware.migweights with the shard Count lowered by r: Slurm admits only multisets r shards lighter than
the GPU's) and weight vector (``--raise``, ``--churn-raise``: weights between the exact and the safe ones, some
profiles raised; several vectors separated by ';', the empty one the exact weights), two benchmarks, without
reuse (the epilog destroys each instance):

- trace: bench/permig_trace.py's per-job replay of the production trace (4 x 8 A100-SXM4-40GB, load 0.8,
  a seeded 80 % of the pods per seed), Slurm's GPU pick first fit or LL_SHARED_GRES;
- churn: bench/permig_churn.py's one node (8 x A100-SXM4-40GB, Poisson arrivals, exponential run times, mean
  1 h, 2,000 jobs per seed) per mix and load, Slurm's pick first fit or least loaded (LL_SHARED_GRES).

Per row of the table printed at the end (every run in ``--json``), summed over the seeds: jobs requeued at
least once for want of a placement, as a share of the jobs admitted at least once (trace) or of all jobs
(churn), and the allocation (trace: GPU-equivalents, time average; churn: occupancy of the node's compute
slices until the last arrival). Seeds are given per
benchmark so that a rule can be chosen on some seeds and mixes and reported on others (held out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import permig_churn as churn  # noqa: E402
from bench import permig_trace as trace  # noqa: E402
from bench.placement import seeds_of  # noqa: E402
from slurm_gpushare.hardware import get_model  # noqa: E402
from slurm_gpushare.hardware.migplace import RULES  # noqa: E402
from slurm_gpushare.hardware.migweights import exact_weights  # noqa: E402
from slurm_gpushare.sim.perjob import Carrier  # noqa: E402

MODEL = trace.MODEL


def trace_rows(args, rules: list[str], reserves: list[int]) -> list[dict]:
    """One row per (seed, rule, reserve, weight vector, pick) of the trace replay."""
    rows = trace.trace_rows(args.trace)
    profiles = tuple(p.name for p in MODEL.mig_profiles if p.name in {r[1] for r in rows})
    exact = exact_weights(MODEL, profiles)
    assert exact is not None
    gpus = args.nodes * args.gpus
    shape = trace.livesim.site_doc(args.nodes, [["7g.40gb"]] * args.gpus)  # PerJobSim keeps no layout
    out = []
    for seed in args.trace_seeds:
        jobs, _ = trace.seed_jobs(rows, seed, 0.8, args.load, gpus)
        for rule, reserve, raised, pick in product(rules, reserves, args.raise_.split(";"), args.picks):
            weights = tuple(_raised(exact.as_dict(), raised).items())
            car = Carrier(MODEL.name, weights, exact.capacity - reserve, rule)
            t = time.perf_counter()
            sim = trace.PerJobSim(shape, jobs, horizon=jobs[-1].submit, carrier=car, pick=pick, delay=120.0, name=rule)
            r = sim.run()
            row = {"bench": "trace", "case": "trace", "seed": seed, "rule": rule, "reserve": reserve}
            row |= {"weights": dict(weights), "capacity": exact.capacity, "pick": pick}
            row |= {"requeued": len(sim.requeued), "base": len(sim.ever)}
            row |= {"alloc": r.allocation * gpus / 100, "wait_s": r.pending_mean, "wall_s": time.perf_counter() - t}
            out.append(row)
    return out


def churn_rows(args, rules: list[str], reserves: list[int]) -> list[dict]:
    """One row per (mix, load, seed, rule, reserve, weight vector, pick) of the one-node churn."""
    model = get_model(args.model)
    out = []
    for label, mix in churn.parse_mixes(args.mixes).items():
        exact = exact_weights(model, tuple(mix))
        if exact is None:
            print(f"{label}: no exact weights; skipped")
            continue
        for load, seed in product((float(x) for x in args.loads.split(",")), args.churn_seeds):
            jobs = churn.draw(seed, mix, load, args.jobs, 1.0, model, 8)
            vectors = args.churn_raise.split(";")
            for rule, reserve, raised, pick in product(rules, reserves, vectors, ("first-fit", "least-loaded")):
                weights = _raised(exact.as_dict() | {"capacity": exact.capacity}, raised)
                capacity = weights.pop("capacity")
                node = churn.Node(model, 8, weights, capacity - reserve, (pick, rule, False))
                tally = churn.replay(jobs, node, 120.0)
                row = {"bench": "churn", "case": f"{label}@{load}", "seed": seed, "rule": rule, "reserve": reserve}
                row |= {"weights": weights, "capacity": capacity, "pick": pick, "requeued": len(tally.requeued)}
                row |= {"base": tally.jobs, "alloc": tally.slice_seconds}
                out.append(row)
    return out


def _raised(weights: dict[str, int], raised: str) -> dict[str, int]:
    """The weights with the given ones (profile=weight,...; 'capacity=' too for the churn) in their place;
    a profile the vector names that the weights do not have is left out."""
    out = dict(weights)
    for item in filter(None, raised.split(",")):
        name, _, w = item.partition("=")
        if name in out:
            out[name] = int(w)
    return out


def table(rows: list[dict]) -> None:
    """Per benchmark case, Slurm pick, weights and rule, summed over the seeds: requeued jobs, their share,
    the mean allocation (and wait, trace)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        vector = ",".join(f"{p}={w}" for p, w in r["weights"].items())
        key = (r["case"], r["pick"], f"{vector} of {r['capacity'] - r['reserve']}", r["rule"])
        groups.setdefault(key, []).append(r)
    print(f"\n{'case':10} {'pick':14} {'rule':16} | {'requeued':>8} {'of':>6} {'%':>6} | {'alloc':>8} | weights")
    for (case, pick, vector, rule), rs in groups.items():
        req, base = sum(r["requeued"] for r in rs), sum(r["base"] for r in rs)
        alloc = sum(r["alloc"] for r in rs) / len(rs)
        print(f"{case:10} {pick:14} {rule:16} | {req:8d} {base:6d} {100 * req / base:6.2f} | {alloc:8.4f} | {vector}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--reserves", default="0")
    ap.add_argument("--trace-seeds", type=seeds_of, default=seeds_of("1-3"))
    ap.add_argument("--churn-seeds", type=seeds_of, default=seeds_of("1-3"))
    ap.add_argument("--picks", default="LL_SHARED_GRES,first-fit")
    ap.add_argument("--mixes", default=churn.MIXES)
    ap.add_argument("--loads", default="0.8")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--model", default="A100-SXM4-40GB")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument(
        "--raise",
        dest="raise_",
        default="",
        help="trace: weights in place of the exact ones (p=w,...), several vectors separated by ';'",
    )
    ap.add_argument("--churn-raise", default="", help="churn: as --raise, capacity=C too (per mix, its profiles)")
    ap.add_argument("--skip", default="", help="trace or churn: leave that benchmark out")
    ap.add_argument("--trace", type=Path, default=trace.TRACE)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.picks = args.picks.split(",")
    rules, reserves = args.rules.split(","), [int(x) for x in args.reserves.split(",")]
    began = time.perf_counter()
    rows = [] if args.skip == "trace" else trace_rows(args, rules, reserves)
    rows += [] if args.skip == "churn" else churn_rows(args, rules, reserves)
    table(rows)
    print(f"wall {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
