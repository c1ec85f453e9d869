"""Rules that relate parts of the policy: tenants, tiers, billing, submission."""

from __future__ import annotations

import re

from ..errors import Problem
from ..hardware import CatalogueError, get_model
from ..slurmversion import SlurmVersion
from . import perjob
from .billing import tier_weights
from .model import Policy, Tier
from .share import SHARED_GRES, Mode
from .site import Group, TierView

PREEMPT_MODES = ("off", "requeue", "cancel")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_ALIAS = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# A node feature a job can name in --constraint: no operator of the constraint grammar (& | ( ) [ ] * ,), no space.
_FEATURE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _duplicates(names: list[str], path: str, what: str) -> list[Problem]:
    seen: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        if name in seen:
            out.append(Problem(f"{path}[{i}].name", f"{what} {name!r} is already defined at {path}[{seen[name]}]"))
        seen.setdefault(name, i)
    return out


def check_tenants(policy: Policy) -> list[Problem]:
    tenants = policy.tenants
    problems = _duplicates([t.name for t in tenants], "tenants", "tenant")
    names = {t.name for t in tenants}
    for i, t in enumerate(tenants):
        path = f"tenants[{i}]"
        if isinstance(t.shares, str):
            if t.shares != "parent":
                problems.append(
                    Problem(f"{path}.shares", f"{t.shares!r} is not allowed: a positive integer or 'parent'")
                )
        elif isinstance(t.shares, bool) or t.shares <= 0:
            problems.append(
                Problem(f"{path}.shares", f"{t.shares} is not allowed: shares must be a positive integer (or 'parent')")
            )
        if t.parent is not None and t.parent not in names:
            problems.append(
                Problem(f"{path}.parent", f"{t.parent!r} is not a tenant; known: {', '.join(sorted(names))}")
            )
        if t.parent == t.name:
            problems.append(Problem(f"{path}.parent", "a tenant cannot be its own parent"))
        for j, user in enumerate(t.users):
            if not _USER.match(user):
                problems.append(
                    Problem(
                        f"{path}.users[{j}]",
                        f"{user!r} is not a valid user name (lower-case letters, digits, '_', '-', '.')",
                    )
                )
        if len(set(t.users)) != len(t.users):
            problems.append(Problem(f"{path}.users", "a user is listed twice"))
    problems += _cycles(policy)
    return problems


def _cycles(policy: Policy) -> list[Problem]:
    parent = {t.name: t.parent for t in policy.tenants}
    out = []
    for i, t in enumerate(policy.tenants):
        seen: set[str] = set()
        cur: str | None = t.name
        while cur is not None and cur in parent:
            if cur in seen:
                out.append(Problem(f"tenants[{i}].parent", f"tenant {t.name!r} is in a parent cycle"))
                break
            seen.add(cur)
            cur = parent[cur]
    return out


def build_tiers(policy: Policy, groups: list[Group]) -> tuple[list[TierView], list[Problem]]:
    """Each tier's view (its node groups, their billing weights, whether it is the default), and the problems found."""
    problems = _duplicates([t.name for t in policy.tiers], "tiers", "tier")
    by_name = {g.name: g for g in groups}
    declared = {g.name for g in policy.node_groups}
    tenants = {t.name for t in policy.tenants}
    defaults = [i for i, t in enumerate(policy.tiers) if t.default]
    if len(defaults) > 1:
        problems.append(
            Problem(
                f"tiers[{defaults[1]}].default", f"only one tier can be the default; tiers[{defaults[0]}] already is"
            )
        )
    default_index = defaults[0] if defaults else 0
    views = []
    for i, tier in enumerate(policy.tiers):
        path = f"tiers[{i}]"
        problems += _preemption_problems(path, tier)
        problems += _reference_problems(path, tier, declared, tenants)
        members = tuple(by_name[n] for n in dict.fromkeys(tier.node_groups) if n in by_name)
        problems += _gpu_type_problems(path, tier, members)
        problems += _exclusive_process_mix(path, tier.name, members)
        problems += perjob.check_tier(path, tier.name, members)
        weights, conflicts = tier_weights(members, policy.billing, path)
        problems += conflicts
        views.append(TierView(tier, members, weights, i == default_index))
    return views, problems


def _preemption_problems(path: str, tier: Tier) -> list[Problem]:
    """A preempt_mode GPU jobs cannot have, or a grace_time on a tier whose jobs are never preempted."""
    problems = []
    mode = tier.preempt_mode.lower()
    if mode == "suspend":
        problems.append(
            Problem(
                f"{path}.preempt_mode",
                "'suspend' is not allowed for GPU jobs: suspended jobs keep their GRES; use requeue or cancel (or off)",
            )
        )
    elif mode not in PREEMPT_MODES:
        problems.append(
            Problem(
                f"{path}.preempt_mode",
                f"{tier.preempt_mode!r} is not allowed; use one of {', '.join(PREEMPT_MODES)}",
            )
        )
    if tier.grace_time and mode == "off":
        problems.append(
            Problem(
                f"{path}.grace_time",
                "applies to jobs preempted from this tier, and its preempt_mode is off; set preempt_mode to "
                "requeue or cancel, or remove grace_time",
            )
        )
    return problems


def _reference_problems(path: str, tier: Tier, declared: set[str], tenants: set[str]) -> list[Problem]:
    """The tier's node groups that are not declared and its allowed accounts that are not tenants."""
    problems = []
    for j, name in enumerate(tier.node_groups):
        if name not in declared:
            problems.append(
                Problem(
                    f"{path}.node_groups[{j}]",
                    f"{name!r} is not a node group; known: {', '.join(sorted(declared))}",
                )
            )
    for j, account in enumerate(tier.allow_accounts):
        if account not in tenants:
            problems.append(
                Problem(
                    f"{path}.allow_accounts[{j}]",
                    f"{account!r} is not a tenant; known: {', '.join(sorted(tenants)) or '(none)'}",
                )
            )
    return problems


def _gpu_type_problems(path: str, tier: Tier, members: tuple[Group, ...]) -> list[Problem]:
    """The tier's gpu_types that none of its node groups has (per-job MIG slice types count)."""
    types = {t for g in members for (n, t) in g.gres if n == "gpu"} | {t for g in members for t in g.slice_types}
    return [
        Problem(
            f"{path}.gpu_types[{j}]",
            f"{gtype!r} is not a GPU type on this tier's nodes; available: {', '.join(sorted(types))}",
        )
        for j, gtype in enumerate(tier.gpu_types)
        if gtype not in types
    ]


def _exclusive_process_mix(path: str, tier: str, members) -> list[Problem]:
    """A tier with EXCLUSIVE_PROCESS MPS groups is rendered ExclusiveUser=YES (one user per node at a time, the only
    per-user exclusivity Slurm has): every other group in it would be kept to one user per node too."""
    ep = [g.name for g in members if g.exclusive_process_mps]
    others = [g.name for g in members if not g.exclusive_process_mps]
    if not ep or not others:
        return []
    return [
        Problem(
            f"{path}.node_groups",
            f"tier {tier!r} mixes node groups {', '.join(ep)} (MPS in compute_mode "
            f"exclusive_process: one MPS server, so one user, per GPU at a time; the tier's partition gets "
            f"ExclusiveUser=YES) with {', '.join(others)}, which ExclusiveUser would also keep to one user per "
            f"node: give {', '.join(ep)} tiers of their own (only exclusive_process MPS groups), or set their "
            "compute_mode to default",
        )
    ]


def check_types(policy: Policy, groups: list[Group]) -> list[Problem]:
    """A custom whole-GPU type must not shadow a MIG type or another model's type."""
    index = {id(spec): i for i, spec in enumerate(policy.node_groups)}
    owners: dict[str, str] = {}
    problems = []
    for g in groups:
        i = index[id(g.spec)]
        for slot in g.gpus:
            names = slot.mig_types() if slot.share.is_mig else (slot.slurm_type,)
            for t in names:
                model = owners.setdefault(t, g.model.name)
                if model != g.model.name:
                    problems.append(
                        Problem(
                            f"node_groups[{i}].sharing",
                            f"GPU type {t!r} is used for both {model} and {g.model.name}; a type names one kind of GPU",
                        )
                    )
    return problems


def check_features(policy: Policy, groups: list[Group]) -> list[Problem]:
    """Node features: names a constraint can hold, and a GPU model's feature only on that model's nodes.

    Every node gets its GPU model's Slurm type as a feature (``Group.features``), so ``--constraint=a30|l40s``
    selects GPU models; a group listing another model's feature would be selected for that model.
    """
    index = {id(spec): i for i, spec in enumerate(policy.node_groups)}
    models = {g.model_feature: g.model.name for g in groups}
    problems = []
    for g in groups:
        i = index[id(g.spec)]
        for k, name in enumerate(g.spec.features):
            path = f"node_groups[{i}].features[{k}]"
            if not _FEATURE.match(name):
                problems.append(
                    Problem(
                        path,
                        f"{name!r} is not a feature name a job can ask for: letters, digits, "
                        "'_', '.', '-' (at most 64, starting with a letter or digit)",
                    )
                )
            elif models.get(name, g.model.name) != g.model.name:
                problems.append(
                    Problem(
                        path,
                        f"{name!r} is the feature of GPU model {models[name]} (every node gets "
                        f"its GPU model's feature), but this group has {g.model.name} GPUs",
                    )
                )
    return problems


def check_billing(policy: Policy, declared: dict | None = None) -> list[Problem]:
    problems = []
    for name, weight in policy.billing.gpu_weights.items():
        try:
            if name.lower() not in (declared or {}):
                get_model(name)
        except CatalogueError as exc:
            problems.append(Problem(f"billing.gpu_weights.{name}", str(exc)))
        if weight <= 0:
            problems.append(
                Problem(f"billing.gpu_weights.{name}", f"{weight} is not allowed: a GPU weight must be > 0")
            )
    return problems


def check_submission(policy: Policy, groups: list[Group]) -> list[Problem]:
    types = {t for g in groups for (n, t) in g.gres if n == "gpu"} | {t for g in groups for t in g.slice_types}
    modes = {s.mode for g in groups for s in g.gpus}
    problems = []
    for alias, target in policy.submission.aliases.items():
        path = f"submission.aliases.{alias}"
        if not _ALIAS.match(alias):
            problems.append(Problem(path, "an alias name is lower-case letters, digits and '_' (at most 32)"))
        if alias in types:
            problems.append(Problem(path, f"{alias!r} is already a real GPU type; an alias cannot shadow it"))
        problems += _check_alias_target(path, target, types, modes)
    return problems


def _check_alias_target(path, target: str, types, modes) -> list[Problem]:
    forms = "accepted: 'gpu:<type>', 'shard', 'mps:<percent 1-100>'"
    m = re.fullmatch(r"gpu:([a-z0-9_.]+)|shard|mps:(\d+)", target.strip())
    if not m:
        return [Problem(path, f"{target!r} is not an alias target; {forms}")]
    if m[1] is not None and m[1] not in types:
        return [Problem(path, f"GPU type {m[1]!r} does not exist on this cluster; types: {', '.join(sorted(types))}")]
    if target.startswith("shard") and "shard" not in modes:
        return [Problem(path, "no node group time-slices GPUs (mode shard)")]
    if m[2] is not None:
        if "mps" not in modes:
            return [Problem(path, "no node group shares GPUs with MPS (mode mps)")]
        if not 1 <= int(m[2]) <= 100:
            return [Problem(path, f"{m[2]} is not a percentage of one GPU; use 1-100")]
    return []


_QOS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_routes(policy: Policy, groups: list[Group], tiers: list[TierView]) -> list[Problem]:
    """Class routes: known tiers that can serve the class, sane GPU bounds, MIG rounding only where MIG exists."""
    problems: list[Problem] = []
    by_name = {t.name: t for t in tiers}
    for i, route in enumerate(policy.submission.routes):
        path = f"submission.routes[{i}]"
        m = route.match
        for j, q in enumerate(m.qos):
            if not _QOS.match(q):
                problems.append(
                    Problem(f"{path}.match.qos[{j}]", f"{q!r} is not a QOS name (letters, digits, '_', '.', '-')")
                )
        if (m.min_gpus is not None or m.max_gpus is not None) and m.gres != "gpu":
            problems.append(Problem(f"{path}.match", "min_gpus / max_gpus apply to gres: gpu only"))
        if m.min_gpus is not None and m.max_gpus is not None and m.min_gpus > m.max_gpus:
            problems.append(Problem(f"{path}.match.max_gpus", f"{m.max_gpus} is less than min_gpus {m.min_gpus}"))
        if len(set(route.tiers)) != len(route.tiers):
            problems.append(Problem(f"{path}.tiers", "a tier is listed twice"))
        members = []
        for j, name in enumerate(route.tiers):
            if name not in by_name:
                problems.append(
                    Problem(f"{path}.tiers[{j}]", f"{name!r} is not a tier; known: {', '.join(sorted(by_name))}")
                )
            else:
                members.append(by_name[name])
        scope = [g for t in members for g in t.groups] if route.tiers else list(groups)
        problems += _route_supply(path, route, scope)
    return problems


def _route_supply(path: str, route, scope: list[Group]) -> list[Problem]:
    """The route's tiers must hold what the class will ask for once routed (and rounded)."""
    want = route.match.gres
    where = "the route's tiers" if route.tiers else "this cluster"
    if route.round_to == Mode.MIG:
        if want != Mode.MPS:
            return [Problem(f"{path}.round_to", "rounding to a MIG slice applies to gres: mps (a share of one GPU)")]
        if not any(s.share.is_mig for g in scope for s in g.gpus):
            return [Problem(f"{path}.round_to", f"no GPU on {where} runs MIG; route to a tier with MIG GPUs")]
        return []
    if want in SHARED_GRES and not any(s.share.shared_gres == want for g in scope for s in g.gpus):
        return [Problem(f"{path}.tiers", f"no GPU on {where} is shared as {want}")]
    if want == "gpu" and not scope:
        return [Problem(f"{path}.tiers", "no node group on the route's tiers")]
    return []


ASSOC_QOS_FROM = SlurmVersion(24, 11)  # job_submit.lua's job_desc.assoc_qos (Slurm commit aa7a014239, 24.11.0)


def check_tier_submission(tiers: list[TierView], version: SlurmVersion | None) -> list[Problem]:
    """``set_qos: if-allowed`` needs job_desc.assoc_qos; ``untyped_gpu`` is whole, refuse, or a GPU type of the tier."""
    problems = []
    for i, view in enumerate(tiers):
        spec = view.spec
        if spec.set_qos == "if-allowed" and version is not None and version < ASSOC_QOS_FROM:
            problems.append(
                Problem(
                    f"tiers[{i}].set_qos",
                    f"'if-allowed' reads job_desc.assoc_qos, which job_submit.lua has from Slurm {ASSOC_QOS_FROM} "
                    f"(cluster.slurm_version is {version}); give true (every association has the tier's QOS) or false",
                )
            )
        if spec.untyped_gpu in ("whole", "refuse"):
            continue
        types = {t for g in view.groups for (n, t) in g.gres if n == "gpu"}
        if spec.gpu_types:
            types &= set(spec.gpu_types)
        if spec.untyped_gpu not in types:
            problems.append(
                Problem(
                    f"tiers[{i}].untyped_gpu",
                    f"{spec.untyped_gpu!r} is neither whole, refuse nor a GPU type of this tier; its types: "
                    f"{', '.join(sorted(types)) or '(none)'}",
                )
            )
    return problems
