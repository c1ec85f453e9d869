"""Carrier weights for per-job MIG: integer weights per profile such that Slurm's per-GPU count admits exactly
the multisets of profiles that fit on one GPU together.

Slurm counts shared GRES per GPU only (``Name=shard File=/dev/nvidiaX Count=C``,
one GPU per request), so a job asking for profile p carries w(p) shards. The
weights are exact when, for every multiset M of the allowed profiles,
sum(w(p) for p in M) <= C exactly when M has a legal placement on one GPU
(``migplace.reachable_layouts``). Placeability is closed under taking fewer
instances and weights are positive, so it is enough that every placeable
multiset weighs at most C and every *boundary* multiset (a placeable one plus
one instance, not placeable) weighs more: any multiset that does not fit holds
a boundary one.

``exact_weights`` searches all integer weight vectors for the least C, up to a
bound. ``obstruction`` finds a proof that no weights exist at any C: two
placeable multisets whose sum is also the sum of two multisets that do not fit
(their weights would have to total at most 2C and more than 2C at once).
``largest_exact_subsets`` restricts the profiles until weights exist. The
counts do not see fragmentation: an admitted multiset fits on an empty GPU, not
necessarily beside instances already placed (bench/permig_churn.py measures that).

``unsafe_sequence`` and ``safe_weights`` are about that: weights are *safe* for
a placement rule when no order of arrivals and departures that the count
admits leaves an admitted slice without a legal start on its GPU (the rule
deterministic, each GPU on its own: whatever GPU Slurm picks). Raising a weight
admits fewer sequences, so safety only grows with the weights; ``safe_weights``
raises, from the exact weights, the weight of one profile of a shortest failing
sequence (the one that found no start, or the smallest that arrived before it)
until none fails, at each capacity from the exact one up, and keeps the vector
that admits the most placeable multisets: a safe vector, not always the best.
"""

from __future__ import annotations

from collections import deque
from itertools import combinations

from ..records import record
from .migplace import LEAST_BLOCKING, choose, reachable_layouts
from .model import GpuModel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

Counts = tuple[int, ...]

# The search stops here: 31 is the least exact capacity the reference sheet reports for an 8-slice GPU.
MAX_CAPACITY = 64


@record
class Weights:
    """Exact carrier weights for ``profiles`` on ``model``: profile i carries ``weights[i]`` of ``capacity``."""

    model: str
    profiles: tuple[str, ...]
    weights: tuple[int, ...]
    capacity: int

    def admits(self, counts: Counts) -> bool:
        """Whether Slurm's count takes this multiset (counts in ``profiles`` order) on one GPU."""
        return sum(w * n for w, n in zip(self.weights, counts, strict=True)) <= self.capacity

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.profiles, self.weights, strict=True))


@record
class Obstruction:
    """No weights at any capacity: ``fit[0] + fit[1] == unfit[0] + unfit[1]`` (counts in profile order)."""

    profiles: tuple[str, ...]
    fit: tuple[Counts, Counts]
    unfit: tuple[Counts, Counts]


def placeable_multisets(model: GpuModel, profiles: Sequence[str]) -> frozenset[Counts]:
    """Every multiset of ``profiles`` (counts in their order) that has a legal placement on one GPU."""
    names = _names(model, profiles)
    index = {name: i for i, name in enumerate(names)}
    out: set[Counts] = set()
    for layout in reachable_layouts(model, names):
        counts = [0] * len(names)
        for name, _start in layout:
            counts[index[name]] += 1
        out.add(tuple(counts))
    return frozenset(out)


def boundary_multisets(placeable: frozenset[Counts]) -> frozenset[Counts]:
    """The multisets that do not fit but lose that by dropping one instance: a placeable one plus one."""
    out = set()
    for counts in placeable:
        for i in range(len(counts)):
            grown = _plus(counts, i)
            if grown not in placeable:
                out.add(grown)
    return frozenset(out)


def exact_weights(model: GpuModel, profiles: Sequence[str], max_capacity: int = MAX_CAPACITY) -> Weights | None:
    """Weights and the least capacity C <= ``max_capacity`` that admit exactly the placeable multisets.

    Exhaustive: every C from 1 up, every weight vector in 1..C (pruned by the
    constraints that the weights chosen so far already break). Among the
    vectors at the least C, the first in order of the profiles' weights, smallest first.
    """
    names = _names(model, profiles)
    fit = placeable_multisets(model, names)
    unfit = boundary_multisets(fit)
    for capacity in range(1, max_capacity + 1):
        found = _search(capacity, sorted(fit), sorted(unfit), [])
        if found is not None:
            return Weights(model.name, names, tuple(found), capacity)
    return None


def obstruction(model: GpuModel, profiles: Sequence[str]) -> Obstruction | None:
    """Two placeable multisets whose sum splits into two that do not fit: no exact weights exist (None: none found)."""
    names = _names(model, profiles)
    fit = placeable_multisets(model, names)
    ordered = sorted(fit)
    for i, a in enumerate(ordered):
        for b in ordered[i:]:
            total = tuple(x + y for x, y in zip(a, b, strict=True))
            split = _unfit_split(total, fit)
            if split is not None:
                return Obstruction(names, (a, b), split)
    return None


def largest_exact_subsets(
    model: GpuModel, profiles: Sequence[str], max_capacity: int = MAX_CAPACITY
) -> tuple[Weights, ...]:
    """The largest subsets of ``profiles`` (all of one size, the largest that has any) with exact weights."""
    names = _names(model, profiles)
    for size in range(len(names), 0, -1):
        found = [w for subset in combinations(names, size) if (w := exact_weights(model, subset, max_capacity))]
        if found:
            return tuple(found)
    return ()


def multisets_within(bounds: Counts) -> Iterable[Counts]:
    """Every counts vector with counts[i] <= bounds[i], in lexicographic order."""
    if not bounds:
        yield ()
        return
    for first in range(bounds[0] + 1):
        for rest in multisets_within(bounds[1:]):
            yield (first, *rest)


def _names(model: GpuModel, profiles: Iterable[str]) -> tuple[str, ...]:
    names = tuple(model.profile(p).name for p in profiles)
    if len(set(names)) != len(names):
        raise ValueError(f"profiles named twice in {names}")
    return names


def _plus(counts: Counts, i: int) -> Counts:
    return counts[:i] + (counts[i] + 1,) + counts[i + 1 :]


def _search(capacity: int, fit: list[Counts], unfit: list[Counts], chosen: list[int]) -> list[int] | None:
    """Depth-first over weights 1..capacity, one profile at a time, pruned on every partial vector.

    A placeable multiset must weigh at most C even with every undecided weight
    at its least (1); a boundary one must weigh more than C with every
    undecided weight at its most (C).
    """
    n = len(fit[0]) if fit else 0
    if len(chosen) == n:
        return chosen
    for w in range(1, capacity + 1):
        trial = [*chosen, w]
        if _may_hold(capacity, fit, unfit, trial):
            found = _search(capacity, fit, unfit, trial)
            if found is not None:
                return found
    return None


def _may_hold(capacity: int, fit: list[Counts], unfit: list[Counts], trial: list[int]) -> bool:
    k = len(trial)
    for counts in fit:
        if sum(w * n for w, n in zip(trial, counts[:k], strict=True)) + sum(counts[k:]) > capacity:
            return False
    for counts in unfit:
        if sum(w * n for w, n in zip(trial, counts[:k], strict=True)) + capacity * sum(counts[k:]) <= capacity:
            return False
    return True


def _unfit_split(total: Counts, fit: frozenset[Counts]) -> tuple[Counts, Counts] | None:
    """Two multisets, neither placeable, that add up to ``total`` (None if there are none)."""
    for part in multisets_within(total):
        rest = tuple(t - p for t, p in zip(total, part, strict=True))
        if part <= rest and part not in fit and rest not in fit:
            return part, rest
    return None


def unsafe_sequence(model: GpuModel, weights: Weights, rule: str = LEAST_BLOCKING) -> tuple[str, ...] | None:
    """A shortest order of slice arrivals and departures ('+p', '-p') the count admits on one GPU whose last
    arrival has no legal start under ``rule`` (None: the weights are safe). Breadth-first over the GPU's
    reachable instance sets (at most a few thousand)."""
    w = weights.as_dict()
    start: tuple = ()
    seen: dict[tuple, tuple[str, ...]] = {start: ()}
    todo = deque([start])
    while todo:
        layout = todo.popleft()
        used = sum(w[name] for name, _ in layout)
        path = seen[layout]
        for name in weights.profiles:
            if used + w[name] > weights.capacity:
                continue
            got = choose(model, name, list(layout), allowed=weights.profiles, rule=rule)
            if got is None:
                return (*path, f"+{name}")
            _visit(tuple(sorted((*layout, (name, got.start)))), (*path, f"+{name}"), seen, todo)
        for i, (name, _) in enumerate(layout):
            _visit(layout[:i] + layout[i + 1 :], (*path, f"-{name}"), seen, todo)
    return None


def safe_weights(
    model: GpuModel, profiles: Sequence[str], rule: str = LEAST_BLOCKING, extra_capacity: int = 16
) -> tuple[Weights, int] | None:
    """Safe weights for ``profiles`` under ``rule`` and how many placeable multisets they admit (of
    ``len(placeable_multisets)``); None where the profiles have no exact weights to start from. Capacities from
    the exact one to ``extra_capacity`` above it; the first vector found at each, the best kept."""
    exact = exact_weights(model, profiles)
    if exact is None:
        return None
    fit = placeable_multisets(model, exact.profiles)
    best: tuple[Weights, int] | None = None
    for capacity in range(exact.capacity, exact.capacity + extra_capacity + 1):
        for blame in (_last, _smallest):
            trial = _raised(model, exact, capacity, rule, blame)
            admitted = sum(1 for counts in fit if trial.admits(counts))
            if best is None or admitted > best[1]:
                best = (trial, admitted)
    return best


def _raised(model: GpuModel, exact: Weights, capacity: int, rule: str, blame) -> Weights:
    """The exact weights at ``capacity``, the blamed profile of each failing sequence raised by one until safe."""
    vector = list(exact.weights)
    while True:
        trial = Weights(model.name, exact.profiles, tuple(vector), capacity)
        bad = unsafe_sequence(model, trial, rule)
        if bad is None:
            return trial
        vector[exact.profiles.index(blame(model, bad))] += 1


def _last(model: GpuModel, sequence: tuple[str, ...]) -> str:
    """The profile that found no start."""
    return sequence[-1][1:]


def _smallest(model: GpuModel, sequence: tuple[str, ...]) -> str:
    """The smallest profile (memory slices) that arrived: the fragment that blocked the last one."""
    arrived = [step[1:] for step in sequence if step[0] == "+"]
    return min(arrived, key=lambda name: (model.profile(name).memory_slices, arrived.index(name)))


def _visit(layout: tuple, path: tuple[str, ...], seen: dict, todo: deque) -> None:
    if layout not in seen:
        seen[layout] = path
        todo.append(layout)
