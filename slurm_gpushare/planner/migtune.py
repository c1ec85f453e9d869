"""Carrier weights for per-job MIG tuned on a workload: fewer requeues for fragmentation, at the least cost. Pure.

The exact weights (``hardware.migweights``) let Slurm admit every set of
slices that fits on an empty GPU, but the prolog places a slice on the GPU
Slurm picked, beside the instances already there: a slice may find no legal
start and its job is requeued. Raising the small profiles' weights admits
fewer of them per GPU, so fewer GPUs fragment, and costs the jobs that would
have started beside them. ``tune`` searches weight vectors from the exact ones
upward on a simulated workload (``sim.perjob.churn``, or any ``evaluate``) and
keeps the one with the highest allocation whose requeue share is under a
target; ``plan_weights`` does it for a planned policy's per-job GPUs on the
planner's demand (``gpushare plan``).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..hardware import GpuModel, get_model
from ..hardware.migplace import DEFAULT_RULE
from ..hardware.migweights import Weights
from ..hardware.packing import covering
from ..policy import Site
from ..policy.perjob import given_weights
from ..sim.perjob import FIRST_FIT, LEAST_LOADED, Carrier, ChurnJob, churn
from .demand import Demand

TARGET = 0.005  # requeue share the tuned weights must stay under on the workload they are tuned on
MAX_LOSS = 0.02  # the most allocation a step may give up against the exact weights (a share of theirs)
STEPS = (1, 2, 4)  # how far one coordinate step raises a weight (to the next weight no other profile has)
ROUNDS = 6  # coordinate rounds at most
SEEDS = (1, 2, 3)  # the workloads `gpushare plan` draws from its demand's mix
JOBS = 1500  # jobs per drawn workload


@dataclass(frozen=True)
class Trial:
    """One weight vector on the workload: its requeue share and allocation."""

    weights: tuple[int, ...]
    requeue_share: float
    allocation: float


@dataclass(frozen=True)
class Tuning:
    """The search's result: the exact weights, the chosen ones, every vector tried (in order) and the target."""

    exact: Weights
    chosen: Weights
    trials: tuple[Trial, ...]
    target: float

    def trial(self, weights: Weights) -> Trial:
        return next(t for t in self.trials if t.weights == weights.weights)

    @property
    def changed(self) -> bool:
        return self.chosen.weights != self.exact.weights

    @property
    def met(self) -> bool:
        """Whether the chosen weights requeue under the target on the workload."""
        return self.trial(self.chosen).requeue_share < self.target


def tune(
    model: GpuModel,
    exact: Weights,
    evaluate: Callable[[Weights], tuple[float, float]],
    *,
    target: float = TARGET,
    max_loss: float = MAX_LOSS,
    steps: Sequence[int] = STEPS,
    rounds: int = ROUNDS,
    raise_only: Sequence[str] | None = None,
) -> Tuning:
    """Carrier weights for ``exact``'s profiles at its capacity, chosen on a workload.

    ``evaluate(weights)`` gives (requeue share, allocation) on the workload. What it optimises: the highest
    allocation among the vectors tried whose requeue share is under ``target`` (ties: the lower requeue share,
    then the lower weights), else the lowest requeue share (ties: the higher allocation). Which vectors: from the
    exact ones, each round raises one profile's weight by one of ``steps`` (to the next weight no other profile
    has, at most the capacity; every such vector is valid, ``policy.perjob.given_weights`` checks it), tries
    every such neighbour and moves to the one with the lowest requeue share among those that keep at least
    (1 - ``max_loss``) x the exact weights' allocation (``raise_only``: only these profiles' weights are
    raised, e.g. those the workload asks for: another's weight changes nothing); it stops when the current vector
    is under ``target``, no neighbour requeues less, or after ``rounds`` rounds. Deterministic: the same workload
    gives the same weights.
    """
    tried: dict[tuple[int, ...], Trial] = {}

    def trial(vector: tuple[int, ...]) -> Trial:
        if vector not in tried:
            share, allocation = evaluate(Weights(exact.model, exact.profiles, vector, exact.capacity))
            tried[vector] = Trial(vector, share, allocation)
        return tried[vector]

    floor = trial(exact.weights).allocation * (1 - max_loss)
    current = trial(exact.weights)
    for _ in range(rounds):
        if current.requeue_share < target:
            break
        near = [trial(v) for v in neighbours(model, exact, current.weights, steps, raise_only)]
        kept = [t for t in near if t.allocation >= floor and t.requeue_share < current.requeue_share]
        if not kept:
            break
        current = min(kept, key=lambda t: (t.requeue_share, -t.allocation, t.weights))
    best = _best([t for t in tried.values() if t.allocation >= floor], target)
    chosen = Weights(exact.model, exact.profiles, best.weights, exact.capacity)
    return Tuning(exact, chosen, tuple(tried.values()), target)


def neighbours(
    model: GpuModel,
    exact: Weights,
    vector: tuple[int, ...],
    steps: Sequence[int],
    raise_only: Sequence[str] | None = None,
) -> list[tuple[int, ...]]:
    """The valid vectors one coordinate step above ``vector`` (raising a profile of ``raise_only``, all when
    None), each once, in profile then step order."""
    out: list[tuple[int, ...]] = []
    for i, profile in enumerate(exact.profiles):
        if raise_only is not None and profile not in raise_only:
            continue
        for step in steps:
            raised = vector[i] + step
            while raised in vector[:i] + vector[i + 1 :]:
                raised += 1
            candidate = vector[:i] + (raised,) + vector[i + 1 :]
            if candidate not in out and _valid(model, exact, candidate):
                out.append(candidate)
    return out


def _valid(model: GpuModel, exact: Weights, vector: tuple[int, ...]) -> bool:
    problems: list = []
    given = dict(zip(exact.profiles, vector, strict=True))
    return given_weights(given, "carrier_weights", model, exact, problems) is not None


def _best(trials: list[Trial], target: float) -> Trial:
    under = [t for t in trials if t.requeue_share < target]
    if under:
        return min(under, key=lambda t: (-t.allocation, t.requeue_share, t.weights))
    return min(trials, key=lambda t: (t.requeue_share, -t.allocation, t.weights))


def churn_evaluator(
    model: GpuModel, workloads: Sequence[list[ChurnJob]], nodes: int, gpus: int, rule: str, pick: str = FIRST_FIT
) -> Callable[[Weights], tuple[float, float]]:
    """``evaluate`` for ``tune``: the workloads replayed on ``nodes`` x ``gpus`` per-job GPUs (``sim.perjob.churn``
    with the prolog's ``rule`` and Slurm's ``pick``), the requeue share of all of them together and the mean
    allocation."""

    def evaluate(weights: Weights) -> tuple[float, float]:
        carrier = Carrier(model.name, tuple(weights.as_dict().items()), weights.capacity, rule)
        runs = [churn(carrier, jobs, nodes, gpus, pick) for jobs in workloads]
        admitted = sum(r.admitted for r in runs)
        share = sum(r.requeued for r in runs) / admitted if admitted else 0.0
        return share, sum(r.allocation for r in runs) / len(runs)

    return evaluate


def drawn_jobs(
    model: GpuModel, mix: dict[str, int], gpus: int, *, load: float = 0.8, jobs: int = JOBS, seed: int = 1
) -> list[ChurnJob]:
    """A workload from a profile mix: ``jobs`` jobs whose profiles follow ``mix`` (profile -> jobs), Poisson
    arrivals offering ``load`` x the compute slices of ``gpus`` GPUs, exponential run times of mean 1 h; seeded."""
    rng = random.Random(seed)
    names, counts = list(mix), list(mix.values())
    mean_slices = sum(model.profile(p).compute_slices * n for p, n in mix.items()) / sum(counts)
    rate = load * gpus * model.compute_slices / (3600 * mean_slices)
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(rate)
        out.append(ChurnJob(t, rng.expovariate(1 / 3600), rng.choices(names, counts)[0]))
    return out


def demand_mix(model: GpuModel, fractions: dict[int, int], profiles: tuple[str, ...]) -> dict[str, int]:
    """The per-job profiles a demand's fractional shares ({milli: jobs}) ask for, each rounded up to the smallest
    allowed profile that covers it (``hardware.packing.covering``); shares no allowed profile covers are left out."""
    mix: dict[str, int] = {}
    for milli, n in fractions.items():
        name = covering(model, milli, profiles)
        if name in profiles:
            mix[name] = mix.get(name, 0) + n
    return dict(sorted(mix.items(), key=lambda kv: profiles.index(kv[0])))


def plan_weights(raw: dict, site: Site, demand: Demand) -> tuple[dict, list[str]]:
    """A planned policy whose per-job MIG entries carry weights tuned on ``demand`` (``carrier_weights``, only
    where they differ from the exact ones), and the report's lines; the policy unchanged (and no lines) where it
    has no per-job GPU or no fractional share a per-job profile covers.

    The workload: ``drawn_jobs`` from the demand's fractional shares rounded to the per-job profiles, on the
    plan's per-job GPUs (as many nodes of as many GPUs as the first per-job group has) at load 0.8, replayed with
    Slurm's LL_SHARED_GRES pick (what the rendered slurm.conf sets with per-job MIG) and the prolog's default rule.
    """
    slots = [(g, s) for g in site.groups for s in g.gpus if s.share.is_per_job_mig]
    if not slots:
        return raw, []
    group, slot = slots[0]
    model, share = slot.model, slot.share
    exact = Weights(model.name, share.profiles, share.weights, share.capacity)
    mix = demand_mix(model, demand.fractions(), share.profiles)
    if not mix:
        return raw, []
    per_node = sum(1 for s in group.gpus if s.share.is_per_job_mig)
    gpus = sum(len(g.nodes) for g, _ in slots)
    nodes = max(1, gpus // per_node)
    workloads = [drawn_jobs(model, mix, nodes * per_node, seed=seed) for seed in SEEDS]
    evaluate = churn_evaluator(model, workloads, nodes, per_node, DEFAULT_RULE, LEAST_LOADED)
    got = tune(model, exact, evaluate, raise_only=tuple(mix))
    return (_with_weights(raw, got.chosen) if got.changed else raw), _lines(got, nodes * per_node)


def _with_weights(raw: dict, weights: Weights) -> dict:
    """``raw`` with ``weights`` as the carrier_weights of every per-job entry of a group of their model."""
    out = copy.deepcopy(raw)
    for group in out.get("node_groups", []):
        if get_model(group["gpu"]["model"]).name != weights.model:
            continue
        for entry in group.get("sharing", []):
            if entry.get("per_job"):
                entry["carrier_weights"] = weights.as_dict()
    return out


def _lines(got: Tuning, gpus: int) -> list[str]:
    exact, chosen = got.trial(got.exact), got.trial(got.chosen)
    lines = [
        f"per-job MIG carrier weights tuned on the demand's slices ({len(SEEDS)} x {JOBS} jobs drawn from its mix "
        f"on the {gpus} per-job GPUs at load 0.8; {len(got.trials)} weight vectors simulated); jobs requeued for "
        f"fragmentation, share of those admitted: exact weights ({_text(got.exact)}) {_pct(exact)}"
    ]
    if not got.changed:
        lines.append(f"no raised weights requeue less for under {MAX_LOSS:.0%} of the allocation: exact weights kept")
        return lines
    note = "" if got.met else f" (not under the {got.target:.1%} target: the fewest found)"
    lines.append(f"tuned weights ({_text(got.chosen)}) {_pct(chosen)}{note}, written as carrier_weights")
    return lines


def _text(w: Weights) -> str:
    return ", ".join(f"{p}={n}" for p, n in zip(w.profiles, w.weights, strict=True)) + f" of {w.capacity}"


def _pct(t: Trial) -> str:
    return f"{t.requeue_share:.2%} requeued, allocation {t.allocation:.1%}"
