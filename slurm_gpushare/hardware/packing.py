"""MIG profiles for shares of a GPU and layouts for a demand of slices: which profile covers a share, which is
the whole GPU's, and how few GPUs hold the slices. Pure.

Catalogue facts that the static planner (``planner/``) and the live planner's simulator (``live/``) both use.
"""

from __future__ import annotations

import functools
from collections import Counter

from .layout import check_layout
from .model import GpuModel, MigProfile

GPU_MILLI = 1000  # one whole GPU in thousandths, as the trace (and the planner's demand) counts a share


def plain_profiles(model: GpuModel):
    """Profiles without '+me', smallest share first (ties: fewer compute, then memory slices)."""
    plain = [p for p in model.mig_profiles if not p.media_extensions]
    return sorted(plain, key=lambda p: (p.fraction(model), p.compute_slices, p.memory_slices, p.name))


def covering(model: GpuModel, milli: int, allowed: tuple[str, ...] = ()) -> str | None:
    """The smallest profile whose share of the GPU covers ``milli``/1000 of it (None: the model has no MIG).

    Share is ``MigProfile.fraction`` (the larger of the compute and memory
    shares), as billing and the submission rounding count it; the share is
    first written as the whole percent a user asks for (``mps:ceil(milli/10)``),
    as the submission rounding sees it. A share above every partial profile
    gets the whole-GPU profile (7g on an A100). ``allowed`` (profile names):
    only these partial profiles are offered (the whole-GPU one always is).
    """
    pct = -(-milli * 100 // GPU_MILLI)  # the mps percent a user asks for: ceil
    for p in offered(model, allowed):
        if int(p.fraction(model) * 100 + 1e-9) >= pct:
            return p.name
    return None


def compact_types(model: GpuModel) -> tuple[str, ...]:
    """One slice type per compute size, the one with the least memory (A100-40GB: 1g.5gb, 2g.10gb, 3g.20gb,
    4g.20gb, 7g.40gb; not 1g.10gb). A memory-heavy slice strands compute: four 1g.10gb take all 8 memory
    slices of an A100 and leave 3 of its 7 compute slices idle, where a share they cover on a 2g.10gb (the
    same memory) packs beside a 3g.20gb with every compute slice in use."""
    best: dict[int, MigProfile] = {}
    for p in plain_profiles(model):
        cur = best.get(p.compute_slices)
        if cur is None or (p.memory_slices, p.name) < (cur.memory_slices, cur.name):
            best[p.compute_slices] = p
    return tuple(best[c].name for c in sorted(best))


def whole_profile(model: GpuModel) -> MigProfile | None:
    """The plain profile that takes the whole GPU, the one with the least memory (7g.40gb on an A100-40GB); None
    for a model without MIG."""
    whole = [p for p in model.mig_profiles if not p.media_extensions and p.fraction(model) >= 1]
    return min(whole, key=lambda p: (p.memory_mib, p.name)) if whole else None


def offered(model: GpuModel, allowed: tuple[str, ...] = ()):
    """``plain_profiles`` limited to ``allowed`` (every one when empty); the whole-GPU profile is always offered."""
    plain = plain_profiles(model)
    if not allowed:
        return plain
    return [p for p in plain if p.name in allowed or p.compute_slices == model.compute_slices]


def pack(model: GpuModel, need: Counter, allowed: tuple[str, ...] = (), fill: bool = False) -> list[tuple[str, ...]]:
    """See ``_pack_greedy`` (``fill``: ``_pack_fill``); the candidates of one plan often ask the same slices:
    packed once (layouts are immutable)."""
    return list(_pack(model, tuple(sorted((k, v) for k, v in need.items() if v > 0)), tuple(allowed), fill))


@functools.lru_cache(maxsize=32)
def _pack(
    model: GpuModel, need: tuple[tuple[str, int], ...], allowed: tuple[str, ...] = (), fill: bool = False
) -> tuple[tuple[str, ...], ...]:
    return tuple((_pack_fill if fill else _pack_greedy)(model, Counter(dict(need)), allowed))


def _pack_fill(model: GpuModel, need: Counter, allowed: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Like ``_pack_greedy``, but each GPU, after the largest profile still needed, takes the mix of needed
    profiles that uses the most of its compute slices, then of its memory slices (larger profiles first among
    equals): a 3g.20gb with two 2g.10gb (7 of 7 compute slices) before two 3g.20gb (6 of 7), so the slices a
    layout cannot use are fewer, and so are the GPUs when small slices fill what large ones leave."""
    left = Counter({k: v for k, v in need.items() if v > 0})
    order = [p.name for p in reversed(offered(model, allowed))]
    size = {p.name: (p.compute_slices, p.memory_slices) for p in model.mig_profiles}
    best_of: dict[tuple, tuple[str, ...]] = {}

    def best(layout: tuple[str, ...], avail: tuple[int, ...], start: int) -> tuple[tuple, tuple[str, ...]]:
        score = (
            sum(size[n][0] for n in layout),
            sum(size[n][1] for n in layout),
            tuple(-order.index(n) for n in layout),
        )
        top = (score, layout)
        for k in range(start, len(order)):
            if avail[k] and _layout_ok(model, (*layout, order[k])):
                got = best(layout + (order[k],), avail[:k] + (avail[k] - 1,) + avail[k + 1 :], k)
                if got[0][:2] > top[0][:2] or got[0][:2] == top[0][:2] and got[0][2] > top[0][2]:
                    top = got
        return top

    gpus: list[tuple[str, ...]] = []
    while sum(left.values()) > 0:
        first = next(n for n in order if left[n] > 0)
        left[first] -= 1
        avail = tuple(min(left[n], model.compute_slices) for n in order)
        key = (first, avail)
        if key not in best_of:
            best_of[key] = best((first,), avail, order.index(first))[1]
        layout = list(best_of[key])
        for name in layout[1:]:
            left[name] -= 1
        for name in reversed(order[1:]):  # top up as _pack_greedy does
            while _layout_ok(model, (*layout, name)):
                layout.append(name)
        gpus.append(tuple(layout))
    return gpus


_CHECKED: dict[int, tuple[GpuModel, dict[tuple[str, ...], bool]]] = {}  # id(model) -> (model, {layout: ok})


def _layout_ok(model: GpuModel, layout: tuple[str, ...]) -> bool:
    """``check_layout`` finds nothing wrong (packing asks the same layouts again and again: checked once each).

    Keyed by the model object's identity, which the entry keeps alive (hashing a model's fields on every call
    would cost more than the check); a few models at most are kept.
    """
    entry = _CHECKED.get(id(model))
    if entry is None:
        if len(_CHECKED) >= 8:
            _CHECKED.clear()
        entry = _CHECKED[id(model)] = (model, {})
    seen = entry[1]
    ok = seen.get(layout)
    if ok is None:
        ok = seen[layout] = not check_layout(model, list(layout))
    return ok


def _pack_greedy(model: GpuModel, need: Counter, allowed: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """GPU layouts (one tuple of profiles per GPU) holding at least ``need`` slices of each profile.

    Greedy, largest slices first: each GPU takes the largest profile still
    needed, then as many more needed profiles as still fit (checked against
    the catalogue's placement rules), then is topped up with the smallest
    profile, so no slice of a GPU is left without an instance. With
    ``allowed``, only those profiles (and the whole-GPU one) top a GPU up: a
    type the layouts hold is a type the submission may round a share to.
    """
    left = Counter({k: v for k, v in need.items() if v > 0})
    order = [p.name for p in reversed(offered(model, allowed))]
    gpus: list[tuple[str, ...]] = []
    while sum(left.values()) > 0:
        layout: list[str] = []
        for name in order:
            while left[name] > 0 and _layout_ok(model, (*layout, name)):
                layout.append(name)
                left[name] -= 1
        for name in reversed(order[1:]):  # top up (never with a whole-GPU slice): smallest first, so spares are many
            while _layout_ok(model, (*layout, name)):
                layout.append(name)
        gpus.append(tuple(layout))
    return gpus
