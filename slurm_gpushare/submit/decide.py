"""The submission decision: a job's GPU requests against the site policy. Pure.

Rules, in the order they are applied (job_submit.lua applies the same ones):

1. Each tres_per_* field is parsed (``parse.py``); aliases are resolved
   (``gpu:<alias>:N``); a GRES named twice in one field is refused. Any such
   problem gives ``BAD_REQUEST <field>`` and nothing else is checked.
2. No GRES in any field (a field of 'none', as sbatch sends for --gres=none,
   has none): the job is not a GPU job and is left untouched.
3. Per request, at most one of:
   - ``UNKNOWN_TYPE gpu:<t>``: no such GPU type (or MIG profile type) here;
   - ``UNKNOWN_TYPE shard|mps[:<t>]``: no GPU (of that type) is shared that way;
   - ``MPS_RANGE mps=<n>``: more MPS units than the largest MPS GPU has
     (100 = one whole GPU); always on, because Slurm takes a shared request
     from one GPU (gpushare does not set MULTIPLE_SHARING_GRES_PJ);
   - with ``reject_multi_slice``: ``SCOPE <shard|mps> <field>`` for a shared
     GRES per task or per socket (it multiplies on one node), and
     ``OVER shard=<n>`` for more than one shard per node or per job.
4. ``MIXED a+b``: whole GPUs/MIG (gpu), shards and MPS in one job.
   ``MPS_TASKS tasks=<n>``: an MPS request from a job that may run more than
   one task on a node (``tasks_per_node``: --ntasks-per-node, else --ntasks
   less the nodes beyond the first). NVIDIA MPS limits each client process
   (thread percentage, pinned memory), not a job, so n tasks would get n
   times the share; the message steers to one task per node, or to a MIG
   slice (or a whole GPU) for isolation that does not depend on how many
   processes a job starts. A process the job starts itself (fork, a step
   with more tasks) is not seen at submission: docs/users/mps-isolation.md.
   Before these checks, a class route (``submission.routes``, ``routes.py``)
   is found for a new job without a partition; with ``round_to: mig`` its
   ``mps:N`` becomes the smallest covering MIG slice, ``gpu:<type>:1``.
5. Placement (only when accepted): a job matched by a class route goes to
   the route's tiers (the partition is set to them, comma-joined). Otherwise
   a job without a partition, with
   ``route_by_gres``, goes to the first tier in routing order (default, then
   priority, then name) that serves all its requests; the partition is set only
   when that tier is not the default. An untyped gpu request gets a type
   as rule 5b says.
5a. The job's ``--constraint`` (``features``, read by ``constraint.py``; only
   for a GPU job, after the rules above passed, on submission and on an
   update that sets it): ``UNKNOWN_FEATURE <name>`` for a name no node has
   (Slurm would refuse it too; the message lists the GPU model features and
   says when only the case differs); ``CONSTRAINT none`` when no node group
   has the features it asks for together (two GPU models joined by '&');
   ``CONSTRAINT <key>`` for a request no GPU of the groups it allows serves
   (``--gres=shard:1 --constraint=a30`` where no A30 is sharded). Routing
   (5) then picks the first tier whose allowed groups serve every request,
   and rule 5b looks only at the GPU types of the allowed groups of the
   job's tiers, so ``--gres=gpu:1 --constraint=l40s`` becomes ``gpu:l40s:1``
   where the L40S GPUs are whole. A fractional request (mps, shard) keeps
   its constraint: Slurm places it only on the allowed models.
5b. An untyped gpu request (``--gres=gpu:N``, ``--gpus=N``,
   ``--gpus-per-node=N``) means what the tier's ``untyped_gpu`` says
   (``untyped_target``): ``whole`` (the default) is a whole GPU
   (``Share.is_whole_gpu``: an exclusive GPU, or a per-job MIG GPU taken
   whole), never a MIG slice nor a GPU kept for MPS or shards. Where every
   GPU type of the tier (on the groups the constraint allows) is a whole GPU
   the request is left as it is (typed by ``set_gpu_type`` when there is one
   type); where exactly one type is a whole GPU it is rewritten to that type;
   otherwise it is ``UNTYPED <tier>`` (``untyped_violation``: the tier's
   whole GPU types and the others, where the constraint allows, and a typed
   request to make). ``refuse``: every untyped request is ``UNTYPED``; a
   type: rewritten to it. Routing (5) first picks a tier that can give an
   untyped request its meaning, so a job without a partition is routed to a
   whole-GPU tier before it is refused; when none can, the first tier that
   serves the request refuses it. A job in several tiers needs one meaning
   in all (the same target, or each tier only whole GPUs). A type is a type:
   a whole-GPU type whose GPUs are also shard or MPS GPUs on other nodes (the
   same model, no ``type:`` of their own) can still be taken whole there, as
   by a typed request. On update the job's tiers are its partition's.
5c. Per-job MIG (``per_job``, after placement, on submission and update):
   a slice type (``gpu:<model>_<profile>``, or an alias of one) on a tier whose
   GPUs make an instance per job becomes that profile's carrier shards,
   ``shard:<weight>``, and the profile is recorded in the job's extra field
   (``tables.RECORD_FIELD``, ``gpushare-mig=<profile>``, which the prolog reads
   as SLURM_JOB_EXTRA). Per-job tiers own that field: ``PER_JOB_EXTRA
   <partition>`` for a job there (GPU or not) that brings its own --extra, and
   for an update that sets extra on a job there or on one that carries the
   record, so the prolog's profile is the one the shards were counted for.
   ``PER_JOB gpu:<t>=<n>`` for more than one slice (or a slice beside other
   GPUs) per node, ``PER_JOB_FIELD`` for a slice asked per job, task or socket,
   ``PER_JOB_TIERS`` where the job's partitions disagree on what the type is,
   ``PER_JOB_SHARD`` for a plain shard request on a per-job tier.
6. QOS (every accepted job, GPU or not, on submission only): a job that names
   no QOS may get the QOS of its tier, the tier its partition names (the
   first one when it names several, all of them tiers), the one routing
   chose, or the default tier when it names none, so the tier's UsageFactor
   and priority apply to it. Whether it does is the tier's ``set_qos``
   (``tables.resolve_set_qos``): ``always``; ``never``; ``if-allowed`` (the
   default from Slurm 24.11): only when the job's association may use that
   QOS (``assoc_qos``: job_desc.assoc_qos, the association's QOS names,
   comma-separated; nil when Slurm knows no association), so an association
   the policy does not list keeps its default QOS and its limits, and is not
   refused "Invalid qos specification". Without ``assoc_qos`` (``gpushare
   check``, offline) Python cannot know: ``Decision.qos_if_allowed`` says
   what would be set. A job that names a QOS keeps it; a partition that is
   not a tier sets none; an update (slurm_job_modify) never sets it. It is a
   default, not a correction, so the user message leaves it out (``gpushare
   check`` prints it with the other changes: ``Decision.all_changes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from . import constraint
from .parse import BadRequest, Gres, Other, parse_field
from .routes import find_route, routed
from .tables import (
    FIELDS,
    JOIN,
    KINDS,
    NO_VAL,
    NO_VAL16,
    PER,
    RECORD_FIELD,
    RECORD_PREFIX,
    GroupCaps,
    Tables,
    TierCaps,
    code,
    merged,
    message,
    offers,
    untyped_target,
)


@dataclass(frozen=True)
class Violation:
    code: str
    message: str
    typed: str = ""  # UNTYPED: the GPU type the message tells the user to name (the planner's user names it)

    def __str__(self) -> str:
        return message("violation", code=self.code, message=self.message)


def violation(rule: str, /, **values) -> Violation:
    """The violation of ``rule``: its code and message (tables.CODES, tables.MESSAGES) filled in."""
    return Violation(code(rule, **values), message(rule, **values))


@dataclass(frozen=True)
class Decision:
    """Accepted or not, why, and what to change in the job (partition, rewritten tres_per_* fields, qos)."""

    accepted: bool
    violations: tuple[Violation, ...] = ()
    partition: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    qos: str | None = None
    extra: str | None = None  # per-job MIG: the slice's profile record (tables.RECORD_FIELD)
    qos_if_allowed: str | None = None  # the tier QOS set when the association may use it (assoc_qos unknown)

    @property
    def codes(self) -> list[str]:
        return [v.code for v in self.violations]

    @property
    def changes(self) -> list[str]:
        out = [message("change", name="partition", value=self.partition)] if self.partition else []
        out += [message("change", name=k, value=v) for k, v in self.fields.items()]
        if self.extra:
            out.append(message("change", name=RECORD_FIELD, value=self.extra))
        return out

    @property
    def all_changes(self) -> list[str]:
        """Every change job_submit makes: the user message's, and the QOS (what `gpushare check` prints; it adds
        ``qos_if_allowed``, which depends on the association)."""
        qos = [message("change", name="qos", value=self.qos)] if self.qos else []
        return self.changes + qos

    @property
    def user_message(self) -> str | None:
        """What job_submit.lua shows the user (slurm.log_user), byte for byte."""
        if self.violations:
            return JOIN["lines"].join([message("rejected"), *(str(v) for v in self.violations)])
        if self.changes:
            return message("changed", changes=JOIN["changes"].join(self.changes))
        return None


def decide(
    t: Tables,
    job: Mapping[str, str | None],
    modify: bool = False,
    current_partition: str | None = None,
    current_extra: str | None = None,
) -> Decision:
    """Decide on a job given as job_submit's fields (tres_per_*, partition, extra).

    ``modify``: the fields are an update of an existing job (slurm_job_modify):
    only the fields present are checked, an empty field clears the GRES and
    passes, there is no routing, and the job's partition is
    ``job['partition']`` or else ``current_partition``; ``current_extra`` is
    the job's extra field before the update (job_rec.extra).
    """
    parsed, bad = _parse_all(t, job, modify)
    if bad:
        return Decision(False, tuple(bad))
    route = find_route(t.routes, job, [e for v in parsed.values() for e in v if isinstance(e, Gres)], modify)
    parsed = routed(route, parsed)  # submission.routes: an mps share may become a MIG slice
    requests = [e for entries in parsed.values() for e in entries if isinstance(e, Gres)]
    if not requests:
        to = ",".join(route.tiers) if route and route.tiers else None
        tiers, _ = job_tiers(t, job.get("partition") or to or (current_partition if modify else None), [], True)
        own = own_extra(t, tiers, job, modify, current_extra, job.get("partition") or current_partition or "")
        if own:
            return Decision(False, (own,))
        qos, maybe = tier_qos(job, tiers, modify)
        return Decision(True, partition=to, qos=qos, qos_if_allowed=maybe)
    violations = [v for r in requests if (v := check_request(t, r)) is not None]
    mixed = check_mixed(requests)
    if mixed:
        violations.append(mixed)
    tasks = check_mps_tasks(t, job, requests)
    if tasks:
        violations.append(tasks)
    if violations:
        return Decision(False, tuple(violations))
    con = constraint.read(job.get("features"))
    bad_constraint = check_constraint(t, con, requests) if con is not None else []
    if bad_constraint:
        return Decision(False, tuple(bad_constraint))
    return _place(t, job, parsed, modify, (current_partition, current_extra), route, allowed_of(t, con))


def _parse_all(t: Tables, job, modify) -> tuple[dict[str, list[Gres | Other]], list[Violation]]:
    parsed: dict[str, list[Gres | Other]] = {}
    bad: list[Violation] = []
    for name in FIELDS:
        text = job.get(name)
        if text is None or _no_gres(text, modify):
            continue
        try:
            entries = [resolve_alias(t, e) for e in parse_field(name, text)]
            check_duplicates(name, entries)
        except BadRequest as exc:
            bad.append(Violation(code("bad_request", field=name), str(exc)))
            continue
        parsed[name] = entries
    return parsed, bad


def _no_gres(text, modify: bool) -> bool:
    """'none' (what sbatch sends for --gres=none) asks for no GRES; in an update, so does ''."""
    return isinstance(text, str) and (text.lower() == "none" or (modify and text == ""))


def resolve_alias(t: Tables, e: Gres | Other) -> Gres | Other:
    """``gpu:<alias>:N`` -> the alias target, N times (an mps alias multiplies its units)."""
    if not isinstance(e, Gres) or e.name != "gpu" or e.type not in t.aliases:
        return e
    a = t.aliases[e.type]
    return replace(e, name=a.name, type=a.type, count=e.count * a.per, alias=e.type)


def check_duplicates(field_name: str, entries: list[Gres | Other]) -> None:
    seen: dict[str, str] = {}
    for e in entries:
        if not isinstance(e, Gres):
            continue
        if e.key in seen:
            raise BadRequest(message("twice", field=field_name, key=e.key, first=seen[e.key], raw=e.raw))
        seen[e.key] = e.raw


def check_request(t: Tables, r: Gres) -> Violation | None:
    if r.name == "gpu":
        return None if not r.type or r.type in t.gpu_types else _unknown_gpu(t, r.type)
    per = t.shared.get(r.name)
    if per is None:
        return violation("unknown_shared", key=r.key, name=r.name, offers=t.texts["offers"])
    if r.type and r.type not in per:
        return violation("unknown_shared_type", key=r.key, name=r.name, type=r.type, types=t.texts[r.name + "_types"])
    most = per[r.type]
    if r.name == "mps" and r.count > most:
        return violation("mps_range", n=r.count, most=most, whole=t.texts["whole"])
    return _multi_slice(t, r)


def _multi_slice(t: Tables, r: Gres) -> Violation | None:
    if not t.reject_multi_slice:
        return None
    unit = PER.get(r.field)
    if unit:
        return violation("scope", name=r.name, field=r.field, unit=unit, n=r.count)
    if r.name == "shard" and r.count > 1:
        return violation("over_shard", n=r.count, whole=t.texts["whole"])
    return None


def _unknown_gpu(t: Tables, gtype: str) -> Violation:
    low = gtype.lower()
    matches = [x for x in t.gpu_types if x.endswith("_" + low)]
    if low != gtype and low in t.gpu_types:
        hint = message("hint_lower", low=low)
    elif matches:
        hint = message("hint_match", matches=JOIN["matches"].join(matches))
    else:
        hint = ""
    aliases = message("hint_aliases", aliases=t.texts["aliases"]) if t.aliases else ""
    return violation("unknown_gpu", type=gtype, hint=hint, types=t.texts["gpu_types"], aliases=aliases)


def check_mixed(requests: list[Gres]) -> Violation | None:
    kinds = [k for k in KINDS if any(r.name == k for r in requests)]
    if len(kinds) < 2:
        return None
    return Violation(
        code("mixed", kinds=JOIN["kinds_code"].join(kinds)), message("mixed", kinds=JOIN["kinds"].join(kinds))
    )


def _count(value, unset: int) -> int | None:
    """A task or node count from job_submit (a number, or its digits); None when unset (0, NO_VAL*, not a number)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if 0 < n < unset else None


def tasks_per_node(job: Mapping[str, str | None]) -> int:
    """The most tasks the job may start on one node: --ntasks-per-node, else --ntasks less one per further
    node it must have (--nodes, its minimum), else 1."""
    per_node = _count(job.get("ntasks_per_node"), NO_VAL16)
    if per_node is not None:
        return per_node
    tasks = _count(job.get("num_tasks"), NO_VAL)
    if tasks is None:
        return 1
    nodes = _count(job.get("min_nodes"), NO_VAL) or 1
    return max(1, tasks - nodes + 1)


def check_mps_tasks(t: Tables, job, requests: list[Gres]) -> Violation | None:
    """MPS limits are per client process: a job with several tasks on a node would hold its share once per task."""
    mps = next((r for r in requests if r.name == "mps"), None)
    if mps is None:
        return None
    n = tasks_per_node(job)
    if n < 2:
        return None
    return violation("mps_tasks", n=n, units=mps.count, isolation=t.texts["isolation"])


def allowed_of(t: Tables, con: constraint.Constraint | None) -> frozenset[str] | None:
    """The node groups a constraint allows (by name); None when it narrows nothing (none, or not read)."""
    if con is None or not con.op:
        return None
    return frozenset(g.name for tier in t.tiers for g in tier.groups if con.allows(g.features))


def _groups(t: Tables, allowed: frozenset[str]) -> list[GroupCaps]:
    return [g for tier in t.tiers for g in tier.groups if g.name in allowed]


def _models(t: Tables, groups: list[GroupCaps]) -> str:
    return ", ".join(m for m in t.model_features if any(g.model == m for g in groups))


def check_constraint(t: Tables, con: constraint.Constraint, requests: list[Gres]) -> list[Violation]:
    unknown = [n for n in con.names if n not in t.features]
    if unknown:
        return [_unknown_feature(t, n) for n in unknown]
    allowed = allowed_of(t, con)
    if allowed is None:
        return []
    groups = _groups(t, allowed)
    if not groups:
        return [
            violation(
                "constraint_none",
                constraint=con.text,
                models=t.texts["model_features"],
                example=t.texts["constraint_example"],
            )
        ]
    caps = merged("", groups)
    offered = JOIN["offers"].join(offers(caps.gpu, caps.shared))
    return [
        violation("constraint_request", key=r.key, constraint=con.text, models=_models(t, groups), offers=offered)
        for r in requests
        if not serves(caps, r)
    ]


def _unknown_feature(t: Tables, name: str) -> Violation:
    low = name.lower()
    hint = message("hint_feature_lower", low=low) if low != name and low in t.features else ""
    others = t.texts["other_features"]
    more = message("hint_other_features", features=others) if others else ""
    return violation("unknown_feature", name=name, hint=hint, models=t.texts["model_features"], others=more)


def routable(caps: TierCaps, r: Gres, set_type: bool) -> bool:
    """Routing (rule 5) may pick this tier for ``r``: it serves it, and gives an untyped gpu request its meaning
    (rule 5b)."""
    untyped = r.name == "gpu" and not r.type
    return serves(caps, r) and (not untyped or untyped_target(caps, caps, set_type) is not None)


def serves(tier: TierCaps, r: Gres) -> bool:
    if r.name == "gpu":
        return (r.type in tier.gpu or r.type in tier.slices) if r.type else bool(tier.gpu)
    per = tier.shared.get(r.name, {})
    return r.type in per and r.count <= per[r.type]


def _place(t: Tables, job, parsed, modify, current, route=None, allowed=None) -> Decision:
    """An accepted GPU job: its partition (routing) and the fields to rewrite (aliases, a single GPU type).

    ``current``: the job's partition and extra field before an update (None, None on submission).
    A changed field is written whole in this Slurm's format, so Slurm parses
    what we wrote, not a mix of the user's and ours.
    """
    current_partition, current_extra = current
    requests = [e for entries in parsed.values() for e in entries if isinstance(e, Gres)]
    to = ",".join(route.tiers) if route and route.tiers else None  # a class route names the tiers
    tiers, partition = job_tiers(
        t, job.get("partition") or to or (current_partition if modify else None), requests, modify, allowed
    )
    partition = partition or to
    untyped = next((r for r in requests if r.name == "gpu" and not r.type), None)
    target = jobs_target(t, tiers, allowed) if untyped else ""
    if untyped and target is None:
        return Decision(False, (untyped_violation(t, untyped, tiers, allowed),))
    typed = {n: [_typed(e, target or "") for e in v] for n, v in parsed.items()}
    where = job.get("partition") or current_partition or ""
    own = own_extra(t, tiers, job, modify, current_extra, where)
    if own:
        return Decision(False, (own,))
    bad, carried, record = per_job(tiers, typed, where)
    if bad:
        return Decision(False, tuple(bad))
    fields: dict[str, str] = {}
    for name, entries in parsed.items():
        new = carried[name]
        if any(isinstance(e, Gres) and (e.alias or e is not o) for e, o in zip(new, entries, strict=False)):
            fields[name] = ",".join(e.text(t.prefix) if isinstance(e, Gres) else e.raw for e in new)
    qos, maybe = tier_qos(job, tiers, modify)
    return Decision(True, (), partition, fields, qos, record, maybe)


def own_extra(
    t: Tables, tiers: list[TierCaps], job, modify: bool, current_extra: str | None, partition: str
) -> Violation | None:
    """Per-job tiers own the extra field (tables.RECORD_FIELD): PER_JOB_EXTRA for a job on one that brings its own
    (a non-empty --extra), and for an update that sets it (even to '') on a job there or one that carries the record.
    A site without per-job GPUs checks nothing (its job_submit.lua has none of per-job MIG's texts)."""
    mine = job.get(RECORD_FIELD)
    if mine is None or (mine == "" and not modify) or not any(x.slices for x in t.tiers):
        return None
    slicing = [x for x in tiers if x.slices]
    carries = modify and (current_extra or "").startswith(RECORD_PREFIX)
    if not slicing and not carries:
        return None
    return violation("per_job_extra", partition=partition or (slicing[0].name if slicing else ""))


def per_job(tiers: list[TierCaps], parsed, partition: str):
    """Per-job MIG slices to their carrier shards: (violations, the entries, the extra field's record or None)."""
    slicing = [x for x in tiers if x.slices]
    if not slicing:
        return [], parsed, None
    requests = [e for v in parsed.values() for e in v if isinstance(e, Gres)]
    where = partition or slicing[0].name
    if any(r.name == "shard" for r in requests):
        return [violation("per_job_shard", partition=where, example=next(iter(slicing[0].slices)))], parsed, None
    slices = [r for r in requests if r.name == "gpu" and any(r.type in x.slices for x in tiers)]
    if not slices:
        return [], parsed, None
    r = slices[0]
    if len(slicing) < len(tiers):
        return [violation("per_job_tiers", type=r.type, partition=where)], parsed, None
    if r.field != "tres_per_node":
        return [violation("per_job_field", type=r.type, field=r.field)], parsed, None
    gpus = sum(e.count for e in requests if e.name == "gpu")
    if gpus > 1:
        return [violation("per_job_count", type=r.type, n=gpus)], parsed, None
    weight, profile = slicing[0].slices[r.type]
    carrier = replace(r, name="shard", type="", count=weight, alias=r.alias or r.type)
    out = {n: [carrier if e is r else e for e in v] for n, v in parsed.items()}
    return [], out, RECORD_PREFIX + profile


def untyped_violation(t: Tables, r: Gres, tiers: list[TierCaps], allowed) -> Violation:
    """UNTYPED: the (first) tier that refuses the untyped request, why, and a typed request to make instead."""
    targets = [untyped_target(x, within(x, allowed), t.set_gpu_type) for x in tiers]
    if None not in targets:
        return _untyped_apart(r, tiers, targets, allowed)
    tier = tiers[targets.index(None)]
    caps = within(tier, allowed)
    if tier.untyped == "refuse":
        reason, example = message("untyped_refuse"), (caps.whole or caps.gpu or (JOIN["none"],))[0]
    elif tier.untyped != "whole":
        reason, example = message("untyped_excluded", type=tier.untyped), tier.untyped
    else:
        others = [x for x in caps.gpu if x not in caps.whole]
        reason = message(
            "untyped_whole",
            whole=JOIN["offers"].join(caps.whole) or JOIN["none"],
            others=JOIN["offers"].join(others) or JOIN["none"],
        )
        example = (caps.whole or caps.gpu or (JOIN["none"],))[0]
    return replace(
        violation("untyped", key=r.raw, tier=tier.name, reason=reason, example=example, n=r.count), typed=example
    )


def _untyped_apart(r: Gres, tiers: list[TierCaps], targets: list, allowed) -> Violation:
    """UNTYPED where each of the job's tiers gives the request a meaning, but not the same one."""
    wholes = [within(x, allowed).whole for x in tiers]
    meanings = JOIN["tiers"].join(
        message("untyped_tier", tier=x.name, types=target or JOIN["offers"].join(whole) or JOIN["none"])
        for x, target, whole in zip(tiers, targets, wholes, strict=True)
    )
    example = next((x for x in targets if x), next((w[0] for w in wholes if w), JOIN["none"]))
    reason = message("untyped_tiers", meanings=meanings)
    out = violation("untyped", key=r.raw, tier=tiers[0].name, reason=reason, example=example, n=r.count)
    return replace(out, typed=example)


def jobs_target(t: Tables, tiers: list[TierCaps], allowed) -> str | None:
    """One target for all the job's tiers: theirs when they agree; '' when they differ and each serves only whole
    GPUs; None when refused."""
    if not tiers:
        return ""  # a partition that is not (only) tiers: not ours to say
    targets = [untyped_target(x, within(x, allowed), t.set_gpu_type) for x in tiers]
    if None in targets:
        return None
    if len(set(targets)) == 1:
        return targets[0]
    whole = all(all(g in within(x, allowed).whole for g in within(x, allowed).gpu) for x in tiers)
    return "" if whole else None


def tier_qos(job, tiers: list[TierCaps], modify: bool) -> tuple[str | None, str | None]:
    """(the QOS to set, the QOS set if the association may use it) for a new job that names none: its (first)
    tier's, as the tier's set_qos says; the second when that depends on the association and the job has no
    ``assoc_qos`` to say (rule 6)."""
    if modify or job.get("qos") or not tiers or tiers[0].set_qos == "never":
        return None, None
    name = tiers[0].name
    if tiers[0].set_qos == "always":
        return name, None
    allowed = job.get("assoc_qos")
    if allowed is None:
        return None, name
    return (name if name.lower() in {q.strip().lower() for q in allowed.split(",")} else None), None


def _typed(e: Gres | Other, target: str) -> Gres | Other:
    """An untyped gpu request gets the type rule 5b chose (typed TRES count only typed requests)."""
    if target and isinstance(e, Gres) and e.name == "gpu" and not e.type:
        return replace(e, type=target)
    return e


def within(tier: TierCaps, allowed: frozenset[str] | None) -> TierCaps:
    """What the tier serves on the groups a constraint allows (the whole tier when it allows all)."""
    if allowed is None:
        return tier
    return replace(merged(tier.name, [g for g in tier.groups if g.name in allowed]), untyped=tier.untyped)


def job_tiers(
    t: Tables, partition: str | None, requests: list[Gres], modify: bool, allowed: frozenset[str] | None = None
) -> tuple[list[TierCaps], str | None]:
    """The tiers the job can run in, and the partition to set (None: leave it)."""
    if partition:
        tiers = [t.tier(p) for p in partition.split(",")]
        return ([x for x in tiers if x is not None] if all(tiers) else []), None
    if t.route_by_gres and not modify:
        for tier in t.tiers:
            if all(routable(within(tier, allowed), r, t.set_gpu_type) for r in requests):
                return [tier], None if tier.is_default else tier.name
        for tier in t.tiers:  # none gives an untyped request its meaning: the first that serves it says why (UNTYPED)
            if all(serves(within(tier, allowed), r) for r in requests):
                return [tier], None if tier.is_default else tier.name
    return [t.default_tier], None
