"""The planner's packing score for a candidate policy: the Slurm placement model on sampled arrivals. Pure.

Pods are drawn from the demand model itself (each request class as many times
as it was seen), arrive in a seeded random order as in the paper's harness,
and are routed through the product's submission decision onto the candidate's
cluster; the score is the paper's metric (placed GPU demand over the cluster's
GPUs, %) when the arrived demand reaches 100 % of the cluster. The seeds are
not the benchmark's (42-51), so a plan is not tuned to the arrivals it is
measured on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..policy import build_site
from ..sim.arrivals import arrival_sequence
from .demand import Demand
from .frompolicy import SubmitRouter, sim_cluster
from ..sim.cluster import Pod
from ..sim.slurmmodel import SlurmPolicy

SEEDS = (7,)


def demand_pods(demand: Demand) -> tuple[Pod, ...]:
    """One pod per job of the demand model (names make the order reproducible)."""
    pods = []
    for k, (cls, n) in enumerate(sorted(demand.counts.items())):
        for j in range(n):
            pods.append(Pod(f"c{k:05d}-{j:06d}", cls.cpus * 1000, cls.memory_mib, cls.num_gpu, cls.gpu_milli, cls.qos, cls.gpu_spec))
    return tuple(pods)


def packing_score(raw: dict, pods: Sequence[Pod], seeds: Sequence[int] = SEEDS, percent: int = 100) -> float:
    """Mean placed GPU share (%) at ``percent`` arrived, over ``seeds``, for the policy mapping ``raw``."""
    site = build_site(raw, "candidate")
    cluster = sim_cluster(site)
    router = SubmitRouter(site)
    pods = tuple(pods)
    demand = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)
    out = []
    for seed in seeds:
        arrivals = arrival_sequence(pods, cluster.gpu_count, seed)
        policy = SlurmPolicy("candidate", router)
        policy.start(cluster, pods, np.random.default_rng([seed, 1]))
        limit = percent * arrivals.capacity_milli / 100
        arrived = placed = 0
        for pod in arrivals.order.tolist():
            arrived += int(demand[pod])
            if policy.place(pod):
                placed += int(demand[pod])
            if arrived >= limit:
                break
        out.append(100.0 * placed / arrivals.capacity_milli)
    return float(np.mean(out))


class Evaluator:
    """``plan(evaluate=...)`` for one demand: ``evaluator(raw)`` scores one policy mapping; ``many`` scores several,
    in ``workers`` forked processes at once when there are several (each score is the same as one by one)."""

    def __init__(self, demand: Demand, seeds: Sequence[int] = SEEDS, workers: int = 1):
        self.pods, self.seeds, self.workers = demand_pods(demand), tuple(seeds), max(1, workers)

    def __call__(self, raw: dict) -> float:
        return packing_score(raw, self.pods, self.seeds)

    def many(self, raws: Sequence[dict]) -> list[float]:
        import multiprocessing

        if self.workers == 1 or len(raws) < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return [self(raw) for raw in raws]
        global _FORKED
        _FORKED = self  # the workers inherit it: the pods are not pickled for each policy
        try:
            with multiprocessing.get_context("fork").Pool(min(self.workers, len(raws))) as pool:
                return pool.map(_score_forked, raws, chunksize=1)
        finally:
            _FORKED = None


_FORKED: Evaluator | None = None


def _score_forked(raw: dict) -> float:
    return _FORKED(raw)


def evaluator(demand: Demand, seeds: Sequence[int] = SEEDS, workers: int = 1) -> Evaluator:
    """``plan(evaluate=...)`` for this demand; ``workers``: processes that score candidates side by side."""
    return Evaluator(demand, seeds, workers)
