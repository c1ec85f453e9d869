"""The paper's arrival sequence for one seed, and the arrived-percentage bookkeeping. Pure.

What the FGD paper's simulator does (hkust-adsl/kubernetes-scheduler-simulator,
pkg/simulator/core.go ``Simulate`` and simulator.go ``SortClusterPods``,
``tuneUpPods``): sort the pods by name, shuffle them with the seed, then draw
pods uniformly with replacement from the name-sorted list and append them
until the next draw would push the arrived GPU demand past 130 % of the
cluster's GPUs. Each pod is tried once and never leaves.

One thing differs from the Go original: the random numbers. Go's math/rand
cannot be reproduced from Python, so the shuffle and the draws use
``numpy.random.default_rng(seed)``; the same seed gives the same arrivals to
every policy of one run, not the paper's exact sequence, so per-seed figures
compare with the published ones only in distribution. The rest is kept: a
trace larger than the target loses random arrivals (``tuneDownPods``), and the
stop rule keeps the original's quirk of testing the next pod's *per-GPU*
share (``gpu_milli``) against the target while adding its total
(``num_gpu x gpu_milli``). A pod list in which no pod asks for a GPU arrives
once, shuffled, with no resampled pods (the original refuses such a list: it
panics when the total GPU request is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cluster import GPU_MILLI, Pod

INFLATION = 1.3  # the paper's "tune" ratio: arrivals stop at 130 % of cluster GPU capacity


@dataclass(frozen=True)
class Arrivals:
    """One seed's arrivals: ``order`` indexes the pod tuple given to ``arrival_sequence``."""

    seed: int
    order: np.ndarray  # int64 pod indices, in arrival order
    capacity_milli: int  # cluster GPUs x 1000

    def __len__(self) -> int:
        return len(self.order)


def arrival_sequence(pods: tuple[Pod, ...], gpu_count: int, seed: int, inflation: float = INFLATION) -> Arrivals:
    """The shuffled trace followed by resampled pods up to ``inflation`` x the cluster's GPU capacity."""
    if not pods:
        raise ValueError("arrival_sequence needs at least one pod")
    if gpu_count <= 0:
        raise ValueError(f"arrival_sequence needs a cluster with GPUs, got {gpu_count}")
    rng = np.random.default_rng(seed)
    by_name = np.array(sorted(range(len(pods)), key=lambda i: pods[i].name), dtype=np.int64)
    shuffled = by_name[rng.permutation(len(by_name))]
    demand = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)
    per_gpu = np.array([p.gpu_milli for p in pods], dtype=np.int64)
    capacity = gpu_count * GPU_MILLI
    target = inflation * capacity
    total = int(demand.sum())
    extra: list[int] = []
    # no pod asks for a GPU: resampling adds no demand and would never reach the target; the trace arrives once
    if total < target and demand.any():
        while True:
            pick = int(by_name[rng.integers(len(by_name))])
            if total + per_gpu[pick] > target:
                break
            total += int(demand[pick])
            extra.append(pick)
    elif total > target:  # tuneDownPods: drop random arrivals until the demand fits the target
        kept = shuffled.tolist()
        while total > target:
            total -= int(demand[kept.pop(int(rng.integers(len(kept))))])
        shuffled = np.array(kept, dtype=np.int64)
    order = np.concatenate([shuffled, np.array(extra, dtype=np.int64)])
    return Arrivals(seed=seed, order=order, capacity_milli=capacity)


def percent_curve(arrived_milli: np.ndarray, used_milli: np.ndarray, capacity_milli: int, top: int = 130) -> np.ndarray:
    """Mean allocation ratio (%) per whole arrived percentage 0..top, as the published CSV has it.

    Inputs are the cumulative arrived demand and the placed demand recorded after
    every arrival. Like the paper's scripts (experiments/analysis/merge_alloc_discrete.py):
    each record's arrived share is rounded to a whole percent (half to even) and
    its allocation ratio to two decimals; a percentage's value is the mean of its
    records, or of the records within +-1 point when it has none, rounded to two
    decimals; NaN where even that window is empty.
    """
    arrived = np.round(arrived_milli / capacity_milli * 100.0, 0)
    alloc = np.round(used_milli / capacity_milli * 100.0, 2)
    curve = np.full(top + 1, np.nan)
    sums = np.bincount(arrived.astype(np.int64).clip(0, top + 2), weights=alloc, minlength=top + 3)
    counts = np.bincount(arrived.astype(np.int64).clip(0, top + 2), minlength=top + 3)
    for pct in range(top + 1):
        if counts[pct]:
            curve[pct] = round(sums[pct] / counts[pct], 2)
            continue
        lo, hi = max(pct - 1, 0), pct + 1
        n = counts[lo : hi + 1].sum()
        if n:
            curve[pct] = round(sums[lo : hi + 1].sum() / n, 2)
    return curve
