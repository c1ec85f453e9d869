"""The planner on the live cluster: which MIG GPU should change layout for the jobs pending now. Pure.

Data in (a ``Snapshot`` of the queue, the running jobs and the nodes, read
through the Slurm client by ``snapshot_from_client``), a ``LivePlan`` out:
demand lines, proposals (one line each: who waits, what changes, what it
costs) and held lines (a change the policy's ``live:`` limits keep back).

The decision, per node with MIG GPUs:

- pending MIG jobs count once they have waited ``live.min_pending`` with a
  reason that says they wait for resources (``COUNTED_REASONS``); in
  priority order, those that fit idle instances of their type on an
  available node of their partition now are left to Slurm; the others are
  *blocked*;
- the node's MIG GPUs get their layouts together, in one drain (the node's
  GPU jobs must all end first: Slurm 24.11 requeues every job holding GRES on
  a node whose GRES count changes, so one drain should pay for every GPU
  that should change): GPU by GPU (greedy, in index order), every maximal
  layout of the catalogue (``candidate_layouts``) is scored by how many
  blocked jobs the whole node would start with it and the layouts already
  chosen for the GPUs before it, and replaces the GPU's layout only when it
  starts more than keeping it; the change's benefit is what the node starts
  with all its new layouts, minus what its present layouts would start once
  drained anyway;
- the best change of the node is proposed, or held with the limit that stops
  it: the node under relayout or drained/down by someone else, Slurm's GRES
  not the policy's, ``min_benefit_jobs``, ``min_dwell`` since the node's last
  change (thrash), a GPU job without an end time, ``max_wait``,
  ``max_draining`` per tier. Proposals are made greedily, best first, and the
  jobs a proposal starts are not counted again for another node.
"""

from __future__ import annotations

import copy
import math
import posixpath
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from hostlist import collect_hostlist, expand_hostlist

from ..hardware import GpuModel, check_layout
from ..errors import PolicyError
from ..policy import Site, build_site
from ..policy.groups import parse_indexes
from .layouts import plain_profiles

# squeue reasons of a job that waits for nodes or GRES (not held, not a limit of its account or QOS)
COUNTED_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required_for_job", "NodeDown")
RELAYOUT_REASON = "gpushare relayout"  # the drain reason of a node under (or failed in) relayout starts so
# node flags and base states under which a node starts no job
UNAVAILABLE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "MAINT",
                         "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED", "FUTURE",
                         "UNKNOWN", "INVALID_REG"})
_GROUP_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class PendingJob:
    job_id: int
    gres: str  # the typed GRES as Slurm shows it: "gpu:a100_40g_3g.20gb"
    count: int
    age_s: float
    priority: int
    reason: str
    partition: str  # Slurm's partition field: one name, or several joined by ','


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    node: str
    gres: dict[str, int]  # on this node: {"gpu:a100_40g_1g.5gb": 1}
    end_time: float | None  # epoch s, squeue EndTime (start + time limit); None: unknown


@dataclass(frozen=True)
class NodeView:
    name: str
    state: tuple[str, ...]
    reason: str
    gres: dict[str, int]  # configured typed GRES, as Slurm has them


@dataclass(frozen=True)
class Snapshot:
    now: float
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    nodes: dict[str, NodeView]
    changes: dict[str, float] = field(default_factory=dict)  # node -> epoch of its last change (or attempt)
    locked: frozenset[str] = frozenset()  # nodes whose gpushare-relayout-<node> reservation exists


@dataclass(frozen=True)
class Proposal:
    node: str
    gpu: int
    old_layout: tuple[str, ...]
    new_layout: tuple[str, ...]
    starts: dict[str, int]  # slurm gres type -> pending jobs the change lets start
    must_finish: tuple[int, ...]
    ready_in_s: float
    cost_s: float
    benefit: float  # pending jobs the change lets start, less those the present layout would start
    line: str
    # every GPU the change relayouts, in one drain: (gpu, old layout, new layout), in GPU order; gpu,
    # old_layout and new_layout above are the first of them
    changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = ()

    @property
    def layouts(self) -> dict[int, tuple[str, ...]]:
        """gpu -> new layout of every GPU the change relayouts (``with_layouts``' argument)."""
        return {g: tuple(new) for g, _old, new in self.changes} or {self.gpu: tuple(self.new_layout)}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Held:
    node: str
    gpu: int
    new_layout: tuple[str, ...]
    why: str
    changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = ()  # as Proposal.changes

    @property
    def line(self) -> str:
        if len(self.changes) > 1:
            to = " " + _to_text(self.changes)
        else:
            to = f" GPU {self.gpu} to {'+'.join(self.new_layout)}" if self.new_layout else ""
        return f"held: {self.node}{to}: {self.why}"

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line}


@dataclass(frozen=True)
class LivePlan:
    proposals: tuple[Proposal, ...]
    held: tuple[Held, ...]
    demand: tuple[str, ...]

    def report(self) -> list[str]:
        out = ["demand (pending GPU jobs by type):"] + [f"  {d}" for d in self.demand or ("none",)]
        out += ["proposals:"] + [f"  {p.line}" for p in self.proposals or ()]
        if not self.proposals:
            out.append("  none")
        if self.held:
            out += ["held back:"] + [f"  {h.line}" for h in self.held]
        return out

    def to_dict(self) -> dict:
        return {"demand": list(self.demand), "proposals": [p.to_dict() for p in self.proposals],
                "held": [h.to_dict() for h in self.held]}


# ---- reading the cluster ----------------------------------------------------------------------

def snapshot_from_client(client, site: Site, now: float, changes: dict[str, float] | None = None,
                         locked=frozenset()) -> Snapshot:
    """The queue, running GPU jobs and nodes as the Slurm client (slurm/) reads them (``jobs()``, ``nodes()``)."""
    pending, running = [], []
    for job in client.jobs():
        if job.state == "PENDING":
            if not job.gres_request:
                continue
            key = next((k for k in job.gres_request if k.startswith("gpu")), next(iter(job.gres_request)))
            age = max(0.0, now - job.submit_time) if job.submit_time else 0.0
            pending.append(PendingJob(job.job_id, key, int(job.gres_request[key]), age, int(job.priority or 0),
                                      job.reason, job.partition))
        elif job.gres_alloc:
            for node, use in job.gres_alloc.items():
                gres = {k: u.count for k, u in use.items() if u.count}
                if gres:
                    running.append(RunningJob(job.job_id, node, gres, float(job.end_time) if job.end_time else None))
    nodes = {n.name: NodeView(n.name, tuple(n.state), n.reason, dict(n.gres)) for n in client.nodes()}
    return Snapshot(now, tuple(pending), tuple(running), nodes, dict(changes or {}), frozenset(locked))


def live_policy_path(site: Site) -> str:
    """Where --apply writes the live policy: ``live.policy_file``, else gpushare-live.yaml beside slurm.conf."""
    return site.policy.live.policy_file or posixpath.join(site.cluster.paths.slurm_conf_dir, "gpushare-live.yaml")


def under_relayout(view: NodeView | None, locked: frozenset[str], name: str) -> bool:
    """The node holds a gpushare-relayout reservation or is drained with a gpushare relayout reason."""
    return name in locked or (view is not None and _drained(view) and view.reason.startswith(RELAYOUT_REASON))


# ---- the catalogue ----------------------------------------------------------------------------

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
def _candidates(model: GpuModel) -> tuple[tuple[tuple[str, ...], Counter, Counter], ...]:
    """(layout, profiles counted, 'gpu:<type>' counted) of every candidate layout of the model."""
    return tuple((lay, Counter(lay), Counter(f"gpu:{model.mig_slurm_type(p)}" for p in lay))
                 for lay in candidate_layouts(model))


# ---- the decision -----------------------------------------------------------------------------

@dataclass
class _Best:
    changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]  # (gpu, old, new) of every changed GPU
    new_served: list[PendingJob]
    dropped: list[PendingJob]
    benefit: int
    wait: float

    @property
    def gpu(self) -> int:
        return self.changes[0][0]

    @property
    def old(self) -> tuple[str, ...]:
        return self.changes[0][1]

    @property
    def new(self) -> tuple[str, ...]:
        return self.changes[0][2]


def plan_live(site: Site, snap: Snapshot, doc: dict | None = None) -> LivePlan:
    """``doc``: the policy document ``site`` was built from (default: the site's policy as data); a proposed
    layout is one ``with_layout(doc, ...)`` accepts."""
    live = site.policy.live
    doc = site.policy.model_dump(mode="json", exclude_unset=True) if doc is None else doc
    valid: dict = {}
    refused: dict = {}
    types = mig_types(site)
    counted = [p for p in snap.pending if p.reason.startswith(COUNTED_REASONS) and p.age_s >= live.min_pending]
    counted.sort(key=lambda p: (-p.priority, -p.age_s, p.job_id))
    tiers_of = {n: tuple(t.name for t in site.tiers if any(n in g.nodes for g in t.groups))
                for g in site.groups for n in g.nodes}
    running_on: dict[str, list[RunningJob]] = {}
    for r in snap.running:
        running_on.setdefault(r.node, []).append(r)

    tier_sets = {n: frozenset(t) for n, t in tiers_of.items()}
    partitions: dict[str, frozenset[str]] = {}

    def serves(node: str, job: PendingJob) -> bool:
        parts = partitions.get(job.partition)
        if parts is None:
            parts = partitions[job.partition] = frozenset(job.partition.split(","))
        return not parts.isdisjoint(tier_sets.get(node, ()))

    # what is idle now on nodes that start jobs
    free: dict[str, Counter] = {}
    for name, view in snap.nodes.items():
        use = Counter()
        for r in running_on.get(name, ()):
            use.update(r.gres)
        free[name] = Counter({k: v - use[k] for k, v in view.gres.items() if v - use[k] > 0})
    startable = {n for n, v in snap.nodes.items() if n in tiers_of and not _unavailable(v)
                 and not under_relayout(v, snap.locked, n)}
    blocked: list[PendingJob] = []
    idle_now = Counter()
    left = {n: Counter(free[n]) for n in startable}
    order = sorted(startable)
    for job in counted:
        if job.gres not in types:
            continue
        spot = next((n for n in order if left[n][job.gres] >= job.count and serves(n, job)), None)
        if spot is None:
            blocked.append(job)
        else:
            left[spot][job.gres] -= job.count
            idle_now[job.gres] += 1

    demand = _demand_lines(snap.pending, counted, blocked, idle_now, types, live.min_pending)
    held: list[Held] = []
    proposals: list[Proposal] = []
    draining: Counter = Counter()  # tier -> nodes under relayout (or proposed this run)
    mig_nodes = [n for g in site.groups if g.slots("mig") for n in g.nodes]
    for name in sorted(set(tiers_of)):
        if under_relayout(snap.nodes.get(name), snap.locked, name):
            draining.update(tiers_of[name])
    for name in mig_nodes:  # a node under relayout gets the policy's layout for it: the jobs it serves are coming
        if under_relayout(snap.nodes.get(name), snap.locked, name):
            caps = _caps(site, name)
            served = _serve(caps, [j for j in blocked if serves(name, j)])
            blocked = [j for j in blocked if j not in served]
            held.append(Held(name, -1, (), f"under relayout (reservation gpushare-relayout-{name} or drained "
                                         f"'{RELAYOUT_REASON}...'); its policy layout will start {len(served)} "
                                         "of the blocked jobs"))
    todo = []
    for name in mig_nodes:
        view = snap.nodes.get(name)
        if under_relayout(view, snap.locked, name):
            continue
        why = _mismatch(site, name, view)
        if why:
            held.append(Held(name, -1, (), why))
        else:
            todo.append(name)
    cache: dict[str, _Best | None] = {}  # scores stay good until a proposal takes jobs out of `blocked`
    while todo and blocked:
        scored = []
        for name in todo:
            if name not in cache:
                cache[name] = _best_change(site, doc, name, [j for j in blocked if serves(name, j)], valid, refused)
            if cache[name] is not None:
                scored.append((cache[name], name))
        if not scored:
            break
        scored.sort(key=lambda bn: (-bn[0].benefit, _ready(snap.now, running_on.get(bn[1], [])), -bn[0].wait, bn[1]))
        best, name = scored[0]
        todo.remove(name)
        why, must_finish, ready_in = _limits(site, snap, name, best, running_on.get(name, []), tiers_of[name], draining)
        if why:
            held.append(Held(name, best.gpu, best.new, why, best.changes))
            continue
        draining.update(tiers_of[name])
        taken = {j.job_id for j in best.new_served}
        blocked = [j for j in blocked if j.job_id not in taken]
        cache.clear()
        proposals.append(_proposal(site, snap, name, best, must_finish, ready_in, free.get(name, Counter()),
                                   counted, types))
    chosen = {p.node: p.benefit for p in proposals}
    already = {h.node for h in held}  # held for another reason: that reason is the one to read
    for name, (best, why) in sorted(refused.items()):
        if name not in already and best.benefit > chosen.get(name, 0):
            held.append(Held(name, best.gpu, best.new, f"would let {best.benefit} pending job(s) start, but the "
                                                        f"policy refuses the layout: {why}", best.changes))
    return LivePlan(tuple(proposals), tuple(held), tuple(demand))


def _limits(site, snap, name, best, running, tiers, draining) -> tuple[str, tuple[int, ...], float]:
    """Why the change is held back ('' when it is not), the GPU jobs that must finish first, and when they end."""
    live = site.policy.live
    view = snap.nodes.get(name)
    must_finish = tuple(sorted({r.job_id for r in running}))
    if view is None:
        return f"Slurm has no node {name}", must_finish, 0.0
    if _unavailable(view):
        return (f"{'+'.join(view.state)} by someone else (reason: {view.reason or 'none given'}); "
                "the live planner leaves it alone", must_finish, 0.0)
    if best.benefit < live.min_benefit_jobs:
        return (f"lets {best.benefit} more pending job(s) start; min_benefit_jobs is {live.min_benefit_jobs}",
                must_finish, 0.0)
    last = snap.changes.get(name)
    if last is not None and snap.now - last < live.min_dwell:
        return (f"changed (or tried) {_mins(snap.now - last)} ago; min_dwell is {_mins(live.min_dwell)}",
                must_finish, 0.0)
    unknown = sorted({r.job_id for r in running if r.end_time is None})
    if unknown:
        return (f"job(s) {_ids(unknown, 8)} on the node have no end time (no time limit?): cannot bound the wait",
                must_finish, 0.0)
    ready_in = _ready(snap.now, running)
    if ready_in > live.max_wait:
        return (f"job(s) {_ids(must_finish, 8)} must finish first, the last in {_mins_up(ready_in)}; max_wait is "
                f"{_mins(live.max_wait)}", must_finish, ready_in)
    full = [t for t in tiers if draining[t] >= live.max_draining]
    if full:
        return (f"tier {', '.join(full)} already has {max(draining[t] for t in full)} node(s) under relayout; "
                f"max_draining is {live.max_draining}", must_finish, ready_in)
    return "", must_finish, ready_in


def _mismatch(site: Site, name: str, view: NodeView | None) -> str:
    """Why the node's GPU GRES in Slurm are not the policy's ('' when they are)."""
    if view is None:
        return "Slurm has no such node: the policy is not the one Slurm runs"
    want = {k: v for k, v in _caps(site, name).items()}
    have = {k: v for k, v in view.gres.items() if k.startswith("gpu:")}
    if want == have:
        return ""
    return (f"Slurm has Gres {_gres_text(have)}, the policy {_gres_text(want)}: a change or reconfigure is under "
            "way, or Slurm does not run this policy; the live planner leaves the node alone")


def _best_change(site: Site, doc: dict, name: str, jobs: list[PendingJob], valid: dict,
                 refused: dict) -> _Best | None:
    """The node's new MIG layouts that start the most of ``jobs`` (net), chosen together for one drain, among the
    sets of layouts the policy accepts (``with_layouts`` validates the node's whole set: an alias or tier type the
    site names must stay). GPU by GPU in index order (greedy): the catalogue layout that, with the layouts chosen
    for the GPUs before it, starts the most jobs on the node replaces the GPU's layout when it starts more than
    keeping it (ties: the older jobs, then the smaller change, then the catalogue's order). ``refused[name]``:
    the set chosen without the policy's check, and why the policy refuses it (when it does)."""
    if not jobs:
        return None
    by_type: dict[str, list[PendingJob]] = {}
    for job in jobs:
        by_type.setdefault(job.gres, []).append(job)
    base = _caps(site, name)
    slots = site.group_for_node(name).slots("mig")
    plain = _choose(slots, base, by_type, None)
    refused.pop(name, None)
    if plain is None:
        return None
    why = _refusal(doc, name, plain.changes, valid)
    if not why:
        return plain
    refused[name] = (plain, why)
    return _choose(slots, base, by_type, lambda changes: not _refusal(doc, name, changes, valid))


def _refusal(doc: dict, name: str, changes, valid: dict) -> str:
    """Why the policy refuses these layouts of the node ('' when it accepts them); cached in ``valid``."""
    key = (name, tuple((g, new) for g, _old, new in changes))
    if key not in valid:
        try:
            with_layouts(doc, name, {g: new for g, _old, new in changes})
            valid[key] = ""
        except PolicyError as exc:
            valid[key] = "; ".join(f"{p.path}: {p.message}" if p.path else p.message for p in exc.problems[:2])
        except ValueError as exc:
            valid[key] = str(exc)
    return valid[key]


def _choose(slots, base: Counter, by_type: dict[str, list[PendingJob]], accept) -> _Best | None:
    """The greedy choice of ``_best_change``; ``accept(changes)`` (when given) must accept the set chosen so far
    with each GPU's new layout, else the GPU's next best layout is tried, else the GPU keeps its layout."""
    memo: dict[tuple[str, int], tuple[int, float]] = {}

    def served(t: str, cap: int) -> tuple[int, float]:
        got = memo.get((t, cap))
        if got is None:
            js = _serve_type(cap, by_type[t])
            got = memo[(t, cap)] = (len(js), sum(j.age_s for j in js))
        return got

    caps = Counter(base)
    changes: list[tuple[int, tuple[str, ...], tuple[str, ...]]] = []
    for slot in slots:
        old = Counter(f"gpu:{t}" for t in slot.mig_types())
        old_profiles = Counter(slot.layout)
        keep = [served(t, caps[t]) for t in by_type]
        keep_n = sum(n for n, _ in keep)
        scored = []
        for layout, profiles, types in _candidates(slot.model):
            if profiles == old_profiles:
                continue
            n = wait = 0
            for t in by_type:
                k, w = served(t, caps[t] - old[t] + types[t])
                n += k
                wait += w
            if n <= keep_n:
                continue
            moved = sum(((profiles - old_profiles) + (old_profiles - profiles)).values())
            scored.append(((-n, -wait, moved, layout), layout, types))
        for _key, layout, types in sorted(scored, key=lambda s: s[0]):
            change = (slot.index, tuple(slot.layout), tuple(layout))
            if accept is None or accept(tuple(changes) + (change,)):
                changes.append(change)
                caps = caps - old + types
                break
    if not changes:
        return None
    gained, dropped, wait = [], [], 0.0
    for t, js in by_type.items():
        before = _serve_type(base[t], js)
        after = _serve_type(caps[t], js)
        was = {j.job_id for j in before}
        now_ids = {j.job_id for j in after}
        gained += [j for j in after if j.job_id not in was]
        dropped += [j for j in before if j.job_id not in now_ids]
    benefit = len(gained) - len(dropped)
    if benefit <= 0:
        return None
    wait = sum(j.age_s for j in gained) - sum(j.age_s for j in dropped)
    return _Best(tuple(changes), gained, dropped, benefit, wait)


def _serve_type(cap: int, jobs: list[PendingJob]) -> list[PendingJob]:
    """``_serve`` for jobs of one type on ``cap`` instances of it."""
    out = []
    for job in jobs:
        if cap <= 0:
            break
        if job.count <= cap:
            cap -= job.count
            out.append(job)
    return out


def _ready(now: float, running: list[RunningJob]) -> float:
    """Seconds until the last of these jobs ends by its time limit (inf when one has none)."""
    if any(r.end_time is None for r in running):
        return math.inf
    return max([0.0] + [r.end_time - now for r in running])


def _caps(site: Site, name: str) -> Counter:
    group = site.group_for_node(name)
    return Counter({f"{n}:{t}": c for (n, t), c in group.gres.items() if n == "gpu"})


def _serve(caps: Counter, jobs: list[PendingJob]) -> list[PendingJob]:
    """The jobs (in the order given: priority) that start on an empty node with these GRES counts."""
    left, out = Counter(caps), []
    for job in jobs:
        if left[job.gres] >= job.count:
            left[job.gres] -= job.count
            out.append(job)
    return out


def _proposal(site, snap, name, best: _Best, must_finish, ready_in, free: Counter, counted, types) -> Proposal:
    live = site.policy.live
    group = site.group_for_node(name)
    starts = Counter(j.gres.split(":", 1)[1] for j in best.new_served)
    main = starts.most_common(1)[0][0]
    waiting = [j for j in counted if j.gres == f"gpu:{main}"]
    oldest = max(j.age_s for j in waiting)
    old = Counter()  # the changed GPUs' present instances (which GPU a running job holds: not in the snapshot)
    for gpu, _old, _new in best.changes:
        old.update(group.gpus[gpu].layout)
    model = group.gpus[best.gpu].model
    idle = []
    for profile, n in sorted(old.items(), key=lambda pn: (-pn[1], pn[0])):
        k = min(n, free[f"gpu:{model.mig_slurm_type(profile)}"])
        idle.append(f"{n} idle {profile} slices" if k == n else f"{k} of {n} {profile} slices idle")
    gpus = [g for g, _old, _new in best.changes]
    has = f"GPU {gpus[0]} has" if len(gpus) == 1 else f"GPUs {_index_text(gpus)} have"
    lets = f"lets {sum(starts.values())} start" if len(starts) == 1 else \
        "lets " + ", ".join(f"{n} {t}" for t, n in sorted(starts.items())) + " start"
    if best.dropped:
        lets += f" ({len(best.dropped)} pending that the present layout would start wait longer)"
    if must_finish:
        many = len(must_finish) > 1
        if ready_in > 0:
            when = f"{'the last ' if many else ''}ends in {_mins_up(ready_in)}"
        else:
            when = f"at {'their' if many else 'its'} time limit now"
        first = f"job{'s' if many else ''} {_ids(must_finish, 8)} must finish ({when})"
    else:
        first = "no GPU job on the node"
    to = f"to {'+'.join(best.new)}" if len(best.changes) == 1 else _to_text(best.changes)
    line = (f"{len(waiting)} job{'s have' if len(waiting) != 1 else ' has'} waited {_mins(oldest)} for {main}; "
            f"{name} {has} {', '.join(idle)}: relayout {to} {lets}; "
            f"cost: {first} + {_mins_up(live.change_cost)} drain and re-registration")
    return Proposal(name, best.gpu, tuple(best.old), tuple(best.new), dict(sorted(starts.items())), must_finish,
                    ready_in, ready_in + live.change_cost, float(best.benefit), line, tuple(best.changes))


def _to_text(changes) -> str:
    """'GPU 0 to A and GPUs 1-2 to B': the new layouts of the changed GPUs, GPUs with the same one together."""
    by_layout: dict[tuple[str, ...], list[int]] = {}
    for gpu, _old, new in changes:
        by_layout.setdefault(tuple(new), []).append(gpu)
    parts = [f"GPU{'s' if len(g) > 1 else ''} {_index_text(sorted(g))} to {'+'.join(new)}"
             for new, g in sorted(by_layout.items(), key=lambda ng: min(ng[1]))]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def _demand_lines(pending, counted, blocked, idle_now, types, min_pending) -> list[str]:
    by_type: dict[str, list[PendingJob]] = {}
    for p in pending:
        by_type.setdefault(p.gres, []).append(p)
    counted_ids = {p.job_id for p in counted}
    blocked_by = Counter(p.gres for p in blocked)
    out = []
    for key in sorted(by_type):
        jobs = by_type[key]
        name = key.split(":", 1)[1] if key in types else key
        n_counted = sum(1 for p in jobs if p.job_id in counted_ids)
        line = (f"{name}: {len(jobs)} pending, {n_counted} for >= {_mins(min_pending)} for resources "
                f"(oldest {_mins(max(p.age_s for p in jobs))})")
        if key in types:
            line += f"; {idle_now[key]} fit idle instances now, {blocked_by[key]} blocked"
        else:
            line += "; not a MIG type: the live planner changes MIG layouts only"
        out.append(line)
    return out


# ---- the policy with a node's new layout -----------------------------------------------------

def with_layout(site_doc: dict, node: str, gpu: int, layout: tuple[str, ...]) -> dict:
    """``with_layouts`` for one GPU."""
    return with_layouts(site_doc, node, {gpu: layout})


def with_layouts(site_doc: dict, node: str, layouts: dict[int, tuple[str, ...]]) -> dict:
    """The policy document with ``node`` split out of its node group into a group of its own ("<group>-<node>",
    added to every tier that had the group) whose GPUs get the MIG layouts ``layouts`` (gpu -> layout); every other
    GPU and node unchanged. A node alone in its group keeps the group. The whole set is validated (``build_site``)
    before the document is returned: PolicyError (a type an alias names dropped, say); ValueError for a node or
    GPU the policy has not, or a GPU not shared by MIG."""
    if not layouts:
        raise ValueError(f"node {node}: no GPU layout given (a mapping gpu -> MIG layout)")
    doc = copy.deepcopy(site_doc)
    groups = doc.get("node_groups") or []
    for i, group in enumerate(groups):
        nodes = expand_hostlist(str(group.get("nodes", "")))
        if node in nodes:
            break
    else:
        raise ValueError(f"node {node!r} is in no node group of the policy; groups: "
                         f"{', '.join(str(g.get('name')) for g in groups)}")
    count = int(group["gpu"]["count"])
    for gpu in sorted(layouts):
        if not 0 <= gpu < count:
            raise ValueError(f"GPU {gpu} of node {node}: node group {group['name']} has {count} GPU(s), "
                             f"0-{count - 1}")
    sharing, found = [], set()
    for entry in group.get("sharing") or []:
        indexes = parse_indexes(entry["gpus"], count)
        mine = [x for x in indexes if x in layouts]
        if not mine:
            sharing.append(entry)
            continue
        if str(entry.get("mode", "")).lower() != "mig":
            raise ValueError(f"GPU {mine[0]} of node {node} is shared by mode {entry.get('mode')} in node group "
                             f"{group['name']}, not mig: the live planner changes MIG layouts only")
        rest = [x for x in indexes if x not in layouts]
        if rest:
            sharing.append({**entry, "gpus": _index_text(rest)})
        for gpu in mine:
            sharing.append({"gpus": gpu, "mode": "mig", "layout": list(layouts[gpu])})
        found.update(mine)
    missing = sorted(set(layouts) - found)
    if missing:
        raise ValueError(f"GPU {missing[0]} of node {node} has no MIG sharing entry in node group {group['name']} "
                         "(an exclusive GPU): the live planner changes MIG layouts only")
    sharing.sort(key=lambda e: parse_indexes(e["gpus"], count)[0])
    if len(nodes) == 1:
        group["sharing"] = sharing
    else:
        taken = {str(g.get("name")) for g in groups}
        name = _group_name(f"{group['name']}-{node}", taken)
        groups.insert(i + 1, {**copy.deepcopy(group), "name": name, "nodes": node, "sharing": sharing})
        group["nodes"] = collect_hostlist([n for n in nodes if n != node])
        for tier in doc.get("tiers") or []:
            names = tier.get("node_groups") or []
            if group["name"] in names:
                names.insert(names.index(group["name"]) + 1, name)
    what = ", ".join(f"GPU {g} as {'+'.join(layouts[g])}" for g in sorted(layouts))
    build_site(doc, f"live policy ({node} {what})")
    return doc


def _group_name(wanted: str, taken: set[str]) -> str:
    base = _GROUP_NAME.sub("-", wanted)
    if not base[:1].isalpha():
        base = "g" + base
    base = base[:63]
    name, n = base, 2
    while name in taken:
        suffix = f"-{n}"
        name, n = base[:63 - len(suffix)] + suffix, n + 1
    return name


def _index_text(indexes: list[int]) -> int | str:
    if len(indexes) == 1:
        return indexes[0]
    runs, start = [], indexes[0]
    for a, b in zip(indexes, indexes[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ",".join(runs)


# ---- small helpers -----------------------------------------------------------------------------

def _drained(view: NodeView) -> bool:
    return any(s in ("DRAIN", "DRAINED", "DRAINING") for s in view.state)


def _unavailable(view: NodeView) -> bool:
    return any(s in UNAVAILABLE for s in view.state)


def _mins(seconds: float) -> str:
    return f"{int(seconds // 60)} min"


def _mins_up(seconds: float) -> str:
    return f"{math.ceil(seconds / 60)} min"


def _ids(ids, most: int | None = None) -> str:
    ids = list(ids)
    if most is not None and len(ids) > most:
        return ",".join(str(i) for i in ids[:most - 1]) + f" and {len(ids) - most + 1} more"
    return ",".join(str(i) for i in ids)


def _gres_text(gres: dict[str, int]) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted(gres.items())) or "none"
