"""The MIG catalogue as the live planner uses it: the site's MIG types, every maximal layout of a GPU model,
and what a node's GRES start of the pending jobs."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from ..hardware import GpuModel, check_layout
from ..hardware.packing import plain_profiles
from ..policy import Site
from .view import PendingJob


def mig_types(site: Site) -> dict[str, tuple[GpuModel, str]]:
    """'gpu:<slurm type>' of every MIG profile of the site's MIG-capable models -> (model, profile)."""
    out: dict[str, tuple[GpuModel, str]] = {}
    for group in site.groups:
        if group.model.mig_capable:
            for p in group.model.mig_profiles:
                out[f"gpu:{group.model.mig_slurm_type(p.name)}"] = (group.model, p.name)
    return out


@lru_cache(maxsize=16)
def candidate_layouts(model: GpuModel) -> tuple[tuple[str, ...], ...]:
    """Every layout of plain profiles the catalogue places on ``model`` to which no further instance fits,
    largest profiles first in each."""
    order = [p.name for p in reversed(plain_profiles(model))]
    found: set[tuple[str, ...]] = set()

    def grow(layout: list[str], start: int) -> None:
        extended = False
        for i in range(start, len(order)):
            if not check_layout(model, layout + [order[i]]):
                extended = True
                grow(layout + [order[i]], i)
        if not extended and layout and all(check_layout(model, layout + [n]) for n in order):
            found.add(tuple(layout))

    grow([], 0)
    return tuple(sorted(found, key=lambda lay: (len(lay), lay)))


@lru_cache(maxsize=16)
def candidates(model: GpuModel) -> tuple[tuple[tuple[str, ...], Counter, Counter], ...]:
    """(layout, profiles counted, 'gpu:<type>' counted) of every candidate layout of the model."""
    return tuple(
        (lay, Counter(lay), Counter(f"gpu:{model.mig_slurm_type(p)}" for p in lay)) for lay in candidate_layouts(model)
    )


def node_caps(site: Site, name: str) -> Counter:
    """The node's GPU GRES by the policy: 'gpu:<type>' -> count."""
    group = site.group_for_node(name)
    return Counter({f"{n}:{t}": c for (n, t), c in group.gres.items() if n == "gpu"})


def serve(caps: Counter, jobs: list[PendingJob]) -> list[PendingJob]:
    """The jobs (in the order given: priority) that start on an empty node with these GRES counts."""
    left, out = Counter(caps), []
    for job in jobs:
        if left[job.gres] >= job.count:
            left[job.gres] -= job.count
            out.append(job)
    return out


def serve_type(cap: int, jobs: list[PendingJob]) -> list[PendingJob]:
    """``serve`` for jobs of one type on ``cap`` instances of it."""
    out = []
    for job in jobs:
        if cap <= 0:
            break
        if job.count <= cap:
            cap -= job.count
            out.append(job)
    return out
