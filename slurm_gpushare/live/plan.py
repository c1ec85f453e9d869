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
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from hostlist import collect_hostlist, expand_hostlist

from ..hardware import GpuModel, check_layout
from ..errors import PolicyError
from ..policy import Site, build_site
from ..policy.groups import parse_indexes
from . import modes as livemodes
from . import weights as liveweights
from .modes import mode_text
from ..planner.layouts import plain_profiles

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
class RecentJob:
    """A job that ran on ``node`` and ended within ``live.history_window`` (sacct, ``Snapshot.history``)."""

    job_id: str
    node: str
    gres: dict[str, int]  # what it held: {"gpu:a100_40g_1g.5gb": 1}, {"mps": 50}, {"shard:l40s": 2}
    start: float
    end: float


@dataclass(frozen=True)
class NodeView:
    name: str
    state: tuple[str, ...]
    reason: str
    gres: dict[str, int]  # configured typed GRES, as Slurm has them
    weight: int | None = None  # Slurm's scheduling weight now (None: not read)


@dataclass(frozen=True)
class Snapshot:
    now: float
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    nodes: dict[str, NodeView]
    changes: dict[str, float] = field(default_factory=dict)  # node -> epoch of its last change (or attempt)
    locked: frozenset[str] = frozenset()  # nodes whose gpushare-relayout-<node> reservation exists
    history: tuple[RecentJob, ...] = ()  # jobs that ended within live.history_window, one per node they ran on
    steered: dict[str, int] = field(default_factory=dict)  # node -> the weight the live planner set (state file)


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
    # a mode change instead (old_layout/new_layout then hold the first GPU's old and new mode as text):
    # (gpu, old mode text, new sharing entry) of every GPU it changes, ``with_modes``' argument as pairs
    modes: tuple[tuple[int, str, dict], ...] = ()

    @property
    def layouts(self) -> dict[int, tuple[str, ...]]:
        """gpu -> new layout of every GPU the change relayouts (``with_layouts``' argument); {} for a mode change."""
        if self.modes:
            return {}
        return {g: tuple(new) for g, _old, new in self.changes} or {self.gpu: tuple(self.new_layout)}

    @property
    def sharing(self) -> dict[int, dict]:
        """gpu -> new sharing entry of every GPU a mode change changes (``with_modes``' argument)."""
        return {g: dict(new) for g, _old, new in self.modes}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Held:
    node: str
    gpu: int
    new_layout: tuple[str, ...]
    why: str
    changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = ()  # as Proposal.changes
    modes: tuple[tuple[int, str, dict], ...] = ()  # as Proposal.modes

    @property
    def line(self) -> str:
        if self.modes:
            to = " " + ", ".join(f"GPU {g} {old} -> {mode_text(new)}" for g, old, new in self.modes)
        elif len(self.changes) > 1:
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
    history: tuple[str, ...] = ()  # GPU jobs ended within live.history_window, by type and node
    weights: tuple[liveweights.WeightChange, ...] = ()  # node weight changes (no drain)

    def report(self) -> list[str]:
        out = ["demand (pending GPU jobs by type):"] + [f"  {d}" for d in self.demand or ("none",)]
        if self.history:
            out += ["history (GPU jobs ended within live.history_window, by type):"] + [f"  {h}" for h in self.history]
        out += ["proposals:"] + [f"  {p.line}" for p in self.proposals or ()]
        if not self.proposals:
            out.append("  none")
        if self.weights:
            out += ["weights:"] + [f"  {w.line}" for w in self.weights]
        if self.held:
            out += ["held back:"] + [f"  {h.line}" for h in self.held]
        return out

    def to_dict(self) -> dict:
        return {"demand": list(self.demand), "proposals": [p.to_dict() for p in self.proposals],
                "held": [h.to_dict() for h in self.held], "history": list(self.history),
                "weights": [w.to_dict() for w in self.weights]}


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
    nodes = {n.name: NodeView(n.name, tuple(n.state), n.reason, dict(n.gres), n.weight) for n in client.nodes()}
    window = site.policy.live.history_window
    history = recent_from_records(client.recent_jobs(now - window, now)) if window > 0 else ()
    return Snapshot(now, tuple(pending), tuple(running), nodes, dict(changes or {}), frozenset(locked), history)


def recent_from_records(records) -> tuple[RecentJob, ...]:
    """``slurm.history.FinishedJob`` records (the client's ``recent_jobs``) as one RecentJob per node a GPU job
    ran on; the untyped ``gpu`` total is dropped where a typed ``gpu:<type>`` says the same."""
    out = []
    for rec in records:
        gres = {k: int(v) for k, v in rec.gres.items() if v and k.split(":", 1)[0] in ("gpu", "mps", "shard")}
        if any(k.startswith("gpu:") for k in gres):
            gres.pop("gpu", None)
        if gres:
            out += [RecentJob(str(rec.job_id), node, gres, float(rec.start), float(rec.end)) for node in rec.nodes]
    return tuple(out)


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

@dataclass(frozen=True)
class _History:
    """What a node ran in the history window, as the cost of taking capacity away from it.

    A change holds the node for ``min_dwell`` at least; the recent mix goes on arriving at its rate
    meanwhile, so the jobs of type ``t`` expected in that time are ``jobs[t] * min_dwell / window``. A change
    that leaves the node ``caps[t]`` of its ``base[t]`` instances (slots, units) of ``t`` turns away the share
    ``(base[t] - caps[t]) / base[t]`` of them: the *stranded* jobs, subtracted from the change's benefit."""

    jobs: dict[str, int]  # GRES key -> jobs that ran on the node in the window (each once)
    base: dict[str, int]  # GRES key -> what the node has of it now
    dwell: float  # live.min_dwell
    window: float  # live.history_window

    @property
    def scale(self) -> float:
        return self.dwell / self.window

    def stranded(self, caps) -> float:
        return sum(self._lost(t, caps) for t in self.jobs)

    def _lost(self, t: str, caps) -> float:
        have = self.base.get(t, 0)
        if have <= 0 or caps.get(t, 0) >= have:
            return 0.0
        return self.jobs[t] * self.scale * (have - max(0, caps.get(t, 0))) / have

    def text(self, caps) -> str:
        """'the last 6 h ran 24 jobs of a100_40g_1g.5gb here: 4.0 expected within min_dwell (60 min), the change
        removes 7 of its 7' for every type the change takes capacity from ('' when none)."""
        parts = []
        for t in sorted(self.jobs, key=lambda t: (-self._lost(t, caps), t)):
            if self._lost(t, caps) > 0:
                have = self.base[t]
                parts.append(f"{self.jobs[t]} job{'s' if self.jobs[t] != 1 else ''} of {_type_name(t)} "
                             f"({self.jobs[t] * self.scale:.1f} expected within min_dwell {_mins(self.dwell)}; the "
                             f"change keeps {max(0, caps.get(t, 0))} of {have})")
        if not parts:
            return ""
        return f"the last {_hours(self.window)} ran " + ", ".join(parts)


def _history_of(site: Site, ran, base) -> _History | None:
    """A node's ``_History`` from the RecentJobs that ``ran`` there (None: no history window, no min_dwell, or
    nothing of its GRES ran there)."""
    live = site.policy.live
    if live.history_window <= 0 or live.min_dwell <= 0:
        return None
    jobs: Counter = Counter()
    for r in ran:
        for key in {_kind(k) for k in r.gres}:
            if base.get(key, 0) > 0:
                jobs[key] += 1
    if not jobs:
        return None
    return _History(dict(jobs), {k: v for k, v in base.items() if v > 0}, float(live.min_dwell),
                    float(live.history_window))


def _kind(key: str) -> str:
    """A GRES key as the planner counts it: 'gpu:<type>' as is, 'shard:l40s' / 'mps:x' as 'shard' / 'mps'."""
    name = key.split(":", 1)[0]
    return name if name in ("mps", "shard") else key


def _type_name(key: str) -> str:
    return key.split(":", 1)[1] if key.startswith("gpu:") else key


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else _mins(seconds)


@dataclass
class _Best:
    changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]  # (gpu, old, new) of every changed GPU
    new_served: list[PendingJob]
    dropped: list[PendingJob]
    benefit: float  # jobs started, less those the present layout would start, less the stranded recent mix
    wait: float
    caps: Counter = field(default_factory=Counter)  # the node's GPU GRES after the change
    stranded: float = 0.0  # recent-mix jobs the change would turn away over min_dwell (_History)
    history: str = ""  # _History.text of the change ('' without one)
    modes: tuple[tuple[int, str, dict], ...] = ()  # a mode change (livemodes): (gpu, old text, new entry)

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
    free_kind: dict[str, Counter] = {}  # by _kind: Slurm names a node's shards 'shard:l40s', a job's 'shard'
    for name, view in snap.nodes.items():
        use = Counter()
        for r in running_on.get(name, ()):
            use.update(r.gres)
        free[name] = Counter({k: v - use[k] for k, v in view.gres.items() if v - use[k] > 0})
        have, used = _by_kind(view.gres), _by_kind(use)
        free_kind[name] = Counter({k: v - used[k] for k, v in have.items() if v - used[k] > 0})
    startable = {n for n, v in snap.nodes.items() if n in tiers_of and not _unavailable(v)
                 and not under_relayout(v, snap.locked, n)}
    blocked: list[PendingJob] = []
    idle_now = Counter()
    left = {n: Counter(free[n]) for n in startable}
    mode_kinds = livemodes.kinds(site) if live.modes else frozenset()
    weight_kinds = frozenset(k for g in site.groups for n in g.nodes[:1]
                             for k in liveweights.whole_types(site, n)) if live.weights else frozenset()
    tracked = mode_kinds | weight_kinds
    left_kind = {n: Counter(free_kind[n]) for n in startable} if tracked else {}
    order = sorted(startable)
    for job in counted:
        if job.gres in types:
            have, key = left, job.gres
        elif _kind(job.gres) in tracked:
            have, key = left_kind, _kind(job.gres)
        else:
            continue
        spot = next((n for n in order if have[n][key] >= job.count and serves(n, job)), None)
        if spot is None:
            blocked.append(job)
        else:
            have[spot][key] -= job.count
            idle_now[job.gres] += 1

    demand = _demand_lines(snap.pending, counted, blocked, idle_now, types, live.min_pending, mode_kinds,
                           weight_kinds)
    weights = liveweights.plan_weights(site, snap, blocked, serves, startable, running_on, _kind) if live.weights \
        else []
    held: list[Held] = []
    proposals: list[Proposal] = []
    draining: Counter = Counter()  # tier -> nodes under relayout (or proposed this run)
    mode_groups = {g.name for g in site.groups if mode_kinds and any(len(livemodes.options(site, s)) > 1
                                                                     for s in g.gpus)}
    mig_nodes = [n for g in site.groups if g.slots("mig") or g.name in mode_groups for n in g.nodes]
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
    ran: dict[str, list[RecentJob]] = {}
    for r in snap.history:
        ran.setdefault(r.node, []).append(r)
    history = {name: _history_of(site, ran.get(name, ()), _caps(site, name)) for name in todo}
    modal = [name for name in todo if site.group_for_node(name).name in mode_groups]
    mode_history = {name: _history_of(site, ran.get(name, ()), livemodes.capacity(*_entries(site, name)))
                    for name in modal}
    while todo and blocked:
        scored = []
        for name in todo:
            if name not in cache:
                mine = [j for j in blocked if serves(name, j)]
                mig = _best_change(site, doc, name, [j for j in mine if j.gres in types], valid, refused,
                                   history[name]) if site.group_for_node(name).slots("mig") else None
                mode = _best_modes(site, doc, name, mine, valid, mode_history[name]) if name in mode_history \
                    else None
                cache[name] = mode if mode is not None and (mig is None or mode.benefit > mig.benefit) else mig
            if cache[name] is not None:
                scored.append((cache[name], name))
        if not scored:
            break
        scored.sort(key=lambda bn: (-bn[0].benefit, _ready(snap.now, running_on.get(bn[1], [])), -bn[0].wait, bn[1]))
        best, name = scored[0]
        todo.remove(name)
        why, must_finish, ready_in = _limits(site, snap, name, best, running_on.get(name, []), tiers_of[name], draining)
        if why:
            held.append(Held(name, best.gpu, best.new, why, best.changes, best.modes))
            continue
        draining.update(tiers_of[name])
        taken = {j.job_id for j in best.new_served}
        blocked = [j for j in blocked if j.job_id not in taken]
        cache.clear()
        make = _mode_proposal if best.modes else _proposal
        proposals.append(make(site, snap, name, best, must_finish, ready_in, free.get(name, Counter()),
                              counted, types))
    chosen = {p.node: p.benefit for p in proposals}
    already = {h.node for h in held}  # held for another reason: that reason is the one to read
    for name, (best, why) in sorted(refused.items()):
        if name not in already and best.benefit > chosen.get(name, 0):
            held.append(Held(name, best.gpu, best.new, f"would let {_num(best.benefit)} pending job(s) start, but the "
                                                        f"policy refuses the layout: {why}", best.changes))
    return LivePlan(tuple(proposals), tuple(held), tuple(demand), _history_lines(snap.history), tuple(weights))


def _history_lines(history) -> tuple[str, ...]:
    """'a100_40g_1g.5gb: 12 jobs (lab-mig01 9, lab-mig02 3)' per GRES kind, most jobs first."""
    per: dict[str, Counter] = {}
    for r in history:
        for key in {_kind(k) for k in r.gres}:
            per.setdefault(key, Counter())[r.node] += 1
    out = []
    for key, nodes in sorted(per.items(), key=lambda kn: (-sum(kn[1].values()), kn[0])):
        where = ", ".join(f"{n} {c}" for n, c in sorted(nodes.items(), key=lambda nc: (-nc[1], nc[0])))
        out.append(f"{_type_name(key)}: {sum(nodes.values())} job(s) ({where})")
    return tuple(out)


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
        if best.stranded:
            started = best.benefit + best.stranded
            return (f"{best.history}: it would strand {best.stranded:.1f} of them against the {_num(started)} "
                    f"pending job(s) it lets start (net {best.benefit:.1f}; min_benefit_jobs is "
                    f"{live.min_benefit_jobs})", must_finish, 0.0)
        return (f"lets {_num(best.benefit)} more pending job(s) start; min_benefit_jobs is {live.min_benefit_jobs}",
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
    # MPS units and shards too (a mode change keeps the gpu count and changes these), by kind: Slurm shows a
    # shard typed ('shard:l40s:4'), the policy has it untyped
    want_shared = {n: c for (n, _t), c in site.group_for_node(name).gres.items() if n in livemodes.SHARED}
    have_shared = {k: v for k, v in _by_kind(view.gres).items() if k in livemodes.SHARED and v}
    if want == have and want_shared == have_shared:
        return ""
    want, have = {**want, **want_shared}, {**have, **have_shared}
    return (f"Slurm has Gres {_gres_text(have)}, the policy {_gres_text(want)}: a change or reconfigure is under "
            "way, or Slurm does not run this policy; the live planner leaves the node alone")


def _best_change(site: Site, doc: dict, name: str, jobs: list[PendingJob], valid: dict,
                 refused: dict, history: _History | None = None) -> _Best | None:
    """The node's new MIG layouts that start the most of ``jobs`` (net), chosen together for one drain, among the
    sets of layouts the policy accepts (``with_layouts`` validates the node's whole set: an alias or tier type the
    site names must stay). GPU by GPU in index order (greedy): the catalogue layout that, with the layouts chosen
    for the GPUs before it, starts the most jobs on the node replaces the GPU's layout when it starts more than
    keeping it (ties: the older jobs, then the smaller change, then the catalogue's order). ``refused[name]``:
    the set chosen without the policy's check, and why the policy refuses it (when it does).

    ``history`` (the node's recent mix): the choice is made again with the stranded recent jobs subtracted from
    every score; when no set is worth it then, the set chosen without history comes back with its stranded jobs
    subtracted from its benefit (and ``history`` saying which), so that ``_limits`` holds it and says why."""
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
    accept = None
    why = _refusal(doc, name, plain.changes, valid)
    if why:
        refused[name] = (plain, why)
        accept = lambda changes: not _refusal(doc, name, changes, valid)  # noqa: E731
        plain = _choose(slots, base, by_type, accept)
        if plain is None:
            return None
    if history is None or not history.stranded(plain.caps):
        return plain
    kept = _choose(slots, base, by_type, accept, history)
    if kept is not None:
        return kept
    lost = history.stranded(plain.caps)
    return replace(plain, benefit=plain.benefit - lost, stranded=lost, history=history.text(plain.caps))


def _by_kind(gres) -> Counter:
    """GRES counts by ``_kind``: 'shard:l40s' and 'shard' both as 'shard'."""
    out: Counter = Counter()
    for k, v in gres.items():
        out[_kind(k)] += v
    return out


def _entries(site: Site, name: str) -> tuple[dict[int, dict], dict[int, str]]:
    """The node's non-MIG GPUs as sharing entries, and their Slurm types (``livemodes.capacity``' arguments)."""
    slots = [s for s in site.group_for_node(name).gpus if s.mode != "mig"]
    return {s.index: livemodes.entry_of(s) for s in slots}, {s.index: s.slurm_type for s in slots}


def _best_modes(site: Site, doc: dict, name: str, jobs: list[PendingJob], valid: dict,
                history: _History | None) -> _Best | None:
    """The node's best change of GPU modes (``livemodes.best_mode_change``), every set checked with the policy."""
    def accept(changed: dict[int, dict]) -> bool:
        key = (name, "modes", tuple(sorted((g, tuple(sorted(e.items()))) for g, e in changed.items())))
        if key not in valid:
            try:
                with_modes(doc, name, changed)
                valid[key] = ""
            except (PolicyError, ValueError) as exc:
                valid[key] = str(exc)
        return not valid[key]

    def make(changes, gained, dropped, benefit, wait, caps, stranded, text, modes) -> _Best:
        return _Best(changes, gained, dropped, benefit, wait, Counter(caps), stranded, text, modes)

    return livemodes.best_mode_change(site, name, jobs, accept, history, _kind, make)


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


def _choose(slots, base: Counter, by_type: dict[str, list[PendingJob]], accept,
            history: _History | None = None) -> _Best | None:
    """The greedy choice of ``_best_change``; ``accept(changes)`` (when given) must accept the set chosen so far
    with each GPU's new layout, else the GPU's next best layout is tried, else the GPU keeps its layout.
    ``history``: every score (and the benefit) less the recent jobs the node's GRES after it would strand."""
    def lost(c) -> float:
        return history.stranded(c) if history is not None else 0.0

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
        keep_n = sum(n for n, _ in keep) - lost(caps)
        scored = []
        for layout, profiles, types in _candidates(slot.model):
            if profiles == old_profiles:
                continue
            n = wait = 0
            for t in by_type:
                k, w = served(t, caps[t] - old[t] + types[t])
                n += k
                wait += w
            if history is not None:
                n -= lost(caps - old + types)
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
    stranded = lost(caps)
    benefit = len(gained) - len(dropped) - stranded
    if benefit <= 0:
        return None
    wait = sum(j.age_s for j in gained) - sum(j.age_s for j in dropped)
    text = history.text(caps) if stranded else ""
    return _Best(tuple(changes), gained, dropped, benefit, wait, Counter(caps), stranded, text)


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
    lets = _lets_text(starts, best.dropped, "layout")
    first = _first_text(must_finish, ready_in)
    to = f"to {'+'.join(best.new)}" if len(best.changes) == 1 else _to_text(best.changes)
    line = (f"{len(waiting)} job{'s have' if len(waiting) != 1 else ' has'} waited {_mins(oldest)} for {main}; "
            f"{name} {has} {', '.join(idle)}: relayout {to} {lets}; "
            f"cost: {first} + {_mins_up(live.change_cost)} drain and re-registration")
    if best.stranded:
        line += f"; history: {best.history}: {best.stranded:.1f} stranded, net benefit {best.benefit:.1f}"
    return Proposal(name, best.gpu, tuple(best.old), tuple(best.new), dict(sorted(starts.items())), must_finish,
                    ready_in, ready_in + live.change_cost, float(best.benefit), line, tuple(best.changes))


def _lets_text(starts: Counter, dropped, present: str) -> str:
    """'lets 6 start' / 'lets 2 a, 3 b start', and the pending jobs the present layout or modes would start."""
    lets = f"lets {sum(starts.values())} start" if len(starts) == 1 else \
        "lets " + ", ".join(f"{n} {t}" for t, n in sorted(starts.items())) + " start"
    if dropped:
        lets += f" ({len(dropped)} pending that the present {present} would start wait longer)"
    return lets


def _first_text(must_finish, ready_in: float) -> str:
    """What must happen before the change: 'jobs 12,13 must finish (the last ends in 4 min)'."""
    if not must_finish:
        return "no GPU job on the node"
    many = len(must_finish) > 1
    if ready_in > 0:
        when = f"{'the last ' if many else ''}ends in {_mins_up(ready_in)}"
    else:
        when = f"at {'their' if many else 'its'} time limit now"
    return f"job{'s' if many else ''} {_ids(must_finish, 8)} must finish ({when})"


def _mode_proposal(site, snap, name, best: _Best, must_finish, ready_in, free: Counter, counted, types) -> Proposal:
    """A mode change's proposal: '6 jobs have waited 12 min for mps; e01 GPU 1 exclusive -> mps (100 units): lets
    6 start; cost: ...'."""
    live = site.policy.live
    starts = Counter(_type_name(_kind(j.gres)) for j in best.new_served)
    main = starts.most_common(1)[0][0]
    waiting = [j for j in counted if _type_name(_kind(j.gres)) == main]
    oldest = max(j.age_s for j in waiting)
    busy = sorted({r.job_id for r in snap.running if r.node == name})
    what = ", ".join(f"GPU {g} {old} -> {mode_text(new)}" for g, old, new in best.modes)
    lets = _lets_text(starts, best.dropped, "modes")
    line = (f"{len(waiting)} job{'s have' if len(waiting) != 1 else ' has'} waited {_mins(oldest)} for {main}; "
            f"{name} has {len(busy)} GPU job{'s' if len(busy) != 1 else ''} running: mode change {what} {lets}; "
            f"cost: {_first_text(must_finish, ready_in)} + {_mins_up(live.change_cost)} drain and re-registration")
    if best.stranded:
        line += f"; history: {best.history}: {best.stranded:.1f} stranded, net benefit {best.benefit:.1f}"
    return Proposal(name, best.gpu, tuple(best.old), tuple(best.new), dict(sorted(starts.items())), must_finish,
                    ready_in, ready_in + live.change_cost, float(best.benefit), line, tuple(best.changes),
                    tuple(best.modes))


def _to_text(changes) -> str:
    """'GPU 0 to A and GPUs 1-2 to B': the new layouts of the changed GPUs, GPUs with the same one together."""
    by_layout: dict[tuple[str, ...], list[int]] = {}
    for gpu, _old, new in changes:
        by_layout.setdefault(tuple(new), []).append(gpu)
    parts = [f"GPU{'s' if len(g) > 1 else ''} {_index_text(sorted(g))} to {'+'.join(new)}"
             for new, g in sorted(by_layout.items(), key=lambda ng: min(ng[1]))]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def _demand_lines(pending, counted, blocked, idle_now, types, min_pending, mode_kinds=frozenset(),
                  weight_kinds=frozenset()) -> list[str]:
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
        elif _kind(key) in mode_kinds:
            line += f"; {idle_now[key]} fit idle GPUs now, {blocked_by[key]} blocked (a GPU mode change can serve it)"
        elif _kind(key) in weight_kinds:
            line += (f"; {idle_now[key]} fit idle GPUs now, {blocked_by[key]} blocked (node weights can keep small "
                     "jobs off the nodes a multi-GPU job needs)")
        else:
            line += ("; not a MIG type, and no GPU of the site can change to a mode that serves it (live.modes, "
                     "and the modes the site uses per GPU model)")
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

    def check(gpu: int, entry: dict | None, group: dict) -> None:
        if entry is None:
            raise ValueError(f"GPU {gpu} of node {node} has no MIG sharing entry in node group {group['name']} "
                             "(an exclusive GPU): the live planner changes MIG layouts only")
        if str(entry.get("mode", "")).lower() != "mig":
            raise ValueError(f"GPU {gpu} of node {node} is shared by mode {entry.get('mode')} in node group "
                             f"{group['name']}, not mig: the live planner changes MIG layouts only")

    entries = {g: {"mode": "mig", "layout": list(layout)} for g, layout in layouts.items()}
    what = ", ".join(f"GPU {g} as {'+'.join(layouts[g])}" for g in sorted(layouts))
    return _with_entries(site_doc, node, entries, check, what)


def with_modes(site_doc: dict, node: str, modes: dict[int, dict]) -> dict:
    """``with_layouts`` for sharing modes: the node's GPUs ``modes`` (gpu -> a sharing entry without ``gpus``:
    ``{"mode": "mps", "units": 100}``, ``{"mode": "shard", "replicas": 4}``, ``{"mode": "exclusive"}``) get
    those modes, in a group of the node's own, validated as a whole (``build_site``: mps and shard on one node,
    say, is refused with PolicyError). ValueError for a GPU shared by MIG or to be made MIG: gpushare never
    changes a GPU's MIG mode (that needs a GPU reset)."""
    if not modes:
        raise ValueError(f"node {node}: no GPU mode given (a mapping gpu -> sharing entry)")
    for gpu, entry in modes.items():
        mode = str(entry.get("mode", "")).lower()
        if mode not in ("exclusive", "mps", "shard"):
            raise ValueError(f"GPU {gpu} of node {node}: mode {entry.get('mode')!r}: the live planner sets "
                             "exclusive, mps or shard (MIG mode is never changed: it needs a GPU reset)")

    def check(gpu: int, entry: dict | None, group: dict) -> None:
        if entry is not None and str(entry.get("mode", "")).lower() == "mig":
            raise ValueError(f"GPU {gpu} of node {node} is shared by MIG in node group {group['name']}: the live "
                             "planner never changes a GPU's MIG mode (it needs a GPU reset)")

    what = ", ".join(f"GPU {g} {mode_text(modes[g])}" for g in sorted(modes))
    return _with_entries(site_doc, node, {g: dict(e) for g, e in modes.items()}, check, what)


def _with_entries(site_doc: dict, node: str, entries: dict[int, dict], check, what: str) -> dict:
    """The document with the node in a group of its own whose GPUs ``entries`` get these sharing entries;
    ``check(gpu, its present entry or None, group)`` raises ValueError for a GPU that may not change so."""
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
    for gpu in sorted(entries):
        if not 0 <= gpu < count:
            raise ValueError(f"GPU {gpu} of node {node}: node group {group['name']} has {count} GPU(s), "
                             f"0-{count - 1}")
    sharing, found = [], set()
    for entry in group.get("sharing") or []:
        indexes = parse_indexes(entry["gpus"], count)
        mine = [x for x in indexes if x in entries]
        if not mine:
            sharing.append(entry)
            continue
        check(mine[0], entry, group)
        rest = [x for x in indexes if x not in entries]
        if rest:
            sharing.append({**entry, "gpus": _index_text(rest)})
        found.update(mine)
    for gpu in sorted(set(entries) - found):
        check(gpu, None, group)
    sharing += [{"gpus": gpu, **entries[gpu]} for gpu in sorted(entries)]
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


def _num(x: float) -> str:
    """A count that may be fractional (a benefit less stranded jobs): '2', '1.5'."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


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
