"""The planner on the live cluster: which GPUs should change MIG layout or sharing mode for the jobs pending now.
Pure.

Data in (a ``ClusterView`` of the queue, the running jobs and the nodes,
``live.view``), a ``LivePlan`` out (``live.report``): demand lines, proposals
(one line each: who waits, what changes, what it costs) and held lines (a
change the policy's ``live:`` limits keep back).

The decision, per node with MIG GPUs (or GPUs whose mode may change, ``live.modes``):

- pending jobs count once they have waited ``live.min_pending`` with a
  reason that says they wait for resources (``COUNTED_REASONS``); in
  priority order, those that fit idle capacity of their type on an available
  node of their partition now are left to Slurm; the others are *blocked*;
- the node's GPUs get their layouts together, in one drain (the node's GPU
  jobs must all end first: Slurm 24.11 requeues every job holding GRES on a
  node whose GRES count changes, so one drain should pay for every GPU that
  should change): GPU by GPU (greedy, in index order), every maximal layout
  of the catalogue (``catalogue.candidate_layouts``) is scored by how many
  blocked jobs the whole node would start with it and the layouts already
  chosen for the GPUs before it, and replaces the GPU's layout only when it
  starts more than keeping it (``live.choose``); the change's benefit is what
  the node starts with all its new layouts, minus what its present layouts
  would start once drained anyway;
- the best change of the node is proposed, or held with the limit that stops
  it: the node under relayout or drained/down by someone else, Slurm's GRES
  not the policy's, ``min_benefit_jobs``, ``min_dwell`` since the node's last
  change (thrash), a GPU job without an end time, ``max_wait``,
  ``max_draining`` per tier. Proposals are made greedily, best first, and the
  jobs a proposal starts are not counted again for another node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..policy import Site
from . import modes, weights
from .catalogue import mig_types, node_caps, serve
from .choose import Best, best_layouts, best_modes, mode_entries, relayout_slots
from .recent import RecentMix, history_lines, mix_of
from .report import Held, LivePlan, Proposal, demand_lines, layout_proposal, mode_proposal
from .text import gres_text, ids, mins, mins_up, num
from .view import (
    COUNTED_REASONS,
    RELAYOUT_REASON,
    ClusterView,
    NodeView,
    PendingJob,
    RunningJob,
    by_kind,
    kind,
    ready_in,
    under_relayout,
)


@dataclass
class _Run:
    """What one planning run knows and has decided so far."""

    site: Site
    view: ClusterView
    doc: dict
    types: dict  # mig_types(site)
    counted: list[PendingJob]
    tiers_of: dict[str, tuple[str, ...]]  # node -> the tiers (partitions) it is in
    running_on: dict[str, list[RunningJob]]
    free: dict[str, Counter] = field(default_factory=dict)  # node -> idle GRES now
    startable: set[str] = field(default_factory=set)
    blocked: list[PendingJob] = field(default_factory=list)
    idle_now: Counter = field(default_factory=Counter)
    mode_kinds: frozenset = frozenset()
    weight_kinds: frozenset = frozenset()
    held: list[Held] = field(default_factory=list)
    proposals: list[Proposal] = field(default_factory=list)
    draining: Counter = field(default_factory=Counter)  # tier -> nodes under relayout (or proposed this run)
    valid: dict = field(default_factory=dict)  # policy checks of sets of layouts or modes: why refused ('' if not)
    refused: dict = field(default_factory=dict)  # node -> (the set the policy refuses, why)
    _partitions: dict = field(default_factory=dict)

    def serves(self, node: str, job: PendingJob) -> bool:
        parts = self._partitions.get(job.partition)
        if parts is None:
            parts = self._partitions[job.partition] = frozenset(job.partition.split(","))
        return not parts.isdisjoint(self.tiers_of.get(node, ()))


def plan_live(site: Site, view: ClusterView, doc: dict | None = None) -> LivePlan:
    """``doc``: the policy document ``site`` was built from (default: the site's policy as data); a proposed
    layout is one ``policy.document.with_layouts(doc, ...)`` accepts."""
    run = _start(site, view, doc)
    _find_blocked(run)
    live = site.policy.live
    demand = demand_lines(
        view.pending,
        run.counted,
        run.blocked,
        run.idle_now,
        run.types,
        live.min_pending,
        run.mode_kinds,
        run.weight_kinds,
    )
    changes = (
        weights.plan_weights(site, view, run.blocked, run.serves, run.startable, run.running_on, kind)
        if live.weights
        else []
    )
    mode_groups = {
        g.name for g in site.groups if run.mode_kinds and any(len(modes.options(site, s)) > 1 for s in g.gpus)
    }
    nodes = [n for g in site.groups if relayout_slots(g) or g.name in mode_groups for n in g.nodes]
    todo = _still_open(run, nodes)
    _propose(run, todo, mode_groups)
    _hold_refused(run)
    return LivePlan(tuple(run.proposals), tuple(run.held), tuple(demand), history_lines(view.history), tuple(changes))


def _start(site: Site, view: ClusterView, doc: dict | None) -> _Run:
    """The run's inputs: the counted jobs in priority order, each node's tiers and running jobs."""
    live = site.policy.live
    doc = site.policy.model_dump(mode="json", exclude_unset=True) if doc is None else doc
    counted = [p for p in view.pending if p.reason.startswith(COUNTED_REASONS) and p.age_s >= live.min_pending]
    counted.sort(key=lambda p: (-p.priority, -p.age_s, p.job_id))
    tiers_of = {
        n: tuple(t.name for t in site.tiers if any(n in g.nodes for g in t.groups))
        for g in site.groups
        for n in g.nodes
    }
    running_on: dict[str, list[RunningJob]] = {}
    for r in view.running:
        running_on.setdefault(r.node, []).append(r)
    run = _Run(site, view, doc, mig_types(site), counted, tiers_of, running_on)
    run.mode_kinds = modes.kinds(site) if live.modes else frozenset()
    run.weight_kinds = (
        frozenset(k for g in site.groups for n in g.nodes[:1] for k in weights.whole_types(site, n))
        if live.weights
        else frozenset()
    )
    return run


def _find_blocked(run: _Run) -> None:
    """What is idle now on the nodes that start jobs, and which counted jobs it cannot start (``blocked``)."""
    free_kind: dict[str, Counter] = {}  # by kind: Slurm names a node's shards 'shard:l40s', a job's 'shard'
    for name, node in run.view.nodes.items():
        use: Counter[str] = Counter()
        for r in run.running_on.get(name, ()):
            use.update(r.gres)
        run.free[name] = Counter({k: v - use[k] for k, v in node.gres.items() if v - use[k] > 0})
        have, used = by_kind(node.gres), by_kind(use)
        free_kind[name] = Counter({k: v - used[k] for k, v in have.items() if v - used[k] > 0})
    run.startable = {
        n
        for n, v in run.view.nodes.items()
        if n in run.tiers_of and not v.unavailable and not under_relayout(v, run.view.locked, n)
    }
    left = {n: Counter(run.free[n]) for n in run.startable}
    tracked = run.mode_kinds | run.weight_kinds
    left_kind = {n: Counter(free_kind[n]) for n in run.startable} if tracked else {}
    order = sorted(run.startable)
    for job in run.counted:
        if job.gres in run.types:
            pool, key = left, job.gres
        elif kind(job.gres) in tracked:
            pool, key = left_kind, kind(job.gres)
        else:
            continue
        spot = next((n for n in order if pool[n][key] >= job.count and run.serves(n, job)), None)
        if spot is None:
            run.blocked.append(job)
        else:
            pool[spot][key] -= job.count
            run.idle_now[job.gres] += 1


def _still_open(run: _Run, nodes: list[str]) -> list[str]:
    """The nodes a change may be proposed for: not under relayout (whose policy layouts will start some of the
    blocked jobs: those are taken out), and with Slurm's GRES the policy's (else held)."""
    view = run.view
    for name in sorted(set(run.tiers_of)):
        if under_relayout(view.nodes.get(name), view.locked, name):
            run.draining.update(run.tiers_of[name])
    for name in nodes:  # a node under relayout gets the policy's layout for it: the jobs it serves are coming
        if under_relayout(view.nodes.get(name), view.locked, name):
            served = serve(node_caps(run.site, name), [j for j in run.blocked if run.serves(name, j)])
            run.blocked = [j for j in run.blocked if j not in served]
            run.held.append(
                Held(
                    name,
                    f"under relayout (reservation gpushare-relayout-{name} or drained "
                    f"'{RELAYOUT_REASON}...'); its policy layout will start {len(served)} "
                    "of the blocked jobs",
                )
            )
    todo = []
    for name in nodes:
        node = view.nodes.get(name)
        if under_relayout(node, view.locked, name):
            continue
        why = _mismatch(run.site, name, node)
        if why:
            run.held.append(Held(name, why))
        else:
            todo.append(name)
    return todo


def _propose(run: _Run, todo: list[str], mode_groups: set[str]) -> None:
    """Greedily, best change first: propose it or hold it back with the limit that stops it; a proposal's jobs
    are taken out of the blocked ones, and every other node is scored again."""
    site, view = run.site, run.view
    ran: dict[str, list] = {}
    for r in view.history:
        ran.setdefault(r.node, []).append(r)
    history = {name: mix_of(site, ran.get(name, ()), node_caps(site, name)) for name in todo}
    mode_history = {
        name: mix_of(site, ran.get(name, ()), modes.capacity(*mode_entries(site, name)))
        for name in todo
        if site.group_for_node(name).name in mode_groups
    }
    cache: dict[str, Best | None] = {}  # scores stay good until a proposal takes jobs out of `blocked`
    while todo and run.blocked:
        scored: list[tuple[Best, str]] = []
        for name in todo:
            if name not in cache:
                cache[name] = _best(run, name, history[name], mode_history)
            found = cache[name]
            if found is not None:
                scored.append((found, name))
        if not scored:
            break
        scored.sort(
            key=lambda bn: (-bn[0].benefit, ready_in(view.now, run.running_on.get(bn[1], [])), -bn[0].wait, bn[1])
        )
        best, name = scored[0]
        todo.remove(name)
        why, must_finish, ready = _limits(
            site, view, name, best, run.running_on.get(name, []), run.tiers_of[name], run.draining
        )
        if why:
            run.held.append(Held(name, why, best.change(name)))
            continue
        run.draining.update(run.tiers_of[name])
        taken = {j.job_id for j in best.new_served}
        run.blocked = [j for j in run.blocked if j.job_id not in taken]
        cache.clear()
        make = mode_proposal if best.modes else layout_proposal
        run.proposals.append(
            make(site, view, name, best, must_finish, ready, run.free.get(name, Counter()), run.counted)
        )


def _best(run: _Run, name: str, history: RecentMix | None, mode_history: dict) -> Best | None:
    """The node's better change: MIG layouts or GPU modes."""
    site = run.site
    mine = [j for j in run.blocked if run.serves(name, j)]
    mig = (
        best_layouts(site, run.doc, name, [j for j in mine if j.gres in run.types], run.valid, run.refused, history)
        if relayout_slots(site.group_for_node(name))
        else None
    )
    mode = best_modes(site, run.doc, name, mine, run.valid, mode_history[name]) if name in mode_history else None
    return mode if mode is not None and (mig is None or mode.benefit > mig.benefit) else mig


def _hold_refused(run: _Run) -> None:
    """A node whose best layouts the policy refuses, and that got no better change: held with the policy's why."""
    chosen = {p.node: p.benefit for p in run.proposals}
    already = {h.node for h in run.held}  # held for another reason: that reason is the one to read
    for name, (best, why) in sorted(run.refused.items()):
        if name not in already and best.benefit > chosen.get(name, 0):
            run.held.append(
                Held(
                    name,
                    f"would let {num(best.benefit)} pending job(s) start, but the policy refuses the layout: {why}",
                    best.change(name),
                )
            )


def _limits(site, view, name, best, running, tiers, draining) -> tuple[str, tuple[int, ...], float]:
    """Why the change is held back ('' when it is not), the GPU jobs that must finish first, and when they end."""
    live = site.policy.live
    node = view.nodes.get(name)
    must_finish = tuple(sorted({r.job_id for r in running}))
    if node is None:
        return f"Slurm has no node {name}", must_finish, 0.0
    if node.unavailable:
        return (
            f"{'+'.join(node.state)} by someone else (reason: {node.reason or 'none given'}); "
            "the live planner leaves it alone",
            must_finish,
            0.0,
        )
    if best.benefit < live.min_benefit_jobs:
        return _too_small(best, live.min_benefit_jobs), must_finish, 0.0
    last = view.changes.get(name)
    if last is not None and view.now - last < live.min_dwell:
        return (
            f"changed (or tried) {mins(view.now - last)} ago; min_dwell is {mins(live.min_dwell)}",
            must_finish,
            0.0,
        )
    unknown = sorted({r.job_id for r in running if r.end_time is None})
    if unknown:
        return (
            f"job(s) {ids(unknown, 8)} on the node have no end time (no time limit?): cannot bound the wait",
            must_finish,
            0.0,
        )
    ready = ready_in(view.now, running)
    if ready > live.max_wait:
        return (
            f"job(s) {ids(must_finish, 8)} must finish first, the last in {mins_up(ready)}; max_wait is "
            f"{mins(live.max_wait)}",
            must_finish,
            ready,
        )
    full = [t for t in tiers if draining[t] >= live.max_draining]
    if full:
        return (
            f"tier {', '.join(full)} already has {max(draining[t] for t in full)} node(s) under relayout; "
            f"max_draining is {live.max_draining}",
            must_finish,
            ready,
        )
    return "", must_finish, ready


def _too_small(best: Best, min_benefit_jobs) -> str:
    if best.stranded:
        started = best.benefit + best.stranded
        return (
            f"{best.history}: it would strand {best.stranded:.1f} of them against the {num(started)} "
            f"pending job(s) it lets start (net {best.benefit:.1f}; min_benefit_jobs is {min_benefit_jobs})"
        )
    return f"lets {num(best.benefit)} more pending job(s) start; min_benefit_jobs is {min_benefit_jobs}"


def _mismatch(site: Site, name: str, node: NodeView | None) -> str:
    """Why the node's GPU GRES in Slurm are not the policy's ('' when they are)."""
    if node is None:
        return "Slurm has no such node: the policy is not the one Slurm runs"
    want = dict(node_caps(site, name))
    have = {k: v for k, v in node.gres.items() if k.startswith("gpu:")}
    # MPS units and shards too (a mode change keeps the gpu count and changes these), by kind: Slurm shows a
    # shard typed ('shard:l40s:4'), the policy has it untyped
    want_shared = {n: c for (n, _t), c in site.group_for_node(name).gres.items() if n in modes.SHARED}
    have_shared = {k: v for k, v in by_kind(node.gres).items() if k in modes.SHARED and v}
    if want == have and want_shared == have_shared:
        return ""
    want, have = {**want, **want_shared}, {**have, **have_shared}
    return (
        f"Slurm has Gres {gres_text(have)}, the policy {gres_text(want)}: a change or reconfigure is under "
        "way, or Slurm does not run this policy; the live planner leaves the node alone"
    )
