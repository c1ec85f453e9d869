"""MIG layouts for a demand of slices: which profile covers a share, and how few GPUs hold the slices. Pure."""

from __future__ import annotations

import functools
from collections import Counter

from ..hardware import GpuModel, check_layout
from .simcluster import GPU_MILLI


def plain_profiles(model: GpuModel):
    """Profiles without '+me', smallest share first (ties: fewer compute, then memory slices)."""
    plain = [p for p in model.mig_profiles if not p.media_extensions]
    return sorted(plain, key=lambda p: (p.fraction(model), p.compute_slices, p.memory_slices, p.name))


def covering(model: GpuModel, milli: int) -> str | None:
    """The smallest profile whose share of the GPU covers ``milli``/1000 of it (None: the model has no MIG).

    Share is ``MigProfile.fraction`` (the larger of the compute and memory
    shares), as billing and the submission rounding count it; the share is
    first written as the whole percent a user asks for (``mps:ceil(milli/10)``),
    as the submission rounding sees it. A share above every partial profile
    gets the whole-GPU profile (7g on an A100).
    """
    pct = -(-milli * 100 // GPU_MILLI)  # the mps percent a user asks for: ceil
    for p in plain_profiles(model):
        if int(p.fraction(model) * 100 + 1e-9) >= pct:
            return p.name
    return None


def pack(model: GpuModel, need: Counter) -> list[tuple[str, ...]]:
    """See ``_pack_greedy``; the candidates of one plan often ask the same slices: packed once (layouts are immutable)."""
    return list(_pack(model, tuple(sorted((k, v) for k, v in need.items() if v > 0))))


@functools.lru_cache(maxsize=32)
def _pack(model: GpuModel, need: tuple[tuple[str, int], ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(_pack_greedy(model, Counter(dict(need))))


def _pack_greedy(model: GpuModel, need: Counter) -> list[tuple[str, ...]]:
    """GPU layouts (one tuple of profiles per GPU) holding at least ``need`` slices of each profile.

    Greedy, largest slices first: each GPU takes the largest profile still
    needed, then as many more needed profiles as still fit (checked against
    the catalogue's placement rules), then is topped up with the smallest
    profile, so no slice of a GPU is left without an instance.
    """
    left = Counter({k: v for k, v in need.items() if v > 0})
    order = [p.name for p in reversed(plain_profiles(model))]
    gpus: list[tuple[str, ...]] = []
    while sum(left.values()) > 0:
        layout: list[str] = []
        for name in order:
            while left[name] > 0 and not check_layout(model, layout + [name]):
                layout.append(name)
                left[name] -= 1
        for name in reversed(order[1:]):  # top up (never with a whole-GPU slice): smallest first, so spares are many
            while not check_layout(model, layout + [name]):
                layout.append(name)
        gpus.append(tuple(layout))
    return gpus


def slices_needed(model: GpuModel, fractions: dict[int, int], whole_slice: bool = True) -> tuple[Counter, int]:
    """(slices per profile, jobs left to whole GPUs) for {milli: jobs}.

    ``whole_slice``: a share only the whole-GPU profile covers gets that slice
    (isolation); otherwise it is left to a whole GPU (and counted apart).
    """
    need: Counter = Counter()
    whole = 0
    for milli, n in fractions.items():
        name = covering(model, milli)
        if name is None or (not whole_slice and model.profile(name).compute_slices == model.compute_slices):
            whole += n
        else:
            need[name] += n
    return need, whole
