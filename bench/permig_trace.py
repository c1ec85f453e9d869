"""Per-job MIG on the production trace: fixed layouts, the live relayout loop and per-job MIG, with departures.

    nice -n 19 python bench/permig_trace.py [--seeds 1-3] [--sample 0.8] [--nodes 4] [--gpus 8] [--load 0.8]
        [--requeue-delay 120] [--interval 300] [--safe-extra 4] [--tune-seeds 1-10] [--no-live] [--json out.json]

Jobs: the trace's (tests/data/gpu-trace/openb_pod_list_default.csv) one-GPU fractional pods, each share
rounded up to the A100-SXM4-40GB MIG profile that covers it (S2's rule, hardware.packing.covering); created
at the trace's creation_time, running deletion_time - scheduled_time (capped at the tier's 1 day; a pod the
trace never scheduled gets a run time drawn from its profile's known ones). Pods created before the 1st
percentile of creation times (a few long-lived pods the snapshot caught, months before the rest) are left out.
Each seed keeps every pod with probability ``--sample`` (a seeded subsample: the seeds differ in which pods
arrive) and draws the missing run times. Time is compressed by one factor per seed so that the jobs offer
``--load`` x the cluster's compute slices over the span of arrivals: arrival gaps keep their trace shape (its
bursts), run times are the trace's.

Cluster: ``--nodes`` x ``--gpus`` A100-SXM4-40GB (live/sim.py's site: 256 CPUs, 2 TB, one tier). Simulated
Slurm as live/sim.py (FIFO per GRES type, node choice as eval_nodes.c); the horizon is the last arrival.

- fixed: every GPU in the layouts of hardware.packing.pack, the packing `gpushare plan` writes for a MIG pool,
  fed with the trace's mix by Little's law (live/sim.py static_layouts), never changed;
- live: the same start, with the product's live planner (plan_live) every ``--interval`` s carried out as
  `gpushare live apply` does (lock, drain 120 s, relayout): each relayout is a drain; each seed prints how
  many of its plan_live calls proposed a change and which limit held the others back;
- fixed / live from the first 10 %: the start is the packing of the mix of the first 10 % of the seed's
  arrivals (a layout not fitted to the whole trace, as a site's layout is when its mix drifts), kept fixed or
  with the live loop; live, max_wait 1 day: the fitted start, the live loop with max_wait 86400 s (the one
  limit that holds its changes back on this trace);
- per-job: every GPU per-job MIG (profiles: every profile the jobs ask for; carrier shards per GPU as
  Slurm counts them), Slurm's GPU pick first fit or LL_SHARED_GRES, the prolog's placement rule
  (hardware.migplace: first, least-blocking, most-placements, largest-first) without reuse; weights exact (the
  count admits exactly what fits on an empty GPU), safe (hardware.migweights.safe_weights for that rule: no
  admitted order leaves a slice without a start) or tuned (``--tune-seeds``: the weights the product's tuner,
  planner.migtune.tune, picks on those seeds' jobs with its own replay, sim.perjob.churn, LL_SHARED_GRES and
  largest-first, as `gpushare plan` does on a demand; report them on other seeds). A slice with no legal start
  on the GPU Slurm gave is refused and the job requeued after ``--requeue-delay`` s (its shards released).
  Never a drain.

Figures per row, summed or averaged over the seeds: GPU-equivalents allocated (compute slices of running
instances / 7, time-averaged), mean wait (arrival to start; a job still waiting at the horizon counts to it),
jobs, jobs requeued at least once for fragmentation (% of jobs admitted at least once), admissions and
refusals, drains; every figure also as the ratio to the fixed row of the same seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.placement import seeds_of  # noqa: E402
from slurm_gpushare.hardware import get_model  # noqa: E402
from slurm_gpushare.hardware.migplace import FIRST, LARGEST_FIRST, LEAST_BLOCKING, MOST_PLACEMENTS  # noqa: E402
from slurm_gpushare.hardware.migweights import exact_weights, placeable_multisets, safe_weights  # noqa: E402
from slurm_gpushare.hardware.packing import covering  # noqa: E402
from slurm_gpushare.live import sim as livesim  # noqa: E402
from slurm_gpushare.live.plan import plan_live  # noqa: E402
from slurm_gpushare.planner.migtune import churn_evaluator, tune  # noqa: E402
from slurm_gpushare.sim.perjob import LEAST_LOADED, Carrier, ChurnJob, Slices  # noqa: E402
from slurm_gpushare.sim.slurmmodel import consec_pick  # noqa: E402
from slurm_gpushare.sim.trace import load_pod_times, load_pods  # noqa: E402

TRACE = ROOT / "tests" / "data" / "gpu-trace" / "openb_pod_list_default.csv"
MODEL = get_model(livesim.MODEL)
RULES = (FIRST, LEAST_BLOCKING, MOST_PLACEMENTS, LARGEST_FIRST)
PICKS = ("first-fit", "LL_SHARED_GRES")
LIMITS = {"enabled": True, "min_pending": 300, "min_dwell": 3600, "min_benefit_jobs": 1, "max_draining": 1}
LIMITS |= {"max_wait": 3600, "change_cost": 120}
EARLY = 0.1  # the share of a seed's first arrivals whose mix makes the unfitted start
LOOSE_WAIT = 86400  # s: max_wait of the "live, max_wait 1 day" row


# ---- the trace's jobs --------------------------------------------------------------------------------------------


def trace_rows(path: Path) -> list[tuple[int, str, int, int, float | None]]:
    """(creation s, profile, cpus, memory MiB, run s or None) of every one-GPU fractional pod, by creation."""
    pods, times = load_pods(path), load_pod_times(path)
    rows = []
    for p in pods:
        if p.num_gpu != 1 or p.gpu_milli >= 1000:
            continue
        created, sched, deleted = times[p.name]
        run = None if sched is None or deleted is None else float(min(max(deleted - sched, 1), livesim.MAX_TIME))
        rows.append((created, covering(MODEL, p.gpu_milli) or "", max(1, -(-p.cpu_milli // 1000)), p.memory_mib, run))
    rows.sort(key=lambda r: r[0])
    first = np.percentile([r[0] for r in rows], 1)
    return [r for r in rows if r[0] >= first]


def seed_jobs(rows, seed: int, sample: float, load: float, gpus: int) -> tuple[list[livesim.SimJob], float]:
    """The seed's subsample as jobs, time compressed to offer ``load``; and the compression factor."""
    rng = np.random.default_rng(seed)
    known: dict[str, list[float]] = {}
    for _, prof, _, _, run in rows:
        if run is not None:
            known.setdefault(prof, []).append(run)
    kept = []
    for created, prof, cpus, mem, run in rows:
        if rng.random() >= sample:
            continue
        if run is None:
            run = float(known[prof][int(rng.integers(len(known[prof])))])
        kept.append((created, prof, cpus, mem, run))
    work = sum(run * MODEL.profile(prof).compute_slices for _, prof, _, _, run in kept)
    span = kept[-1][0] - kept[0][0]
    factor = load * MODEL.compute_slices * gpus * span / work
    t0 = kept[0][0]
    jobs = [
        livesim.SimJob(i + 1, (c - t0) / factor, run, prof, cpus, mem)
        for i, (c, prof, cpus, mem, run) in enumerate(kept)
    ]
    return jobs, factor


# ---- per-job MIG in the churn simulator ---------------------------------------------------------------------------


class PerJobSim(livesim.LiveSim):
    """live/sim.py's Slurm with every GPU per-job MIG: a job takes its profile's shards on the GPU Slurm picks,
    then the prolog places the slice there (sim.perjob); a slice with no start is refused and requeued."""

    def __init__(self, doc, jobs, *, horizon: float, carrier: Carrier, pick: str, delay: float, name: str):
        super().__init__(doc, jobs, horizon=horizon, live=False, name=name)
        gpus = len(self.site.groups[0].gpus)
        self.carrier, self.pick, self.delay = carrier, pick, delay
        self.free = {n: [carrier.capacity] * gpus for n in self.names}
        self.slices = Slices()
        self.admitted = 0
        self.requeued: set[int] = set()
        self.ever: set[int] = set()  # jobs admitted at least once
        self.held: dict[int, tuple[str, int, tuple[str, int]]] = {}

    def _gpu(self, node: str, need: int) -> int:
        free = self.free[node]
        room = [g for g, f in enumerate(free) if f >= need]
        return room[0] if self.pick == "first-fit" else max(room, key=lambda g: (free[g], -g))

    def _try_start(self, jid: int, stype: str) -> bool:
        job = self.jobs[jid]
        need = self.carrier.weight(job.profile)
        ok = np.array(
            [
                self.cpu[i] >= job.cpus and self.mem[i] >= job.memory_mib and max(self.free[n]) >= need
                for i, n in enumerate(self.names)
            ]
        )
        i = consec_pick(ok, self.weight, self.cpu)
        if i < 0:
            return False
        node = self.names[i]
        gpu = self._gpu(node, need)
        self.admitted += 1
        self.ever.add(jid)
        instance = self.slices.place(self.carrier, (node, gpu), job.profile)
        if instance is None:  # refused by the prolog: requeued, shards never held past the prolog
            self.requeued.add(jid)
            self._push(self.now + self.delay, livesim._ARRIVE, jid)
            return True
        self.free[node][gpu] -= need
        self.cpu[i] -= job.cpus
        self.mem[i] -= job.memory_mib
        self.occupied += MODEL.profile(job.profile).compute_slices
        self.start[jid] = self.now
        self.held[jid] = (node, gpu, instance)
        self._push(self.now + job.duration, livesim._END, jid)
        return True

    def _end(self, jid: int) -> None:
        job = self.jobs[jid]
        node, gpu, instance = self.held.pop(jid)
        i = self.index[node]
        self.free[node][gpu] += self.carrier.weight(job.profile)
        self.slices.release((node, gpu), instance)
        self.cpu[i] += job.cpus
        self.mem[i] += job.memory_mib
        self.occupied -= MODEL.profile(job.profile).compute_slices
        self.end[jid] = self.now


# ---- runs and figures ------------------------------------------------------------------------------------------


def tuned_carrier(args, rows, exact) -> Carrier:
    """The weights the product's tuner (planner.migtune.tune) picks on the training seeds ``--tune-seeds``: each
    seed's jobs replayed by sim.perjob.churn (LL_SHARED_GRES, largest-first), the profiles the jobs ask for."""
    t = time.perf_counter()
    workloads = []
    for seed in args.tune_seeds:
        jobs, _ = seed_jobs(rows, seed, args.sample, args.load, args.nodes * args.gpus)
        workloads.append([ChurnJob(j.submit, j.duration, j.profile) for j in jobs])
    asked = tuple(p for p in exact.profiles if any(j.profile == p for w in workloads for j in w))
    evaluate = churn_evaluator(MODEL, workloads, args.nodes, args.gpus, LARGEST_FIRST, LEAST_LOADED)
    got = tune(MODEL, exact, evaluate, raise_only=asked)
    for name, w in (("exact", got.exact), ("tuned", got.chosen)):
        trial = got.trial(w)
        print(
            f"  tuner, {name} on seeds {args.tune_seeds} (its own replay): {w.as_dict()} of {w.capacity},"
            f" {100 * trial.requeue_share:.2f} % requeued, allocation {100 * trial.allocation:.2f} %"
        )
    print(f"  tuner: {len(got.trials)} vectors in {time.perf_counter() - t:.1f} s, target met: {got.met}")
    return Carrier(MODEL.name, tuple(got.chosen.as_dict().items()), got.chosen.capacity, LARGEST_FIRST)


def carriers(profiles: tuple[str, ...], safe_extra: int) -> dict[str, Carrier]:
    """The per-job carriers: exact weights, and the safe weights of each rule (printed with their cost)."""
    exact = exact_weights(MODEL, profiles)
    if exact is None:
        raise SystemExit(f"no exact carrier weights for {', '.join(profiles)} on {MODEL.name}")
    placeable = len(placeable_multisets(MODEL, exact.profiles))
    print(f"per-job profiles {', '.join(exact.profiles)}; {placeable} multisets fit one GPU")
    print(f"  exact: {exact.as_dict()} of {exact.capacity} (admits all {placeable})")
    out = {"exact": Carrier(MODEL.name, tuple(exact.as_dict().items()), exact.capacity)}
    for rule in RULES if safe_extra >= 0 else ():
        t = time.perf_counter()
        found = safe_weights(MODEL, profiles, rule, safe_extra)
        assert found is not None
        w, admitted = found
        print(
            f"  safe for {rule}: {w.as_dict()} of {w.capacity} (admits {admitted} of {placeable};"
            f" found in {time.perf_counter() - t:.1f} s)"
        )
        out[f"safe {rule}"] = Carrier(MODEL.name, tuple(w.as_dict().items()), w.capacity, rule)
    return out


def one_seed(args, rows, seed: int, cars: dict[str, Carrier]) -> dict[str, dict]:
    gpus = args.nodes * args.gpus
    jobs, factor = seed_jobs(rows, seed, args.sample, args.load, gpus)
    horizon = jobs[-1].submit
    mix = Counter(j.profile for j in jobs)
    pool = livesim.trace_pool(load_pods(args.trace), load_pod_times(args.trace))
    phase = livesim.Phase("trace", horizon / 3600, tuple((p, n / len(jobs)) for p, n in sorted(mix.items())))
    layouts = livesim.static_layouts(pool, phase, args.gpus)
    print(
        f"\nseed {seed}: {len(jobs)} jobs ({', '.join(f'{p} {n}' for p, n in sorted(mix.items()))}),"
        f" time / {factor:.1f},"
        f" horizon {horizon / 3600:.1f} h; fixed layout per node: {' | '.join('+'.join(x) for x in layouts)}",
        flush=True,
    )
    out: dict[str, dict] = {}
    for name, live in (("fixed", False), ("live", True)) if args.live else (("fixed", False),):
        t, tally = time.perf_counter(), Tally()
        doc = livesim.site_doc(args.nodes, layouts, live=LIMITS)
        r = livesim.simulate(doc, jobs, horizon=horizon, live=live, interval=args.interval, decide=tally, name=name)
        if live:
            print(f"  {name}: {tally.line()}; {r.relayouts} relayout(s)", flush=True)
        out[name] = _figures(r, gpus, len(jobs), (r.started, r.started, 0, 0), r.relayouts, time.perf_counter() - t)
    if args.live:
        out |= drift_rows(args, jobs, pool, layouts)
    shape = livesim.site_doc(args.nodes, layouts)  # the nodes' CPUs and memory; PerJobSim keeps no layout
    for weights, car in cars.items():
        for rule in RULES if weights == "exact" else (car.rule,):
            for pick in PICKS:
                t = time.perf_counter()
                c = Carrier(car.model, car.slices, car.capacity, rule)
                name = f"per-job {pick} {rule} {weights.split()[0]}"
                sim = PerJobSim(shape, jobs, horizon=horizon, carrier=c, pick=pick, delay=args.requeue_delay, name=name)
                r = sim.run()
                counts = (len(sim.ever), sim.admitted, sim.slices.refused, len(sim.requeued))
                out[name] = _figures(r, gpus, len(jobs), counts, 0, time.perf_counter() - t)
    for name, f in out.items():
        print(f"  {name}: {json.dumps({k: round(v, 3) for k, v in f.items()})}", flush=True)
    return out


# ---- the live loop from an unfitted start, and what holds it back ------------------------------------------------


class Tally:
    """The product's plan_live, counting per call: calls with pending jobs, changes proposed, and the limit that
    held each change back (the held lines that carry a change), by the limit's name in the held line."""

    LIMITS = ("max_wait", "min_dwell", "min_benefit_jobs", "max_draining", "no end time", "policy refuses")

    def __init__(self) -> None:
        self.calls = self.with_pending = self.proposed = 0
        self.held: Counter[str] = Counter()

    def __call__(self, site, view):
        plan = plan_live(site, view)
        self.calls += 1
        self.with_pending += bool(view.pending)
        self.proposed += len(plan.proposals)
        for h in plan.held:
            if h.change is not None:
                self.held[next((k for k in self.LIMITS if k in h.why), "other")] += 1
        return plan

    def line(self) -> str:
        held = ", ".join(f"{k} {n}" for k, n in self.held.most_common()) or "none"
        return (
            f"{self.calls} plan_live calls, {self.with_pending} with jobs pending, {self.proposed} change(s)"
            f" proposed; changes held by {held}"
        )


def early_layouts(pool, jobs, gpus: int) -> list[tuple[str, ...]]:
    """static_layouts of the mix of the first ``EARLY`` of ``jobs`` (in arrival order)."""
    first = jobs[: max(1, int(len(jobs) * EARLY))]
    mix = Counter(j.profile for j in first)
    phase = livesim.Phase("early", first[-1].submit / 3600, tuple((p, n / len(first)) for p, n in sorted(mix.items())))
    return livesim.static_layouts(pool, phase, gpus)


def drift_rows(args, jobs, pool, fitted) -> dict[str, dict]:
    """The start of the first 10 % kept fixed and with the live loop; the fitted start with max_wait 1 day.
    Prints the start and, for each live run, its Tally line."""
    gpus, horizon = args.nodes * args.gpus, jobs[-1].submit
    early = early_layouts(pool, jobs, args.gpus)
    print(f"  start from the first {EARLY:.0%} of arrivals, per node: {' | '.join('+'.join(x) for x in early)}")
    runs = (
        ("fixed from the first 10 %", early, False, LIMITS),
        ("live from the first 10 %", early, True, LIMITS),
        ("live, max_wait 1 day", fitted, True, LIMITS | {"max_wait": LOOSE_WAIT}),
    )
    out: dict[str, dict] = {}
    for name, layouts, live, limits in runs:
        t, tally = time.perf_counter(), Tally()
        doc = livesim.site_doc(args.nodes, layouts, live=limits)
        r = livesim.simulate(doc, jobs, horizon=horizon, live=live, interval=args.interval, decide=tally, name=name)
        if live:
            print(f"  {name}: {tally.line()}; {r.relayouts} relayout(s)", flush=True)
        out[name] = _figures(r, gpus, len(jobs), (r.started, r.started, 0, 0), r.relayouts, time.perf_counter() - t)
    return out


def _figures(r, gpus: int, jobs: int, counts: tuple[int, int, int, int], drains: int, wall: float) -> dict:
    """``counts``: jobs admitted at least once, admissions, refusals, jobs requeued at least once."""
    ever, admitted, refused, requeued = counts
    return {
        "gpu_eq": r.allocation * gpus / 100,
        "wait_s": r.pending_mean,
        "jobs": jobs,
        "started": r.started,
        "ever": ever,
        "admitted": admitted,
        "refused": refused,
        "requeued": requeued,
        "drains": drains,
        "wall_s": wall,
    }


def table(runs: list[dict[str, dict]]) -> None:
    names = list(runs[0])
    base = {k: np.mean([r["fixed"][k] for r in runs]) for k in ("gpu_eq", "wait_s")}
    print(
        f"\n{'row':44} | {'GPU-eq':>7} {'x fixed':>7} | {'wait min':>8} {'x fixed':>7} | {'jobs':>6} {'requeued':>8}"
        f" {'% adm.':>6} | {'admissions':>10} {'refused':>7} | {'drains':>6}"
    )
    for name in names:
        rs = [r[name] for r in runs]
        gpu_eq, wait = np.mean([r["gpu_eq"] for r in rs]), np.mean([r["wait_s"] for r in rs])
        jobs, req = sum(r["jobs"] for r in rs), sum(r["requeued"] for r in rs)
        ever = sum(r["ever"] for r in rs)
        print(
            f"{name:44} | {gpu_eq:7.2f} {gpu_eq / base['gpu_eq']:7.3f} | {wait / 60:8.1f}"
            f" {wait / base['wait_s'] if base['wait_s'] else float('nan'):7.3f} | {jobs:6d} {req:8d}"
            f" {100 * req / max(1, ever):6.2f} | {sum(r['admitted'] for r in rs):10d}"
            f" {sum(r['refused'] for r in rs):7d} | {sum(r['drains'] for r in rs):6d}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=seeds_of, default=seeds_of("1-3"))
    ap.add_argument("--sample", type=float, default=0.8)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--requeue-delay", type=float, default=120.0)
    ap.add_argument("--interval", type=float, default=300.0)
    ap.add_argument(
        "--safe-extra", type=int, default=4, help="capacities above the exact one safe_weights tries (-1: no safe rows)"
    )
    ap.add_argument("--tune-seeds", type=seeds_of, help="a 'tuned' row: weights the product's tuner picks on these")
    ap.add_argument("--no-live", dest="live", action="store_false", help="no live-loop row")
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    began = time.perf_counter()
    rows = trace_rows(args.trace)
    profiles = tuple(p.name for p in MODEL.mig_profiles if p.name in {r[1] for r in rows})
    print(
        f"{args.trace.name}: {len(rows)} one-GPU fractional pods after the 1st creation percentile; sample"
        f" {args.sample} per seed, seeds {args.seeds}; {args.nodes} x {args.gpus} {MODEL.name}, load {args.load},"
        f" requeue delay {args.requeue_delay:.0f} s, live loop every {args.interval:.0f} s"
    )
    cars = carriers(profiles, args.safe_extra)
    if args.tune_seeds:
        exact = exact_weights(MODEL, profiles)
        assert exact is not None
        cars["tuned"] = tuned_carrier(args, rows, exact)
    runs = [one_seed(args, rows, seed, cars) for seed in args.seeds]
    table(runs)
    print(f"\nwall {time.perf_counter() - began:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
