"""The replay harness: one arrival sequence, one policy, the paper's metric. Pure.

Every policy (Slurm's placement for a rendered configuration, FGD, BestFit,
Random) implements ``Policy``: ``start`` builds its own state arrays for a
cluster and the pod list, ``place`` tries one pod once and says whether it was
placed (a pod that fits nowhere is dropped; nothing ever leaves). The harness
owns the metric, so every policy is measured the same way on the same
arrivals.

The metric is the one the FGD paper's simulator logs after every arrival
(pkg/simulator/analysis.go ``ClusterGpuFragReport``): placed GPU demand
(num_gpu x gpu_milli of every placed pod) over cluster GPUs x 1000, plotted
against arrived demand (the same sum over every pod that has arrived, placed
or not); ``percent_curve`` turns those records into the published per-percent
means.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .arrivals import Arrivals, percent_curve
from .cluster import Pod, SimCluster

PROBES = (100, 130)  # arrived percentages at which policies report their own figures (slice occupancy, ...)


class Policy(Protocol):
    """A placement policy under test. ``name`` labels its results."""

    name: str

    def start(self, cluster: SimCluster, pods: tuple[Pod, ...], rng: np.random.Generator) -> None:
        """Build fresh state for ``cluster``; ``rng`` is the only randomness it may use (ties)."""

    def place(self, pod: int) -> bool:
        """Try pod index ``pod`` once; update state and return True if placed."""

    def metrics(self) -> dict[str, float]:
        """Figures of the current state beyond the paper's metric (may be empty)."""


@dataclass
class Result:
    """One policy on one seed: the per-percent curve and what the bench prints."""

    policy: str
    seed: int
    curve: np.ndarray  # mean allocation ratio (%) at arrived 0..130
    arrivals: int
    placed: int
    seconds: float
    probes: dict[int, dict[str, float]] = field(default_factory=dict)

    def at(self, percent: int) -> float:
        return float(self.curve[percent])


def replay(policy: Policy, cluster: SimCluster, pods: tuple[Pod, ...], arrivals: Arrivals) -> Result:
    """Run every arrival through ``policy`` and record the paper's metric after each one."""
    demand = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)
    rng = np.random.default_rng([arrivals.seed, 1])  # a stream of its own: ties never shift the arrivals
    began = time.perf_counter()
    policy.start(cluster, pods, rng)
    n = len(arrivals.order)
    arrived = np.cumsum(demand[arrivals.order])
    used = np.zeros(n, dtype=np.int64)
    probes: dict[int, dict[str, float]] = {}
    pending = list(PROBES)
    total, placed = 0, 0
    for k, pod in enumerate(arrivals.order.tolist()):
        if policy.place(pod):
            total += int(demand[pod])
            placed += 1
        used[k] = total
        while pending and arrived[k] * 100 >= pending[0] * arrivals.capacity_milli:
            probes[pending.pop(0)] = {"allocated": 100.0 * total / arrivals.capacity_milli, **policy.metrics()}
    for pct in pending:  # the run ended below this percentage: report the final state
        probes[pct] = {"allocated": 100.0 * total / arrivals.capacity_milli, **policy.metrics()}
    seconds = time.perf_counter() - began
    curve = percent_curve(arrived, used, arrivals.capacity_milli)
    return Result(policy.name, arrivals.seed, curve, n, placed, seconds, probes)
