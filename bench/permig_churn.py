"""Per-job MIG churn: how often Slurm admits a job whose MIG instance then has no legal placement on its GPU.

    python bench/permig_churn.py [--model A100-SXM4-40GB] [--gpus 8] [--mixes NAME=P:W,...;...]
        [--loads 0.8,1.2] [--jobs 2000] [--seeds 1-3] [--hours 1] [--requeue-delay 120]

One node of ``--gpus`` GPUs of one model. Jobs of a profile mix arrive (Poisson,
offered load in compute slices, ``--loads``) and leave (exponential run time,
mean ``--hours``), drawn once per seed and replayed by every combination, so
the figures are deterministic for a seed. Slurm admits a job when one GPU has
the job's carrier weight free (shards, the exact weights of
slurm_gpushare/hardware/migweights.py for the mix's profiles) and picks that GPU:

- ``first-fit``: the lowest-index GPU with room (cons_tres' default),
- ``least-loaded``: the GPU with the most free count (``LL_SHARED_GRES``),
- ``placement-aware``: hardware/migplace.py ``pick_gpu`` among the GPUs with
  room (an upper bound: Slurm's pick is not ours to make; for comparison only).

On the GPU the prolog places the instance (hardware/migplace.py ``choose``):
``first`` (lowest legal start), ``least-blocking`` (largest free run, then most
legal placements left, then lowest start), ``most-placements`` (the two the
other way round), each without reuse (the epilog destroys the instance) and
with it (the instance stays idle; a job of its profile takes it, another
destroys the fewest idle instances in its way). A job admitted with no legal
placement is requeued: its count is released and it is queued again after
``--requeue-delay`` seconds. Waiting jobs are tried in arrival order at every
arrival and end (a job that does not fit is passed over, as backfill would).

Per mix and load, per combination, summed over the seeds: jobs, jobs requeued
at least once for want of a placement (count, share of jobs, ratio against the
baseline ``first-fit / first / no reuse`` of the same run), admissions (a
requeued job is admitted again, often onto the same GPU, so one job can fail
many times) and those with no placement, occupancy (compute
slices held by running jobs over the node's, time average until the last
arrival; ratio against the baseline) and the mean wait from arrival to start.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.placement import seeds_of  # noqa: E402
from slurm_gpushare.hardware import get_model  # noqa: E402
from slurm_gpushare.hardware.migplace import FIRST, LEAST_BLOCKING, MOST_PLACEMENTS, choose, pick_gpu  # noqa: E402
from slurm_gpushare.hardware.migweights import exact_weights  # noqa: E402
from slurm_gpushare.hardware.model import GpuModel  # noqa: E402

MIXES = "sheet=1g.5gb:5,2g.10gb:3,3g.20gb:2;all=1g.5gb:4,2g.10gb:2,3g.20gb:2,4g.20gb:1,7g.40gb:1"
PICKS = ("first-fit", "least-loaded", "placement-aware")
RULES = (FIRST, LEAST_BLOCKING, MOST_PLACEMENTS)
BASELINE = ("first-fit", FIRST, False)


@dataclass(frozen=True)
class Job:
    ident: int
    arrival: float
    profile: str
    duration: float


@dataclass
class Gpu:
    free: int
    instances: list[tuple[str, int]] = field(default_factory=list)
    idle: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Tally:
    admitted: int = 0
    unplaced: int = 0
    requeued: set[int] = field(default_factory=set)
    started: int = 0
    jobs: int = 0
    wait: float = 0.0
    slice_seconds: float = 0.0


def draw(seed: int, mix: dict[str, int], load: float, jobs: int, hours: float, model: GpuModel, gpus: int):
    """The seed's jobs: arrivals at the rate that offers ``load`` x the node's compute slices."""
    rng = random.Random(seed)
    names, weights = list(mix), list(mix.values())
    mean_slices = sum(model.profile(n).compute_slices * w for n, w in mix.items()) / sum(weights)
    rate = load * gpus * model.compute_slices / (hours * 3600 * mean_slices)
    t, out = 0.0, []
    for i in range(jobs):
        t += rng.expovariate(rate)
        out.append(Job(i, t, rng.choices(names, weights)[0], rng.expovariate(1 / (hours * 3600))))
    return out


@lru_cache(maxsize=200_000)
def _choose(model_name: str, profile: str, instances: tuple, idle: tuple, allowed: tuple, rule: str):
    return choose(get_model(model_name), profile, list(instances), idle=list(idle), allowed=allowed, rule=rule)


@lru_cache(maxsize=200_000)
def _pick(model_name: str, profile: str, gpus: tuple, allowed: tuple, rule: str):
    return pick_gpu(get_model(model_name), profile, [(list(i), list(d)) for i, d in gpus], allowed=allowed, rule=rule)


class Node:
    """The node's GPUs, Slurm's counts and the prolog's placements under one combination."""

    def __init__(self, model: GpuModel, gpus: int, weights: dict[str, int], capacity: int, combo: tuple):
        self.model, self.weights = model, weights
        self.pick, self.rule, self.reuse = combo
        self.allowed = tuple(weights)
        self.gpus = [Gpu(capacity) for _ in range(gpus)]

    def slurm_pick(self, profile: str) -> int | None:
        need = self.weights[profile]
        room = [i for i, g in enumerate(self.gpus) if g.free >= need]
        if not room:
            return None
        if self.pick == "first-fit":
            return room[0]
        if self.pick == "least-loaded":
            return max(room, key=lambda i: (self.gpus[i].free, -i))
        states = tuple((tuple(sorted(self.gpus[i].instances)), tuple(sorted(self.gpus[i].idle))) for i in room)
        got = _pick(self.model.name, profile, states, self.allowed, self.rule)
        return room[0] if got is None else room[got]

    def place(self, index: int, profile: str) -> tuple[str, int] | None:
        gpu = self.gpus[index]
        key = (tuple(sorted(gpu.instances)), tuple(sorted(gpu.idle)))
        choice = _choose(self.model.name, profile, key[0], key[1], self.allowed, self.rule)
        if choice is None:
            return None
        for doomed in choice.destroy:
            gpu.instances.remove(doomed)
            gpu.idle.remove(doomed)
        instance = (profile, choice.start)
        if choice.reuse:
            gpu.idle.remove(instance)
        else:
            gpu.instances.append(instance)
        return instance

    def release(self, index: int, profile: str, instance: tuple[str, int]) -> None:
        gpu = self.gpus[index]
        gpu.free += self.weights[profile]
        if self.reuse:
            gpu.idle.append(instance)
        else:
            gpu.instances.remove(instance)


def replay(jobs: list[Job], node: Node, requeue_delay: float) -> Tally:
    """Event replay: arrivals, ends and requeues, waiting jobs tried in arrival order after each event."""
    tally, events, queue = Tally(jobs=len(jobs)), [], []
    for job in jobs:
        heapq.heappush(events, (job.arrival, 1, job.ident, "arrive", job, None))
    busy, last_t, horizon = 0, 0.0, jobs[-1].arrival
    while events:
        t, _, _, kind, job, where = heapq.heappop(events)
        span = max(0.0, min(t, horizon) - last_t)
        tally.slice_seconds += busy * span
        last_t = max(last_t, min(t, horizon))
        if kind == "end":
            node.release(where[0], job.profile, where[1])
            busy -= node.model.profile(job.profile).compute_slices
        else:
            queue.append(job)
        busy += _schedule(node, queue, events, t, tally, requeue_delay)
    tally.slice_seconds /= horizon * len(node.gpus) * node.model.compute_slices
    return tally


def _schedule(node: Node, queue: list[Job], events: list, t: float, tally: Tally, requeue_delay: float) -> int:
    """Start what Slurm admits and the prolog can place; requeue what it cannot. Returns compute slices started."""
    started, keep = 0, []
    for job in queue:
        index = node.slurm_pick(job.profile)
        if index is None:
            keep.append(job)
            continue
        tally.admitted += 1
        instance = node.place(index, job.profile)
        if instance is None:
            tally.unplaced += 1
            tally.requeued.add(job.ident)
            heapq.heappush(events, (t + requeue_delay, 0, job.ident, "requeue", job, None))
            continue
        node.gpus[index].free -= node.weights[job.profile]
        tally.started += 1
        tally.wait += t - job.arrival
        started += node.model.profile(job.profile).compute_slices
        heapq.heappush(events, (t + job.duration, 0, job.ident, "end", job, (index, instance)))
    queue[:] = keep
    return started


def combos() -> Iterator[tuple[str, str, bool]]:
    for pick in PICKS:
        for rule in RULES:
            for reuse in (False, True):
                yield pick, rule, reuse


def run_case(args, model: GpuModel, label: str, mix: dict[str, int], load: float) -> None:
    weights = exact_weights(model, tuple(mix))
    if weights is None:
        print(f"{label}: no exact carrier weights for {', '.join(mix)}; skipped")
        return
    shards = ", ".join(f"{p}={w}" for p, w in weights.as_dict().items())
    listed = ", ".join(f"{p}:{w}" for p, w in mix.items())
    print(f"\n## mix {label} ({listed}), load {load}: Count={weights.capacity}, {shards}")
    totals: dict[tuple, list[Tally]] = {c: [] for c in combos()}
    for seed in args.seeds:
        jobs = draw(seed, mix, load, args.jobs, args.hours, model, args.gpus)
        for combo in totals:
            node = Node(model, args.gpus, weights.as_dict(), weights.capacity, combo)
            totals[combo].append(replay(jobs, node, args.requeue_delay))
    print_table(totals)


def print_table(totals: dict[tuple, list]) -> None:
    base = _sums(totals[BASELINE])
    print(
        f"{'GPU pick':16} {'placement':16} {'reuse':5} | {'jobs':>6} {'requeued':>8} {'%':>6} {'x base':>6} |"
        f" {'admitted':>8} {'no place':>8} {'%':>6} | {'occup %':>7} {'x base':>6} | {'wait min':>8}"
    )
    for combo, tallies in totals.items():
        s = _sums(tallies)
        jobs_pct = 100 * s["requeued"] / s["jobs"]
        ratio = s["requeued"] / base["requeued"] if base["requeued"] else float("nan")
        pct = 100 * s["unplaced"] / max(1, s["admitted"])
        print(
            f"{combo[0]:16} {combo[1]:16} {'yes' if combo[2] else 'no':5} | {s['jobs']:6d} {s['requeued']:8d}"
            f" {jobs_pct:6.2f} {ratio:6.2f} | {s['admitted']:8d} {s['unplaced']:8d} {pct:6.2f} |"
            f" {100 * s['occupancy']:7.2f} {s['occupancy'] / base['occupancy']:6.3f} | {s['wait'] / 60:8.1f}"
        )


def _sums(tallies: list[Tally]) -> dict:
    started = sum(t.started for t in tallies)
    return {
        "admitted": sum(t.admitted for t in tallies),
        "unplaced": sum(t.unplaced for t in tallies),
        "requeued": sum(len(t.requeued) for t in tallies),
        "jobs": sum(t.jobs for t in tallies),
        "occupancy": sum(t.slice_seconds for t in tallies) / len(tallies),
        "wait": sum(t.wait for t in tallies) / max(1, started),
    }


def parse_mixes(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for part in text.split(";"):
        label, _, body = part.partition("=")
        out[label] = {p: int(w) for p, _, w in (item.partition(":") for item in body.split(","))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="A100-SXM4-40GB")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--mixes", default=MIXES)
    ap.add_argument("--loads", default="0.8,1.2")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--seeds", type=seeds_of, default=seeds_of("1-3"))
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--requeue-delay", type=float, default=120.0)
    args = ap.parse_args()
    model = get_model(args.model)
    began = time.perf_counter()
    print(
        f"{args.gpus} x {model.name}, {args.jobs} jobs per seed, seeds {args.seeds}, mean run {args.hours} h,"
        f" requeue delay {args.requeue_delay:.0f} s; baseline: {' / '.join(map(str, BASELINE))}"
    )
    for label, mix in parse_mixes(args.mixes).items():
        for load in (float(x) for x in args.loads.split(",")):
            run_case(args, model, label, mix, load)
    print(f"\nwall {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
