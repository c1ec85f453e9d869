"""MIG layouts: can these GPU instances share one GPU, and where does each go?

The suite decides placements itself instead of letting the driver pick: the
driver places instances greedily in creation order, and some valid layouts
fail in the wrong order (NVIDIA MIG User Guide, "Getting Started with MIG",
known issue: `-cgi 19,19,14,9` fails, `9,19,14,19` works). A small exact search over memory-slice starts answers
both "is it
valid" and "where", in an order that is also safe for drivers that choose
placements themselves (largest first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from .data import CATALOGUE
from .model import CatalogueError, GpuModel, MigProfile

Placement = tuple[tuple[str, int], ...]


def place_layout(model: GpuModel, profile_names: Sequence[str]) -> Placement | None:
    """(profile name, memory-slice start) for every instance, or None if they cannot coexist.

    Returned in creation order: larger profiles first, each at its lowest free
    start, equal profiles by ascending start. Deterministic, and memoised per
    (model, sorted profiles) because policies ask it once per GPU. Raises
    CatalogueError for a profile the model does not have.
    """
    names = _as_names(profile_names)
    if not names:
        return ()
    if not model.mig_capable:
        return None
    key = tuple(sorted(model.profile(n).name for n in names))
    if CATALOGUE.get(model.name) is model:
        return _place_catalogued(model.name, key)
    return _place(model, key)


def check_layout(model: GpuModel, profile_names: Sequence[str]) -> list[str]:
    """Every reason the layout cannot be applied to ``model`` ([] if it can), for people to read."""
    names = _as_names(profile_names)
    if not names:
        return []
    if not model.mig_capable:
        return [f"{model.name} does not support MIG, so the MIG layout {_join(names)} cannot be applied"]
    unknown = _unknown_reasons(model, names)
    if unknown:
        return unknown
    profiles = [model.profile(n) for n in names]
    reasons = _budget_reasons(model, profiles)
    if not reasons and place_layout(model, names) is None:
        reasons.append(f"no valid placement for {_join(p.name for p in profiles)} on {model.name}")
    return reasons


def _as_names(profile_names: Sequence[str]) -> tuple[str, ...]:
    """A bare string would be read as one profile per character: refuse it."""
    if isinstance(profile_names, str):
        raise TypeError(f"a MIG layout is a sequence of profile names, not the string {profile_names!r}")
    return tuple(profile_names)


def _join(names: Iterable[str]) -> str:
    return " + ".join(names)


def _unknown_reasons(model: GpuModel, names: tuple[str, ...]) -> list[str]:
    reasons = []
    for name in dict.fromkeys(names):
        try:
            model.profile(name)
        except CatalogueError as err:
            reasons.append(str(err))
    return reasons


def _budget_reasons(model: GpuModel, profiles: Sequence[MigProfile]) -> list[str]:
    """Limits that need no placement search: per-profile counts and slice totals."""
    reasons = [
        f"{count} x {p.name} exceeds its maximum of {p.max_instances} per GPU on {model.name}"
        for p, count in Counter(profiles).items()
        if count > p.max_instances
    ]
    layout = _join(p.name for p in profiles)
    for kind, total, available in (
        ("compute", sum(p.compute_slices for p in profiles), model.compute_slices),
        ("memory", sum(p.memory_slices for p in profiles), model.memory_slices),
    ):
        if total > available:
            reasons.append(f"{layout} needs {total} {kind} slices; {model.name} has {available}")
    return reasons


@lru_cache(maxsize=4096)
def _place_catalogued(model_name: str, key: tuple[str, ...]) -> Placement | None:
    """Memo for catalogue models; models built elsewhere (tests) are never cached by name."""
    return _place(CATALOGUE[model_name], key)


def _place(model: GpuModel, key: tuple[str, ...]) -> Placement | None:
    profiles = [model.profile(n) for n in key]
    if _budget_reasons(model, profiles):
        return None
    ordered = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    starts = _search(ordered, 0, [])
    if starts is None:
        return None
    return tuple((p.name, s) for p, s in zip(ordered, starts, strict=True))


def _search(ordered: list[MigProfile], used: int, starts: list[int]) -> list[int] | None:
    """Depth-first over starts, lowest first; ``used`` is a bit mask of taken memory slices.

    Equal profiles take ascending starts, so permutations of identical
    instances are not tried twice. At most 7 instances on 8 slices: tiny.
    """
    i = len(starts)
    if i == len(ordered):
        return starts
    profile = ordered[i]
    floor = starts[-1] + 1 if i and ordered[i - 1].name == profile.name else 0
    width = (1 << profile.memory_slices) - 1
    for start in profile.placements:
        mask = width << start
        if start >= floor and not used & mask:
            found = _search(ordered, used | mask, [*starts, start])
            if found is not None:
                return found
    return None
