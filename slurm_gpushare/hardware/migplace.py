"""Per-job MIG placement on one GPU: where a new GPU instance may go, where it should go, and on which GPU.

Per-job MIG (issue 35) creates one GPU instance per job beside the instances of
running jobs, which cannot move. An instance is (profile name, memory-slice
start), as ``layout.Placement`` writes its entries; it occupies the memory
slices [start, start + memory_slices) of the catalogue's profile, and a start is
legal only where the catalogue's placement table (``MigProfile.placements``,
NVML's ``nvmlDeviceGetGpuInstancePossiblePlacements``) lists it. Two instances
may not share a memory slice, a profile may not exceed its ``max_instances``
(the '+me' profiles: one per GPU), and the compute slices may not exceed the
GPU's: the same rules as ``layout.check_layout``, applied one instance at a time.

Where a new instance goes (``choose``): an idle instance of the same profile is
reused first when the caller keeps idle instances; otherwise, among the legal
starts, by the rule:

- ``LARGEST_FIRST`` (the default, ``DEFAULT_RULE``): the start that keeps the
  most legal placements of the largest allowed profiles, then of the next size
  down, and so on (the placements left, summed per memory size, compared
  largest size first), then the lowest start. A lone small instance goes
  where it blocks no start of a half-GPU or whole-GPU profile when it can (on
  an A100 a 1g.5gb at slice 6, not at 0, the only start of 4g.20gb and
  7g.40gb), and small instances gather in the same aligned block;
- ``LEAST_BLOCKING``: the largest run of free memory slices left, then the
  most legal placements of every allowed profile (one revision of HAMi's PR
  #2855 scores so); ``MOST_PLACEMENTS``: those two the other way round;
- ``MOST_COMPLETIONS``: the most multisets of allowed profiles that could still
  be added beside the instances (``completions``: those that fit an empty GPU
  and so pass exact carrier weights, less those stranded by where the
  instances sit), then as least-blocking;
- ``FIRST``: the lowest legal start.

bench/RESULTS.md ("Per-job MIG placement rules") compares them. When only
idle instances are in the way, the fewest of them are destroyed. ``pick_gpu``
is for the case where the GPU is not forced by Slurm's own pick. Pure
functions of the catalogue: no NVML, no Slurm.
"""

from __future__ import annotations

from functools import lru_cache

from ..records import record
from .data import CATALOGUE
from .model import GpuModel, MigProfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

Instance = tuple[str, int]

FIRST = "first"
LEAST_BLOCKING = "least-blocking"
MOST_PLACEMENTS = "most-placements"
MOST_COMPLETIONS = "most-completions"
LARGEST_FIRST = "largest-first"
RULES = (FIRST, LEAST_BLOCKING, MOST_PLACEMENTS, MOST_COMPLETIONS, LARGEST_FIRST)
DEFAULT_RULE = LARGEST_FIRST


@record
class Choice:
    """Where a job's instance goes on one GPU.

    ``reuse``: the idle instance of the job's profile at ``start`` is taken as
    it is (nothing created). ``destroy``: idle instances to destroy first, so
    that the new one fits at ``start``.
    """

    start: int
    reuse: bool = False
    destroy: tuple[Instance, ...] = ()


def occupancy(model: GpuModel, instances: Iterable[Instance]) -> int:
    """The memory slices the instances hold, as a bit mask (bit i: slice i).

    Raises ValueError where the instances could not exist together: an unknown
    profile (CatalogueError), a start the placement table does not list, or
    two instances sharing a slice.
    """
    mask = 0
    for name, start in instances:
        profile = model.profile(name)
        if start not in profile.placements:
            raise ValueError(f"{profile.name} cannot start at memory slice {start} on {model.name}")
        bits = _bits(profile, start)
        if mask & bits:
            raise ValueError(f"{profile.name} at {start} overlaps another instance on {model.name}")
        mask |= bits
    return mask


def legal_starts(model: GpuModel, profile_name: str, instances: Sequence[Instance]) -> tuple[int, ...]:
    """The starts, lowest first, at which one more ``profile_name`` instance could be created now."""
    profile = model.profile(profile_name)
    mask = occupancy(model, instances)
    names = [model.profile(name) for name, _ in instances]
    if names.count(profile) >= profile.max_instances:
        return ()
    if sum(p.compute_slices for p in names) + profile.compute_slices > model.compute_slices:
        return ()
    return tuple(s for s in profile.placements if not mask & _bits(profile, s))


def placeable(model: GpuModel, profile_name: str, instances: Sequence[Instance]) -> bool:
    """Whether one more ``profile_name`` instance has a legal placement beside ``instances``."""
    return bool(legal_starts(model, profile_name, instances))


def room(model: GpuModel, profile_name: str, instances: Sequence[Instance]) -> int:
    """How many more ``profile_name`` instances (that profile alone) could be made beside ``instances``.

    One profile's placements all have its size, so taking the lowest legal start each time is a largest set
    (interval scheduling); the instance and compute-slice limits only stop it sooner."""
    name, held, more = model.profile(profile_name).name, list(instances), 0
    while starts := legal_starts(model, name, held):
        held.append((name, starts[0]))
        more += 1
    return more


def largest_free_run(model: GpuModel, instances: Sequence[Instance]) -> int:
    """The longest run of consecutive memory slices no instance holds."""
    mask = occupancy(model, instances)
    best = run = 0
    for i in range(model.memory_slices):
        run = 0 if mask >> i & 1 else run + 1
        best = max(best, run)
    return best


def surviving_placements(model: GpuModel, instances: Sequence[Instance], allowed: Iterable[str]) -> int:
    """How many (profile, start) pairs of the allowed profiles are still legal beside ``instances``."""
    return sum(len(legal_starts(model, name, instances)) for name in allowed)


def completions(model: GpuModel, instances: Sequence[Instance], allowed: Iterable[str] | None = None) -> int:
    """How many multisets of the allowed profiles (the empty one included) could still be added beside
    ``instances`` where they are placed. Every start of the same new instance leaves the GPU the same multiset,
    so the start that keeps the most of them leaves the fewest multisets that fit an empty GPU (that exact carrier
    weights admit) without a placement here."""
    names = tuple(model.profile(n).name for n in allowed) if allowed is not None else _all(model)
    key = tuple(sorted(instances))
    if CATALOGUE.get(model.name) is model:
        return _completions_catalogued(model.name, key, names)
    return len(_added_multisets(model, key, names))


@lru_cache(maxsize=65_536)
def _completions_catalogued(model_name: str, instances: tuple[Instance, ...], names: tuple[str, ...]) -> int:
    return len(_added_multisets(CATALOGUE[model_name], instances, names))


def _added_multisets(model: GpuModel, instances: Sequence[Instance], names: tuple[str, ...]) -> set[tuple[int, ...]]:
    """Counts (in ``names`` order) of every set of instances that can be added: sets of (profile, start) pairs
    walked once each, in the pairs' order, on bit masks."""
    profiles = [model.profile(n) for n in names]
    pairs = [(i, _bits(p, s)) for i, p in enumerate(profiles) for s in p.placements]
    held = [model.profile(n) for n, _ in instances]
    room = [p.max_instances - held.count(p) for p in profiles]
    out: set[tuple[int, ...]] = set()
    counts = [0] * len(profiles)

    def walk(first: int, mask: int, compute: int) -> None:
        out.add(tuple(counts))
        for j in range(first, len(pairs)):
            i, bits = pairs[j]
            size = profiles[i].compute_slices
            if mask & bits or compute + size > model.compute_slices or counts[i] >= room[i]:
                continue
            counts[i] += 1
            walk(j + 1, mask | bits, compute + size)
            counts[i] -= 1

    walk(0, occupancy(model, instances), sum(p.compute_slices for p in held))
    return out


def choose(
    model: GpuModel,
    profile_name: str,
    instances: Sequence[Instance],
    *,
    idle: Sequence[Instance] = (),
    allowed: Sequence[str] | None = None,
    rule: str = DEFAULT_RULE,
) -> Choice | None:
    """Where a new ``profile_name`` instance goes beside ``instances`` (None: nowhere).

    ``instances`` are every instance on the GPU, ``idle`` those of them no job
    holds (kept for reuse; pass none to never reuse). ``allowed`` are the
    profiles the GPU's group allows (default: all the model's), whose legal
    placements (or completions) the rules other than ``FIRST`` keep.
    """
    profile = model.profile(profile_name)
    if rule not in RULES:
        raise ValueError(f"unknown placement rule {rule!r}; known rules: {', '.join(RULES)}")
    names = tuple(model.profile(n).name for n in allowed) if allowed is not None else _all(model)
    idle_set = _idle_subset(instances, idle)
    reusable = sorted(s for name, s in idle_set if model.profile(name) is profile)
    if reusable:
        return Choice(reusable[0], reuse=True)
    starts = legal_starts(model, profile.name, instances)
    if starts:
        return Choice(_best(model, profile.name, instances, starts, names, rule))
    if idle_set:
        return _making_room(model, profile, instances, idle_set, names, rule)
    return None


def pick_gpu(
    model: GpuModel,
    profile_name: str,
    gpus: Sequence[tuple[Sequence[Instance], Sequence[Instance]]],
    *,
    allowed: Sequence[str] | None = None,
    rule: str = DEFAULT_RULE,
) -> int | None:
    """Which of the candidate GPUs (index into ``gpus``, each (instances, idle)) takes the instance.

    For when Slurm's pick is not forced (the caller passes only the GPUs Slurm
    would accept). The GPU where an idle instance is reused first, then the one
    that destroys the fewest idle instances, then the one that loses the fewest
    legal placements of the allowed profiles (best fit; under ``LARGEST_FIRST``
    counted per memory size, the largest first), then the fullest, then the
    lowest index. None if no GPU has a placement.
    """
    names = tuple(model.profile(n).name for n in allowed) if allowed is not None else _all(model)
    best: tuple[tuple, int] | None = None
    for index, (instances, idle) in enumerate(gpus):
        choice = choose(model, profile_name, instances, idle=idle, allowed=names, rule=rule)
        if choice is None:
            continue
        after = _after(model, profile_name, instances, choice)
        loss = _lost(model, instances, after, names, rule)
        key = (0 if choice.reuse else 1, len(choice.destroy), loss, -_held(model, after), index)
        if best is None or key < best[0]:
            best = (key, index)
    return None if best is None else best[1]


def reachable_layouts(model: GpuModel, allowed: Sequence[str] | None = None) -> frozenset[tuple[Instance, ...]]:
    """Every set of instances (sorted tuples) reachable from an empty GPU by adding legal placements.

    Only instances of the allowed profiles (default: all the model's). Small:
    2,319 sets on an 8-slice GPU with every profile. Memoised for catalogue models.
    """
    names = tuple(model.profile(n).name for n in allowed) if allowed is not None else _all(model)
    if CATALOGUE.get(model.name) is model:
        return _reachable_catalogued(model.name, names)
    return _reachable(model, names)


@lru_cache(maxsize=256)
def _reachable_catalogued(model_name: str, names: tuple[str, ...]) -> frozenset[tuple[Instance, ...]]:
    return _reachable(CATALOGUE[model_name], names)


def _reachable(model: GpuModel, names: tuple[str, ...]) -> frozenset[tuple[Instance, ...]]:
    seen: set[tuple[Instance, ...]] = {()}
    frontier: list[tuple[Instance, ...]] = [()]
    while frontier:
        grown: list[tuple[Instance, ...]] = []
        for layout in frontier:
            for name in names:
                for start in legal_starts(model, name, layout):
                    nxt = tuple(sorted((*layout, (name, start))))
                    if nxt not in seen:
                        seen.add(nxt)
                        grown.append(nxt)
        frontier = grown
    return frozenset(seen)


def _bits(profile: MigProfile, start: int) -> int:
    return ((1 << profile.memory_slices) - 1) << start


def _all(model: GpuModel) -> tuple[str, ...]:
    return tuple(p.name for p in model.mig_profiles)


def _idle_subset(instances: Sequence[Instance], idle: Sequence[Instance]) -> tuple[Instance, ...]:
    stray = [i for i in idle if i not in instances]
    if stray:
        raise ValueError(f"idle instances {stray} are not among the GPU's instances")
    return tuple(idle)


def _best(
    model: GpuModel,
    name: str,
    instances: Sequence[Instance],
    starts: Iterable[int],
    allowed: tuple[str, ...],
    rule: str,
) -> int:
    """The start the rule prefers among legal ``starts``."""
    if rule == FIRST:
        return min(starts)
    return max(starts, key=lambda s: _score(model, [*instances, (name, s)], allowed, rule, s))


def _score(
    model: GpuModel, after: Sequence[Instance], allowed: tuple[str, ...], rule: str, start: int
) -> tuple[int, ...]:
    """Larger is better: the rule's figures (see ``choose``), then the lower start."""
    if rule == LARGEST_FIRST:
        return (*_placements_by_size(model, after, allowed), -start)
    run = largest_free_run(model, after)
    left = surviving_placements(model, after, allowed)
    if rule == MOST_COMPLETIONS:
        return (completions(model, after, allowed), run, left, -start)
    return (left, run, -start) if rule == MOST_PLACEMENTS else (run, left, -start)


def _placements_by_size(model: GpuModel, after: Sequence[Instance], allowed: tuple[str, ...]) -> tuple[int, ...]:
    """The legal placements left of the allowed profiles, summed per memory size, the largest size first."""
    sizes = sorted({model.profile(n).memory_slices for n in allowed}, reverse=True)
    left = {n: len(legal_starts(model, n, after)) for n in allowed}
    return tuple(sum(k for n, k in left.items() if model.profile(n).memory_slices == size) for size in sizes)


def _making_room(
    model: GpuModel,
    profile: MigProfile,
    instances: Sequence[Instance],
    idle: tuple[Instance, ...],
    allowed: tuple[str, ...],
    rule: str,
) -> Choice | None:
    """Place where the fewest idle instances must go; among equals, by the rule on the GPU after."""
    options: list[tuple[int, tuple[int, ...], Choice]] = []
    for start in profile.placements:
        bits = _bits(profile, start)
        doomed = tuple(i for i in idle if occupancy(model, [i]) & bits)
        kept = [i for i in instances if i not in doomed]
        if start not in legal_starts(model, profile.name, kept):
            continue
        score = (0, 0, -start) if rule == FIRST else _score(model, [*kept, (profile.name, start)], allowed, rule, start)
        options.append((-len(doomed), score, Choice(start, destroy=doomed)))
    if not options:
        return None
    return max(options, key=lambda o: (o[0], o[1]))[2]


def _lost(
    model: GpuModel, before: Sequence[Instance], after: Sequence[Instance], names: tuple[str, ...], rule: str
) -> tuple[int, ...]:
    """The legal placements the GPU loses: in all, or per memory size (largest first) under ``LARGEST_FIRST``."""
    if rule == LARGEST_FIRST:
        was, now = _placements_by_size(model, before, names), _placements_by_size(model, after, names)
        return tuple(a - b for a, b in zip(was, now, strict=True))
    return (surviving_placements(model, before, names) - surviving_placements(model, after, names),)


def _after(model: GpuModel, name: str, instances: Sequence[Instance], choice: Choice) -> list[Instance]:
    """The GPU's instances once the choice is carried out."""
    kept = [i for i in instances if i not in choice.destroy]
    return kept if choice.reuse else [*kept, (model.profile(name).name, choice.start)]


def _held(model: GpuModel, instances: Sequence[Instance]) -> int:
    return bin(occupancy(model, instances)).count("1")
