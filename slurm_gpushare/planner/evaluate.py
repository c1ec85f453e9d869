"""The planner's packing score for a candidate policy: the Slurm placement model on sampled arrivals. Pure.

Pods are drawn from the demand model itself (each request class as many times
as it was seen), arrive in a seeded random order as in the paper's harness,
and are routed through the product's submission decision onto the candidate's
cluster; the score is the paper's metric (placed GPU demand over the cluster's
GPUs, %) when the arrived demand reaches 100 % of the cluster. Every candidate
is scored on one sample (``SEEDS``); the best few race on more
(``CHECK_SEEDS``, planner/search.py decides which). The seeds are not the
benchmark's (42-51), so a plan is not tuned to the arrivals it is measured on.

The scores are pure; ``Evaluator.many`` (``forked_map``) may compute them in
forked worker processes, when the entry point asks for more than one worker
(``gpushare plan --jobs``): nothing else here has a side effect.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..policy import build_site
from ..sim.arrivals import arrival_sequence
from ..sim.cluster import Pod
from ..sim.slurmmodel import SlurmPolicy, SlurmState, route_all
from .demand import Demand
from .frompolicy import SubmitRouter, sim_cluster

SEEDS = (7,)
# the race (planner/search.py) scores its contenders on these, one order per round: one sample's score of a
# candidate moves by 0.1-0.3 point from seed to seed, the difference between two candidates on one seed less
CHECK_SEEDS = (8, 9, 10, 11, 12)


def demand_pods(demand: Demand) -> tuple[Pod, ...]:
    """One pod per job of the demand model (names make the order reproducible)."""
    pods = []
    for k, (cls, n) in enumerate(sorted(demand.counts.items())):
        for j in range(n):
            pods.append(
                Pod(
                    f"c{k:05d}-{j:06d}",
                    cls.cpus * 1000,
                    cls.memory_mib,
                    cls.num_gpu,
                    cls.gpu_milli,
                    cls.qos,
                    cls.gpu_spec,
                )
            )
    return tuple(pods)


def packing_score(
    raw: dict,
    pods: Sequence[Pod],
    seeds: Sequence[int] = SEEDS,
    percent: int = 100,
    memo: dict | None = None,
    prepared: dict | None = None,
) -> float:
    """Mean placed GPU share (%) at ``percent`` arrived, over ``seeds``, for the policy mapping ``raw``. ``memo``:
    where the arrival orders of these pods are kept between calls (by the cluster's GPU count and the seed);
    ``prepared``: where the candidate's cluster and routed pods are kept between calls (by the policy), so a
    candidate scored on several orders is built and routed once."""
    pods = tuple(pods)
    cluster, router, routed, state = _prepare(raw, pods, prepared)
    demand = [p.gpu_demand_milli for p in pods]
    out = []
    for seed in seeds:
        key = (cluster.gpu_count, seed)
        arrivals = memo.get(key) if memo is not None else None
        if arrivals is None:
            arrivals = arrival_sequence(pods, cluster.gpu_count, seed)
            if memo is not None:
                memo[key] = arrivals
        policy = SlurmPolicy("candidate", router)
        policy.start(cluster, pods, np.random.default_rng([seed, 1]), routed, state.fresh())
        limit = percent * arrivals.capacity_milli / 100
        arrived = placed = 0
        place = policy.place
        for pod in arrivals.order.tolist():
            arrived += demand[pod]
            if place(pod):
                placed += demand[pod]
            if arrived >= limit:
                break
        out.append(100.0 * placed / arrivals.capacity_milli)
    return float(np.mean(out))


PREPARED = 16  # candidates whose cluster and routed pods an Evaluator keeps (the race's contenders fit)


def _prepare(raw: dict, pods: tuple[Pod, ...], prepared: dict | None):
    key = json.dumps(raw, sort_keys=True) if prepared is not None else None
    if prepared is not None and key in prepared:
        return prepared[key]
    site = build_site(raw, "candidate")
    router = SubmitRouter(site)
    cluster = sim_cluster(site)
    out = (cluster, router, route_all(router, pods), SlurmState(cluster))
    if prepared is not None:
        while len(prepared) >= PREPARED:
            prepared.pop(next(iter(prepared)))
        prepared[key] = out
    return out


class Evaluator:
    """``plan(evaluate=...)`` for one demand: ``evaluator(raw)`` scores one policy mapping; ``many`` scores several,
    in ``workers`` forked processes at once when there are several (each score is the same as one by one), on
    ``seeds`` or on other seeds (``check_seeds``: the orders plan()'s race scores its contenders on)."""

    def __init__(
        self, demand: Demand, seeds: Sequence[int] = SEEDS, workers: int = 1, check_seeds: Sequence[int] = CHECK_SEEDS
    ):
        self.pods, self.seeds, self.workers = demand_pods(demand), tuple(seeds), max(1, workers)
        self.check_seeds = tuple(check_seeds)
        self._arrivals: dict = {}  # every candidate is scored on the same arrival orders: drawn once per process
        self._prepared: dict = {}  # the last PREPARED candidates' clusters and routed pods

    def __call__(self, raw: dict) -> float:
        return self.many([raw])[0]

    def many(self, raws: Sequence[dict], seeds: Sequence[int] | None = None) -> list[float]:
        """The scores of ``raws`` on ``seeds`` (default: the evaluator's own)."""
        seeds = self.seeds if seeds is None else tuple(seeds)
        return list(
            forked_map(
                lambda raw: packing_score(raw, self.pods, seeds, memo=self._arrivals, prepared=self._prepared),
                list(raws),
                self.workers,
            )
        )


def forked_map(fn: Callable, items: list, workers: int) -> Iterator:
    """``fn`` over ``items``, ``workers`` at a time in forked processes (in this process when there is one worker
    or item, or no fork on this platform); results in ``items`` order, each as soon as it and those before it are
    done. ``fn`` and what it reads are inherited by the fork, not pickled; only the items and results are. Called
    from a forked worker itself it runs in that process (a pool's workers may not fork again)."""
    import multiprocessing

    if (
        workers <= 1
        or len(items) <= 1
        or "fork" not in multiprocessing.get_all_start_methods()
        or multiprocessing.current_process().daemon
    ):
        yield from map(fn, items)
        return
    global _FORKED
    _FORKED = fn
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(items))) as pool:
            yield from pool.imap(_call_forked, items)
    finally:
        _FORKED = None


_FORKED: Callable | None = None


def _call_forked(item):
    return _FORKED(item)


def evaluator(
    demand: Demand, seeds: Sequence[int] = SEEDS, workers: int = 1, check_seeds: Sequence[int] = CHECK_SEEDS
) -> Evaluator:
    """``plan(evaluate=...)`` for this demand; ``workers``: processes that score candidates side by side;
    ``check_seeds``: the orders the race scores its contenders on, one per round (``()``: no race)."""
    return Evaluator(demand, seeds, workers, check_seeds)
