"""Per-job MIG sharing entries (``mode: mig`` with ``per_job: true``): the profiles a GPU range allows and the
carrier weights Slurm counts them with.

A per-job GPU is declared to Slurm as the whole GPU (``gpu``, typed as the
model) with ``capacity`` shards; a job asking for a slice of profile p is
given ``shard:<weight of p>`` by the submission filter. The weights come from
``hardware.migweights`` and are exact: Slurm's per-GPU count admits exactly
the sets of profiles that have a legal placement on an empty GPU; or, where the
entry gives ``carrier_weights``, the site's own (``given_weights``: at the exact
capacity, distinct, admitting only sets that fit on an empty GPU). A profile
set without exact weights is refused, naming the largest subsets that have
them. The search is exhaustive, so results are cached per model and set, and
a set is first tested for an obstruction (a quick proof that no weights exist).
"""

from __future__ import annotations

from functools import cache
from itertools import combinations

from ..errors import Problem
from ..hardware import CatalogueError, GpuModel, models
from ..hardware.migweights import Weights, boundary_multisets, exact_weights, obstruction, placeable_multisets
from ..slurmversion import SlurmVersion
from .model import Policy, Sharing
from .share import NAMESPACE, NO_ISOLATION, REQUEUE, Share

# The first release whose job_container/tmpfs runs a script in each job's new mount namespace (CloneNSScript,
# Slurm commit e6a24f1c31), which isolation: namespace needs; 25.11 renamed the plugin namespace/tmpfs.
CLONE_NS_SCRIPT = SlurmVersion(24, 11)
NAMESPACE_TMPFS = SlurmVersion(25, 11)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .site import GpuSlot, Group


@cache
def carrier_weights(model: GpuModel, profiles: tuple[str, ...]) -> Weights | None:
    """Exact weights for these profiles (catalogue names) on ``model``; None where none exist."""
    if obstruction(model, profiles) is not None:
        return None
    return exact_weights(model, profiles)


@cache
def largest_subsets(model: GpuModel, profiles: tuple[str, ...], first_only: bool = False) -> tuple[Weights, ...]:
    """The largest subsets of ``profiles`` with exact weights (all of one size; ``first_only``: the first found,
    subsets without media-extension profiles tried first)."""
    ordered = sorted(profiles, key=lambda p: (model.profile(p).media_extensions, profiles.index(p)))
    for size in range(len(profiles), 0, -1):
        found = []
        for subset in combinations(ordered, size):
            weights = carrier_weights(model, tuple(p for p in profiles if p in subset))
            if weights is not None:
                if first_only:
                    return (weights,)
                found.append(weights)
        if found:
            return tuple(found)
    return ()


def default_weights(model: GpuModel) -> Weights | None:
    """The default profile set of a per-job range: a largest exactly-weighted subset of the model's profiles."""
    found = largest_subsets(model, tuple(p.name for p in model.mig_profiles), first_only=True)
    return found[0] if found else None


def resolve(
    sharing: Sharing, path: str, model: GpuModel, share: Share, problems: list[Problem], version: SlurmVersion
) -> Share | None:
    """A per-job MIG entry as a share with its profiles, weights and isolation; None (and problems) where it is
    wrong."""
    if not model.mig_capable:
        mig = ", ".join(m.name for m in models() if m.mig_capable)
        problems.append(Problem(f"{path}.per_job", f"{model.name} does not support MIG; MIG models: {mig}"))
        return None
    if sharing.layout is not None:
        problems.append(
            Problem(
                f"{path}.layout",
                "a per-job range has no fixed layout: list the profiles jobs may ask for under profiles, "
                "or drop per_job for a fixed layout",
            )
        )
        return None
    weights = _weights(sharing.profiles, f"{path}.profiles", model, problems)
    if weights is not None and sharing.carrier_weights is not None:
        weights = given_weights(sharing.carrier_weights, f"{path}.carrier_weights", model, weights, problems)
    isolation = _isolation(sharing.isolation, f"{path}.isolation", version, problems)
    if weights is None or isolation is None:
        return None
    return Share(
        share.mode,
        per_job=True,
        profiles=weights.profiles,
        weights=weights.weights,
        capacity=weights.capacity,
        tuned=sharing.carrier_weights is not None,
        on_slice_failure=sharing.on_slice_failure or REQUEUE,
        isolation=isolation,
    )


def _isolation(given: str | None, path: str, version: SlurmVersion, problems: list[Problem]) -> str | None:
    """The entry's isolation: as given, else namespace where the Slurm version can have it; None (and a problem)
    for namespace on a release without a script in the job's namespace."""
    if given is None:
        return NAMESPACE if version >= CLONE_NS_SCRIPT else NO_ISOLATION
    if given == NAMESPACE and version < CLONE_NS_SCRIPT:
        problems.append(
            Problem(
                path,
                f"namespace needs Slurm {CLONE_NS_SCRIPT} or newer (job_container/tmpfs CloneNSScript runs "
                f"gpushare-ns-caps in each job's mount namespace); Slurm {version} has no such hook, so per-job MIG "
                "jobs there can open their neighbours' instances. Upgrade Slurm, or set isolation: none to accept that",
            )
        )
        return None
    return given


def _weights(profiles: list[str] | None, path: str, model: GpuModel, problems: list[Problem]) -> Weights | None:
    if profiles is None:
        found = default_weights(model)
        if found is None:
            problems.append(Problem(path, f"no set of {model.name}'s MIG profiles has exact carrier weights"))
        return found
    try:
        names = tuple(model.profile(p).name for p in profiles)
    except CatalogueError as exc:
        problems.append(Problem(path, str(exc)))
        return None
    if not names or len(set(names)) != len(names):
        problems.append(Problem(path, f"{list(profiles)}: name each allowed profile once, at least one"))
        return None
    found = carrier_weights(model, names)
    if found is None:
        problems.append(Problem(path, _no_weights(model, names)))
    return found


def given_weights(
    given: Mapping[str, int], path: str, model: GpuModel, exact: Weights, problems: list[Problem]
) -> Weights | None:
    """A policy's ``carrier_weights`` for the profiles of ``exact``, at its capacity; None (and problems) where a
    profile is unknown, missing or extra, a weight is not in 1..capacity, two profiles share one, or the weights
    admit a set of slices that does not fit on an empty GPU."""
    allowed = ", ".join(exact.profiles)
    named: dict[str, int] = {}
    for key, weight in given.items():
        try:
            name = model.profile(key).name
        except CatalogueError as exc:
            problems.append(Problem(f"{path}.{key}", f"{exc}; give a weight for each of: {allowed}"))
            return None
        if name in named:
            problems.append(Problem(f"{path}.{key}", f"{name} is given twice (as {key} and an alias)"))
            return None
        named[name] = weight
    found = _missing_or_extra(named, exact.profiles) or _out_of_range(named, exact.capacity)
    found = found or _shared(named) or _unplaceable(model, named, exact)
    if found:
        problems.append(Problem(path, found))
        return None
    return Weights(model.name, exact.profiles, tuple(named[p] for p in exact.profiles), exact.capacity)


def _missing_or_extra(named: Mapping[str, int], profiles: tuple[str, ...]) -> str:
    missing = [p for p in profiles if p not in named]
    extra = [p for p in named if p not in profiles]
    if not missing and not extra:
        return ""
    parts = [f"no weight for {', '.join(missing)}"] if missing else []
    parts += [f"{', '.join(extra)} not among the allowed profiles"] if extra else []
    what = "; ".join(parts)
    return f"{what}: give one weight for each allowed profile ({', '.join(profiles)}), no other"


def _out_of_range(named: Mapping[str, int], capacity: int) -> str:
    bad = [f"{p}={w}" for p, w in named.items() if not 1 <= w <= capacity]
    return f"{', '.join(bad)}: a weight is a whole number from 1 to the shard Count per GPU ({capacity})" if bad else ""


def _shared(named: Mapping[str, int]) -> str:
    by_weight: dict[int, list[str]] = {}
    for p, w in named.items():
        by_weight.setdefault(w, []).append(p)
    same = [f"{' and '.join(ps)} both weigh {w}" for w, ps in sorted(by_weight.items()) if len(ps) > 1]
    return (
        f"{'; '.join(same)}: give each profile its own weight (a job's shard count names its profile to the "
        "node, billing and usage)"
        if same
        else ""
    )


def _unplaceable(model: GpuModel, named: Mapping[str, int], exact: Weights) -> str:
    """The lightest set of slices the weights admit that has no placement on an empty GPU ('' for none): every set
    that does not fit holds a boundary one, so the boundary sets are enough."""
    weights = [named[p] for p in exact.profiles]
    admitted = [
        (sum(w * n for w, n in zip(weights, counts, strict=True)), counts)
        for counts in _boundary(model, exact.profiles)
        if sum(w * n for w, n in zip(weights, counts, strict=True)) <= exact.capacity
    ]
    if not admitted:
        return ""
    weighs, counts = min(admitted)
    slices = " + ".join(f"{n} x {p}" for p, n in zip(exact.profiles, counts, strict=True) if n)
    exact_text = ", ".join(f"{p}={w}" for p, w in zip(exact.profiles, exact.weights, strict=True))
    return (
        f"these weights admit {slices} on one GPU (weighs {weighs} of {exact.capacity}), which does not fit on "
        f"{model.name}: raise a weight of that set so that it weighs more than {exact.capacity} (weights at or "
        f"above the exact ones, {exact_text}, always fit)"
    )


@cache
def _boundary(model: GpuModel, profiles: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(boundary_multisets(placeable_multisets(model, profiles))))


def _no_weights(model: GpuModel, names: tuple[str, ...]) -> str:
    accepted = "; ".join(f"[{', '.join(w.profiles)}]" for w in largest_subsets(model, names))
    return (
        f"[{', '.join(names)}] on {model.name} have no exact carrier weights: no shard count per GPU admits "
        f"exactly the sets of these profiles that fit on one GPU together, so Slurm would start jobs whose "
        f"slices cannot be placed. The largest subsets that have them: {accepted or '(none)'}"
    )


def check_group(slots: list[GpuSlot], path: str, problems: list[Problem]) -> None:
    """One node's per-job GPUs must carry with one meaning (a request's shard count is one profile on any of
    them), and no other GPU of the node may offer the carrier GRES (shards) or MPS (one shared GRES per node)."""
    per_job = [s for s in slots if s.share.is_per_job_mig]
    if not per_job:
        return
    carriers = {(s.share.profiles, s.share.weights, s.share.capacity) for s in per_job}
    if len(carriers) > 1:
        problems.append(
            Problem(
                path,
                "per-job MIG GPUs of one node group must allow the same profiles: a slice's shard count must mean "
                "the same profile on every GPU Slurm may pick; give them one profiles list or split the group",
            )
        )
    others = sorted({s.mode.value for s in slots if s.share.shared_gres and not s.share.is_per_job_mig})
    if others:
        problems.append(
            Problem(
                path,
                f"per-job MIG is carried by shards, so it cannot share a node with {'/'.join(others)} GPUs "
                "(Slurm would give their requests to the per-job GPUs and back); put them in separate node groups",
            )
        )


def check_tier(path: str, tier: str, members: tuple[Group, ...]) -> list[Problem]:
    """A tier's shard counts must mean one thing: per-job GPUs of one carrier, no time-sliced GPUs beside them,
    and no fixed MIG slice of a type its per-job GPUs also make (the filter could not tell which is meant)."""
    per_job = [s for g in members for s in g.gpus if s.share.is_per_job_mig]
    if not per_job:
        return []
    problems = []
    carriers = {(s.model.name, s.share.weights, s.share.profiles) for s in per_job}
    if len(carriers) > 1:
        problems.append(
            f"its per-job MIG GPUs differ in model or profiles ({', '.join(sorted({c[0] for c in carriers}))}), and "
            "a slice's shard count must mean one profile on any GPU Slurm picks: one model and profiles list per tier"
        )
    shard = [g.name for g in members if any(s.mode.value == "shard" for s in g.gpus)]
    if shard:
        problems.append(
            f"it has per-job MIG GPUs (carried by shards) and time-sliced GPUs ({', '.join(shard)}): a shard request "
            "could land on either; give them separate tiers"
        )
    fixed = sorted({t for g in members for s in g.gpus if s.share.is_mig for t in s.mig_types()})
    both = sorted(set(fixed) & {t for s in per_job for t in s.slice_types()})
    if both:
        problems.append(
            f"{', '.join(both)} would be both fixed and per-job MIG slices here: give the fixed and per-job groups "
            "separate tiers (users ask the same way for both)"
        )
    return [Problem(f"{path}.node_groups", f"tier {tier!r}: {p}") for p in problems]


def missing_hooks(policy: Policy) -> list[str]:
    """The cluster.hooks keys per-job MIG needs that the policy leaves unset."""
    hooks = policy.cluster.hooks
    missing = [k for k in ("prolog", "epilog", "task_prolog") if not getattr(hooks, k)]
    return missing + ([] if hooks.job_submit_lua else ["job_submit_lua"])


def ready(policy: Policy) -> bool:
    """Whether this site could run per-job MIG GPUs: the hooks and device cgroups they need are configured."""
    return not missing_hooks(policy) and policy.cluster.cgroups


def check_site(policy: Policy, groups: list[Group]) -> list[Problem]:
    """Per-job MIG needs the submission filter (it maps a slice to its shards and records the profile), the node
    hooks (they make, hand over and destroy the instance) and device cgroups (they keep a job to its GPU)."""
    if not any(s.share.is_per_job_mig for g in groups for s in g.gpus):
        return []
    cluster = policy.cluster
    missing = missing_hooks(policy)
    problems = [
        Problem(
            f"cluster.hooks.{key}",
            "required by per-job MIG: the submission filter maps a slice to its shards and records its profile, "
            "the prolog makes the instance, the task prolog hands it to the job, the epilog destroys it",
        )
        for key in missing
    ]
    if not cluster.cgroups:
        problems.append(
            Problem(
                "cluster.cgroups",
                "per-job MIG needs device cgroups (ConstrainDevices): without them a job can open every GPU of "
                "its node",
            )
        )
    return problems
