"""What the submission rules need to know about a site, derived once from the policy.

The same ``Tables`` drive the Python decision and are emitted as Lua table
literals into job_submit.lua, so the two can only disagree in their code,
never in their data (and the corpus tests that code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..policy import Group, Site, TierView, share
from ..policy.rules import ASSOC_QOS_FROM
from ..slurmversion import SlurmVersion
from .routes import build_routes

FIELDS = ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task")
GRES_NAMES = ("gpu", "mps", "shard")  # the GRES names a request may use; others are refused, not passed through
KINDS = ("gpu", "shard", "mps")  # the kinds one job may not mix, in the order MIXED names them
PER = {"tres_per_task": "task", "tres_per_socket": "socket"}  # fields whose count multiplies on a node
MAX_LEN = 1024  # longest tres_per_* string looked at; longer ones are refused unread
MAX_COUNT = 4294967295
MAX_TYPE_LEN = 64
SUFFIXES = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
# Entries of a tres_per_* string that are not GRES (23.11 keeps --cpus-per-task
# in tres_per_task as cpu=N): left exactly as written.
PASSTHROUGH_NAMES = ("billing", "cpu", "energy", "mem", "node", "pages", "vmem")
PASSTHROUGH_PREFIXES = ("bb/", "fs/", "ic/", "license/")
GRES_PREFIX_FROM = SlurmVersion(23, 11)  # 'gres/gpu:2' from 23.11, 'gres:gpu:2' before

# Every text job_submit shows a user, written once. ``{name}`` is a value the
# rule fills in; Python formats these with ``message``/``code``, and
# render/jobsubmit.py emits them into job_submit.lua as pieces that its ``msg``
# joins, so both print the same bytes (tests/cases/submit.yaml checks it).
MESSAGES = {
    # parsing a tres_per_* string (parse.py)
    "not_string": "{field} is not a string",
    "too_long": "{field} is {size} characters long; at most {max} are accepted",
    "empty": "{field} is empty; name what the job asks for (name[:type][:count]), or leave it out",
    "empty_entry": "{field}: '{text}' has an empty entry (a doubled or trailing comma)",
    "negative": "{field}: '{raw}' asks for a negative count; a count is a whole number of at least 1",
    "not_count": "{field}: '{raw}': '{text}' is not a count (a whole number of at least 1, "
    "optionally followed by k, m, g, t or p)",
    "too_many": "{field}: '{raw}' asks for more than {max}",
    "zero": "{field}: '{raw}' asks for 0; a count is a whole number of at least 1",
    "not_gres": "{field}: '{raw}': '{name}' is not a GRES on this cluster; known: {known}",
    "bad_form": "{field}: '{raw}' is not a GRES request; write name[:type][:count], e.g. gpu:2 or shard:1",
    "bad_type": "{field}: '{raw}': '{type}' is not a valid type name (letters, digits, '_', '.', '-'; at most {max})",
    "twice": "{field}: {key} is requested twice ('{first}' and '{raw}'); ask once with the total",
    # the rules (decide.py); each has a code below
    "unknown_gpu": "this cluster has no GPU type '{type}'{hint}; types: {types}{aliases}",
    "hint_lower": " (types are lower case: {low})",
    "hint_match": " (did you mean {matches}?)",
    "hint_aliases": "; aliases: {aliases}",
    "unknown_shared": "no GPU on this cluster is shared as {name}; it offers: {offers}",
    "unknown_shared_type": "no GPU of type '{type}' is shared as {name} here; {name} GPUs: {types}",
    "mps_range": "an MPS share is part of one GPU: 1 to {most} here, where {most} is the whole GPU; {n} is more than "
    "one GPU can give, and Slurm takes a shared request from one GPU. Ask for whole GPUs instead, e.g. --gres={whole}",
    "scope": "{name} in {field} is requested per {unit}, so a job with several {unit}s on a node holds several "
    "slices of the same GPU (reject_multi_slice); ask per node instead, e.g. --gres={name}:{n}",
    "over_shard": "{n} shards are not {n} GPUs: they are {n} time slices of the same GPU, "
    "one device reserved {n} times, "
    "and the job gets no more of it than with one. Ask for --gres=shard:1, or for whole GPUs with --gres={whole}",
    "mixed": "one job cannot combine {kinds}: it gets whole GPUs or MIG slices (gpu), or shards, or an MPS "
    "share, one kind only (Slurm refuses the mix); submit separate jobs",
    "mps_tasks": "an MPS share is enforced per process, not per job: NVIDIA MPS applies the thread percentage and "
    "the memory limit to each client process, so {n} tasks on one node would each get the whole mps:{units}, {n} "
    "times the share. Run one task per node (--ntasks-per-node=1), or {isolation}",
    # the job's --constraint (constraint.py): GPU models are node features
    "unknown_feature": "--constraint names '{name}', a feature no node here has{hint}; a GPU model is asked for by "
    "its feature: {models}{others}",
    "hint_feature_lower": " (feature names are case-sensitive: {low})",
    "hint_other_features": "; other node features: {features}",
    "constraint_none": "no node here has every feature --constraint='{constraint}' asks for: each node has one GPU "
    "model feature ({models}); to let the job run on any of several GPU models join them with '|', e.g. "
    "--constraint='{example}'",
    "constraint_request": "{key} is served by no GPU on the nodes --constraint='{constraint}' allows (GPU models: "
    "{models}); they offer {offers}: ask for one of those, or widen the constraint",
    # per-job MIG (a slice is made for the job and carried by shards; decide.per_job)
    "per_job_count": "{type} is a per-job MIG slice here: an instance made for the job on one GPU, one per job and "
    "node, and {n} were asked for; ask for one (--gres=gpu:{type}:1), for a larger profile, or for whole GPUs",
    "per_job_field": "{type} is a per-job MIG slice here, one per node: ask for it per node with --gres=gpu:{type}:1 "
    "(not in {field})",
    "per_job_tiers": "{type} is a per-job MIG slice on some of the job's partitions ({partition}) and not on others; "
    "name only partitions of one kind",
    "per_job_shard": "the shards of partition {partition} carry per-job MIG slices and are not handed out by count; "
    "ask for a slice by its type, e.g. --gres=gpu:{example}:1",
    "per_job_extra": "partition {partition} makes MIG slices per job and records a job's slice in its extra field "
    "(gpushare-mig=<profile>), so the field is gpushare's there: submit without --extra, and do not change it "
    "(scontrol update Extra=)",
    # an untyped gpu request (tiers[].untyped_gpu; untyped_target)
    "untyped": "'{key}' names no GPU type, and an untyped GPU request (--gres=gpu:N, --gpus=N, --gpus-per-node=N) "
    "asks for whole GPUs, never MIG slices nor GPUs kept for MPS or shards; in partition {tier} {reason}. Name "
    "the type, e.g. --gres=gpu:{example}:{n}",
    "untyped_refuse": "every GPU request names its type (untyped_gpu: refuse)",
    "untyped_excluded": "an untyped request means gpu:{type}, which --constraint rules out",
    "untyped_whole": "not every GPU type is a whole GPU, and no single type is the whole GPU to give (whole GPUs: "
    "{whole}; MIG slices and MPS or shard GPUs: {others})",
    "untyped_tiers": "an untyped request means other GPUs than in the job's other partitions ({meanings})",
    "untyped_tier": "{tier}: {types}",  # one entry of {meanings}
    # the user message (Decision.user_message)
    "rejected": "gpushare rejected this job:",
    "violation": "{code}: {message}",  # one line a violation, after "rejected"
    "changed": "gpushare changed this job: {changes}",
    "change": "{name}={value}",  # one entry of {changes}
}
# What only job_submit.lua says (its log lines, and its own failure): Python
# never runs inside slurmctld, so these have no Python twin; kept here so
# that the template holds no text at all.
SCRIPT_MESSAGES = {
    "log_rejected": "gpushare job_submit: uid {uid}: rejected: {codes}",
    "log_changed": "gpushare job_submit: uid {uid}: {message}",
    "internal": "gpushare job_submit: internal error in {where}: {error}",
    "internal_open": "{text} (fail_open: the job goes through unchecked)",
    "internal_closed": "{text} (the job is rejected: fail closed)",
    "internal_user": "gpushare: internal error in gpushare's job_submit.lua, so the job was rejected to be safe "
    "(fail closed); please tell your cluster admins. Error: {error}",
    "bad_return": "returned {value} instead of a return code",
    "site_lua_error": "gpushare job_submit: the site's {path} failed in {where}: {error} (the job is rejected)",
    "site_lua_user": "gpushare: the site's own job submission rules failed, so the job was rejected to be safe; "
    "please tell your cluster admins",
}
CODES = {
    "bad_request": "BAD_REQUEST {field}",
    "unknown_gpu": "UNKNOWN_TYPE gpu:{type}",
    "unknown_shared": "UNKNOWN_TYPE {key}",
    "unknown_shared_type": "UNKNOWN_TYPE {key}",
    "mps_range": "MPS_RANGE mps={n}",
    "scope": "SCOPE {name} {field}",
    "over_shard": "OVER shard={n}",
    "mixed": "MIXED {kinds}",
    "mps_tasks": "MPS_TASKS tasks={n}",
    "unknown_feature": "UNKNOWN_FEATURE {name}",
    "constraint_none": "CONSTRAINT none",
    "constraint_request": "CONSTRAINT {key}",
    "per_job_count": "PER_JOB gpu:{type}={n}",
    "per_job_field": "PER_JOB_FIELD gpu:{type} {field}",
    "per_job_tiers": "PER_JOB_TIERS gpu:{type}",
    "per_job_shard": "PER_JOB_SHARD {partition}",
    "per_job_extra": "PER_JOB_EXTRA {partition}",
    "untyped": "UNTYPED {tier}",
}
# Where the filter records a per-job MIG slice's profile: the job's extra field, which the prolog receives
# (SLURM_JOB_EXTRA; the admin comment never reaches it). Users may set extra, so per-job tiers own it: the filter
# refuses a job there that brings its own and any change of it on such a job or one that carries the record.
RECORD_FIELD = "extra"
RECORD_PREFIX = share.RECORD_PREFIX
# Where MPS_TASKS steers a job that needs isolation (Tables.texts['isolation'], chosen once per site).
ISOLATION = {
    "mig": "for isolation that holds however many processes the job starts, ask for a MIG slice "
    "(e.g. --gres=gpu:{type}:1) or a whole GPU (--gres={whole})",
    "whole": "for isolation that holds however many processes the job starts, ask for a whole GPU "
    "(--gres={whole}; this cluster has no MIG slices)",
}
# Slurm's "not set" values in job_desc (slurm.h): NO_VAL for 32-bit counts, NO_VAL16 for 16-bit ones;
# a task count at or above them is unset, as is 0.
NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE
# How lists inside messages are joined (both languages read these).
JOIN = {
    "kinds_code": "+",
    "kinds": " and ",
    "matches": " or ",
    "lines": "\n",
    "changes": ", ",
    "log_codes": "; ",
    "offers": ", ",
    "none": "(none)",
    "tiers": "; ",
}


def message(which: str, /, **values) -> str:
    """MESSAGES[which] with its values filled in."""
    return MESSAGES[which].format(**values)


def code(which: str, /, **values) -> str:
    """CODES[which] with its values filled in."""
    return CODES[which].format(**values)


_FIELD = re.compile(r"\{([a-z_]+)\}")


def pieces(template: str) -> list[str]:
    """'a {x} b' -> ['a ', 'x', ' b']: literals at even positions, value names at odd ones (Lua: odd/even)."""
    return _FIELD.split(template)


@dataclass(frozen=True)
class Alias:
    """``gpu:<alias>:N`` means ``name[:type]:N*per``."""

    name: str
    type: str
    per: int


@dataclass(frozen=True)
class GroupCaps:
    """What one node group serves inside a tier (its GPU types narrowed to the tier's), and its node features."""

    name: str
    model: str  # the GPU model's feature
    features: tuple[str, ...]
    gpu: tuple[str, ...]
    shared: dict[str, dict[str, int]]
    slices: dict[str, tuple[int, str]] = field(default_factory=dict)  # per-job MIG: type -> (shards, profile)
    whole: tuple[str, ...] = ()  # the gpu types of its whole GPUs (Share.is_whole_gpu; never a slice, MPS or shard)


@dataclass(frozen=True)
class TierCaps:
    """What one tier (partition) can serve: GPU types, and per shared GRES the most one GPU holds; per group too."""

    name: str
    is_default: bool
    priority: int
    gpu: tuple[str, ...]
    shared: dict[str, dict[str, int]]
    groups: tuple[GroupCaps, ...] = ()
    slices: dict[str, tuple[int, str]] = field(default_factory=dict)  # per-job MIG: type -> (shards, profile)
    whole: tuple[str, ...] = ()  # gpu types that are whole GPUs on some node (GroupCaps.whole, joined)
    untyped: str = "whole"  # tiers[].untyped_gpu: whole, refuse, or a gpu type
    set_qos: str = "never"  # tiers[].set_qos resolved (resolve_set_qos): always, never, if-allowed


@dataclass(frozen=True)
class Tables:
    prefix: str
    reject_multi_slice: bool
    fail_open: bool
    route_by_gres: bool
    set_gpu_type: bool
    gpu_types: tuple[str, ...]
    shared: dict[str, dict[str, int]]
    aliases: dict[str, Alias]
    tiers: tuple[TierCaps, ...]  # routing order: default first, then priority (high first), then name
    texts: dict[str, str] = field(default_factory=dict)
    routes: tuple = ()  # submit.routes.RouteRule, first match wins (submission.routes)
    mig_types: tuple[str, ...] = ()  # the gpu types that are MIG slices (MPS_TASKS names one)
    features: tuple[str, ...] = ()  # every node feature: GPU model features first (Site.features)
    model_features: tuple[str, ...] = ()  # the GPU model features, in group order

    def tier(self, name: str) -> TierCaps | None:
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def default_tier(self) -> TierCaps:
        return next(t for t in self.tiers if t.is_default)


def shared_caps(groups: tuple[Group, ...]) -> dict[str, dict[str, int]]:
    """{'shard': {'': 4, 'l40s': 4}, 'mps': {...}}: the most units one GPU gives, overall ('') and per GPU type.

    Without SelectTypeParameters=MULTIPLE_SHARING_GRES_PJ (gpushare never sets
    it) Slurm takes a shared request on a node from a single GPU, so the
    largest GPU is the most any request can get.
    """
    caps: dict[str, dict[str, int]] = {}
    for group in groups:
        for slot in group.gpus:
            name = slot.share.shared_gres
            if not name or slot.share.is_per_job_mig:  # a per-job GPU's shards carry slices, not shard requests
                continue
            per = caps.setdefault(name, {})
            for key in ("", slot.slurm_type):
                per[key] = max(per.get(key, 0), slot.share.shared_count)
    return {name: dict(sorted(per.items())) for name, per in sorted(caps.items())}


def tier_gpu_types(tier: TierView, groups: tuple[Group, ...] | None = None) -> tuple[str, ...]:
    """GPU types on the tier's nodes (or on these groups of it), narrowed to its gpu_types when it lists any."""
    types = {t for g in (tier.groups if groups is None else groups) for (n, t) in g.gres if n == "gpu"}
    if tier.spec.gpu_types:
        types &= set(tier.spec.gpu_types)
    return tuple(sorted(types))


def slice_caps(groups: tuple[Group, ...]) -> dict[str, tuple[int, str]]:
    """Per-job MIG slice types on these groups: type -> (carrier shards, profile). Validation keeps one carrier per
    tier (policy.perjob.check_tier), so a type means one weight and profile."""
    found = {
        slot.model.mig_slurm_type(p): (w, p)
        for g in groups
        for slot in g.gpus
        if slot.share.is_per_job_mig
        for p, w in zip(slot.share.profiles, slot.share.weights, strict=True)
    }
    return dict(sorted(found.items()))


def group_caps(tier: TierView) -> tuple[GroupCaps, ...]:
    return tuple(
        GroupCaps(
            g.name,
            g.model_feature,
            g.features,
            tier_gpu_types(tier, (g,)),
            shared_caps((g,)),
            slice_caps((g,)),
            whole_types(tier, g),
        )
        for g in tier.groups
    )


def whole_types(tier: TierView, group: Group) -> tuple[str, ...]:
    """The group's gpu types (in the tier) of GPUs an untyped request may take whole: exclusive or per-job MIG GPUs,
    never a fixed MIG slice nor an MPS or shard GPU."""
    types = set(tier_gpu_types(tier, (group,)))
    return tuple(sorted({s.slurm_type for s in group.gpus if s.share.is_whole_gpu} & types))


def resolve_set_qos(tier: TierView, version: SlurmVersion) -> str:
    """tiers[].set_qos as job_submit acts on it: unset is if-allowed where job_desc.assoc_qos exists (24.11), else
    never."""
    value = tier.spec.set_qos
    if value is None:
        return "if-allowed" if version >= ASSOC_QOS_FROM else "never"
    return "if-allowed" if value == "if-allowed" else ("always" if value else "never")


def tier_caps(v: TierView, version: SlurmVersion) -> TierCaps:
    groups = group_caps(v)
    whole = tuple(sorted({x for g in groups for x in g.whole}))
    return TierCaps(
        v.name,
        v.is_default,
        v.spec.priority,
        tier_gpu_types(v),
        shared_caps(v.groups),
        groups,
        slice_caps(v.groups),
        whole,
        v.spec.untyped_gpu,
        resolve_set_qos(v, version),
    )


def merged(name: str, groups) -> TierCaps:
    """What these groups serve together (of one tier, or several): GPU types joined, shared caps at their largest."""
    gpu = tuple(sorted({x for g in groups for x in g.gpu}))
    slices = {x: v for g in groups for x, v in g.slices.items()}
    shared: dict[str, dict[str, int]] = {}
    for g in groups:
        for kind, per in g.shared.items():
            mine = shared.setdefault(kind, {})
            for k, n in per.items():
                mine[k] = max(mine.get(k, 0), n)
    whole = tuple(sorted({x for g in groups for x in g.whole}))
    return TierCaps(name, False, 0, gpu, shared, tuple(groups), dict(sorted(slices.items())), whole)


def parse_alias(target: str) -> Alias:
    """An alias target already validated by the policy: 'gpu:<type>', 'shard' or 'mps:<n>'."""
    m = re.fullmatch(r"gpu:([a-z0-9_.]+)|shard|mps:([0-9]+)", target.strip())
    if m is None:
        raise ValueError(f"alias target {target!r} was not validated")
    if m[1]:
        return Alias("gpu", m[1], 1)
    if m[2]:
        return Alias("mps", "", int(m[2]))
    return Alias("shard", "", 1)


def routing_order(tiers: list[TierCaps]) -> tuple[TierCaps, ...]:
    return tuple(sorted(tiers, key=lambda t: (not t.is_default, -t.priority, t.name)))


def build_tables(site: Site) -> Tables:
    sub = site.policy.submission
    tiers = [tier_caps(v, site.version) for v in site.tiers]
    aliases = {name: parse_alias(target) for name, target in sorted(sub.aliases.items())}
    shared = shared_caps(site.groups)
    tables = Tables(
        prefix="gres/" if site.version >= GRES_PREFIX_FROM else "gres:",
        reject_multi_slice=sub.reject_multi_slice,
        fail_open=sub.fail_open,
        route_by_gres=sub.route_by_gres,
        set_gpu_type=sub.set_gpu_type,
        gpu_types=tuple(sorted({*site.gpu_types, *slice_caps(site.groups)})),
        shared=shared,
        aliases=aliases,
        tiers=routing_order(tiers),
        routes=build_routes(site),
        mig_types=tuple(
            sorted({x for g in site.groups for slot in g.gpus if slot.share.is_mig for x in slot.mig_types()})
        ),
        features=site.features,
        model_features=site.model_features,
    )
    return _with_texts(tables)


def untyped_target(tier: TierCaps, caps: TierCaps, set_type: bool) -> str | None:
    """The type an untyped gpu request gets on ``tier`` (``caps``: what it serves where the constraint allows):
    '' to leave it untyped, a type to write, None when it is refused (rule 5b)."""
    if tier.untyped == "refuse":
        return None
    if tier.untyped != "whole":
        return tier.untyped if tier.untyped in caps.gpu else None
    if all(x in caps.whole for x in caps.gpu):
        return caps.gpu[0] if set_type and len(caps.gpu) == 1 else ""
    return caps.whole[0] if len(caps.whole) == 1 else None


def whole_request(t: Tables) -> str:
    """The request for one whole GPU that refusals suggest (MPS_RANGE, OVER, MPS_TASKS), one the same policy
    accepts: ``gpu:1`` where a job naming no partition gets its meaning by it (rule 5b on the tier routing picks,
    or on the default tier), else a GPU type by name (a tier with ``untyped_gpu: refuse``, several whole types,
    or only GPUs kept for MPS or shards, which a typed request gets whole): the first whole type, else the first
    type that is no MIG slice."""
    tiers = [x for x in (t.tiers if t.route_by_gres else (t.default_tier,)) if x.gpu]
    if any(untyped_target(x, x, t.set_gpu_type) is not None for x in tiers):
        return "gpu:1"
    whole = [w for x in t.tiers for w in x.whole] + [x for x in t.gpu_types if x not in t.mig_types]
    return f"gpu:{whole[0]}:1" if whole else "gpu:1"


def _isolation(t: Tables) -> str:
    """Where MPS_TASKS steers a job that needs isolation: a MIG slice when the site has any, else a whole GPU."""
    mig = [x for x in t.gpu_types if x in t.mig_types]
    whole = whole_request(t)
    return ISOLATION["mig"].format(type=mig[0], whole=whole) if mig else ISOLATION["whole"].format(whole=whole)


def offers(gpu_types, shared) -> list[str]:
    """What GPUs offer, as a message lists it: gpu:<type> for each type as given, then the shared GRES by name."""
    return [f"gpu:{x}" for x in gpu_types] + sorted(shared)


def _with_texts(t: Tables) -> Tables:
    """Lists that messages print, joined once here so Python and Lua print the same words."""
    offered = offers(t.gpu_types, t.shared)
    texts = {
        "isolation": _isolation(t),
        "whole": whole_request(t),
        "gres_names": ", ".join(GRES_NAMES),
        "gpu_types": ", ".join(t.gpu_types) or "(none)",
        "aliases": ", ".join(sorted(t.aliases)),
        "offers": ", ".join(offered),
        "model_features": ", ".join(t.model_features) or "(none)",
        "other_features": ", ".join(f for f in t.features if f not in t.model_features),
        "constraint_example": "|".join(t.model_features[:2]) or "(none)",
    }
    for name, per in t.shared.items():
        texts[f"{name}_types"] = ", ".join(k for k in per if k)
    return replace(t, texts=texts)
