"""The live planner's result and its report: demand lines, proposals (one line each: who waits, what changes,
what it costs), changes held back with why, node weights; as text and as JSON (``gpushare live report --json``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..policy import Site
from ..policy.groups import format_indexes
from .change import Change
from .choose import Best
from .text import ids, mins, mins_up, type_name
from .view import ClusterView, PendingJob, kind
from .weights import WeightChange


@dataclass(frozen=True)
class Proposal:
    change: Change
    starts: dict[str, int]  # slurm gres type -> pending jobs the change lets start
    must_finish: tuple[int, ...]
    ready_in_s: float
    cost_s: float
    benefit: float  # pending jobs the change lets start, less those the present layout would start
    line: str

    @property
    def node(self) -> str:
        return self.change.node

    def to_dict(self) -> dict:
        fields = change_fields(self.change)
        steps = {k: fields.pop(k) for k in ("changes", "modes")}
        return {
            **fields,
            "starts": dict(self.starts),
            "must_finish": list(self.must_finish),
            "ready_in_s": self.ready_in_s,
            "cost_s": self.cost_s,
            "benefit": self.benefit,
            "line": self.line,
            **steps,
        }


@dataclass(frozen=True)
class Held:
    """A change the policy's limits keep back, or a node left alone (``change`` None), and why."""

    node: str
    why: str
    change: Change | None = None

    @property
    def line(self) -> str:
        to = f" {self.change.text()}" if self.change is not None else ""
        return f"held: {self.node}{to}: {self.why}"

    def to_dict(self) -> dict:
        fields = (
            change_fields(self.change)
            if self.change is not None
            else {"gpu": -1, "new_layout": [], "changes": [], "modes": []}
        )
        return {
            "node": self.node,
            "gpu": fields["gpu"],
            "new_layout": fields["new_layout"],
            "why": self.why,
            "changes": fields["changes"],
            "modes": fields["modes"],
            "line": self.line,
        }


def change_fields(change: Change) -> dict:
    """The JSON of ``live report --json`` for a change: node, the first GPU (gpu, old_layout, new_layout: for a
    change of modes, its modes as text), ``changes`` ([gpu, old, new] of every GPU, modes as text) and
    ``modes`` ([gpu, old mode as text, new sharing entry])."""
    if change.modes:
        steps = [[s.gpu, [s.old.text], [s.new.text]] for s in change.modes]
        modes = [[s.gpu, s.old.text, s.new.to_entry()] for s in change.modes]
    else:
        steps, modes = [[s.gpu, list(s.old), list(s.new)] for s in change.layouts], []
    gpu, old, new = steps[0]
    return {"node": change.node, "gpu": gpu, "old_layout": old, "new_layout": new, "changes": steps, "modes": modes}


@dataclass(frozen=True)
class LivePlan:
    proposals: tuple[Proposal, ...]
    held: tuple[Held, ...]
    demand: tuple[str, ...]
    history: tuple[str, ...] = ()  # GPU jobs ended within live.history_window, by type and node
    weights: tuple[WeightChange, ...] = ()  # node weight changes (no drain)

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
        return {
            "demand": list(self.demand),
            "proposals": [p.to_dict() for p in self.proposals],
            "held": [h.to_dict() for h in self.held],
            "history": list(self.history),
            "weights": [w.to_dict() for w in self.weights],
        }


# ---- a proposal's line ------------------------------------------------------------------------


def layout_proposal(
    site: Site, view: ClusterView, name: str, best: Best, must_finish, ready_in: float, free: Counter, counted
) -> Proposal:
    """'6 jobs have waited 12 min for a100_40g_1g.5gb; e01 GPU 0 has 1 idle 7g.40gb slices: relayout to
    1g.5gb+... lets 6 start; cost: ...'."""
    group = site.group_for_node(name)
    starts = Counter(j.gres.split(":", 1)[1] for j in best.new_served)
    main = starts.most_common(1)[0][0]
    waiting = [j for j in counted if j.gres == f"gpu:{main}"]
    old: Counter[str] = (
        Counter()
    )  # the changed GPUs' present instances (which GPU a running job holds: not in the view)
    for step in best.layouts:
        old.update(group.gpus[step.gpu].layout)
    model = group.gpus[best.layouts[0].gpu].model
    idle = []
    for profile, n in sorted(old.items(), key=lambda pn: (-pn[1], pn[0])):
        k = min(n, free[f"gpu:{model.mig_slurm_type(profile)}"])
        idle.append(f"{n} idle {profile} slices" if k == n else f"{k} of {n} {profile} slices idle")
    gpus = [s.gpu for s in best.layouts]
    has = f"GPU {gpus[0]} has" if len(gpus) == 1 else f"GPUs {format_indexes(gpus)} have"
    change = best.change(name)
    to = f"to {'+'.join(best.layouts[0].new)}" if len(gpus) == 1 else change.text()
    what = f"{name} {has} {', '.join(idle)}: relayout {to} {_lets_text(starts, best.dropped, 'layout')}"
    return _proposal(site, change, best, waiting, main, what, starts, must_finish, ready_in)


def mode_proposal(
    site: Site, view: ClusterView, name: str, best: Best, must_finish, ready_in: float, free: Counter, counted
) -> Proposal:
    """A mode change's proposal: '6 jobs have waited 12 min for mps; e01 GPU 1 exclusive -> mps (100 units): lets
    6 start; cost: ...'."""
    starts = Counter(type_name(kind(j.gres)) for j in best.new_served)
    main = starts.most_common(1)[0][0]
    waiting = [j for j in counted if type_name(kind(j.gres)) == main]
    busy = sorted({r.job_id for r in view.running if r.node == name})
    change = best.change(name)
    what = (
        f"{name} has {len(busy)} GPU job{'s' if len(busy) != 1 else ''} running: mode change {change.text()} "
        f"{_lets_text(starts, best.dropped, 'modes')}"
    )
    return _proposal(site, change, best, waiting, main, what, starts, must_finish, ready_in)


def _proposal(
    site: Site, change: Change, best: Best, waiting, main: str, what: str, starts: Counter, must_finish, ready_in: float
) -> Proposal:
    live = site.policy.live
    oldest = max(j.age_s for j in waiting)
    line = (
        f"{len(waiting)} job{'s have' if len(waiting) != 1 else ' has'} waited {mins(oldest)} for {main}; "
        f"{what}; cost: {_first_text(must_finish, ready_in)} + {mins_up(live.change_cost)} drain and "
        "re-registration"
    )
    if best.stranded:
        line += f"; history: {best.history}: {best.stranded:.1f} stranded, net benefit {best.benefit:.1f}"
    return Proposal(
        change,
        dict(sorted(starts.items())),
        must_finish,
        ready_in,
        ready_in + live.change_cost,
        float(best.benefit),
        line,
    )


def _lets_text(starts: Counter, dropped, present: str) -> str:
    """'lets 6 start' / 'lets 2 a, 3 b start', and the pending jobs the present layout or modes would start."""
    lets = (
        f"lets {sum(starts.values())} start"
        if len(starts) == 1
        else "lets " + ", ".join(f"{n} {t}" for t, n in sorted(starts.items())) + " start"
    )
    if dropped:
        lets += f" ({len(dropped)} pending that the present {present} would start wait longer)"
    return lets


def _first_text(must_finish, ready_in: float) -> str:
    """What must happen before the change: 'jobs 12,13 must finish (the last ends in 4 min)'."""
    if not must_finish:
        return "no GPU job on the node"
    many = len(must_finish) > 1
    if ready_in > 0:
        when = f"{'the last ' if many else ''}ends in {mins_up(ready_in)}"
    else:
        when = f"at {'their' if many else 'its'} time limit now"
    return f"job{'s' if many else ''} {ids(must_finish, 8)} must finish ({when})"


# ---- demand ------------------------------------------------------------------------------------


def demand_lines(
    pending, counted, blocked, idle_now, types, min_pending, mode_kinds=frozenset(), weight_kinds=frozenset()
) -> list[str]:
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
        line = (
            f"{name}: {len(jobs)} pending, {n_counted} for >= {mins(min_pending)} for resources "
            f"(oldest {mins(max(p.age_s for p in jobs))})"
        )
        out.append(line + _supply_text(key, idle_now, blocked_by, types, mode_kinds, weight_kinds))
    return out


def _supply_text(key: str, idle_now, blocked_by, types, mode_kinds, weight_kinds) -> str:
    if key in types:
        return f"; {idle_now[key]} fit idle instances now, {blocked_by[key]} blocked"
    if kind(key) in mode_kinds:
        return f"; {idle_now[key]} fit idle GPUs now, {blocked_by[key]} blocked (a GPU mode change can serve it)"
    if kind(key) in weight_kinds:
        return (
            f"; {idle_now[key]} fit idle GPUs now, {blocked_by[key]} blocked (node weights can keep small "
            "jobs off the nodes a multi-GPU job needs)"
        )
    return (
        "; not a MIG type, and no GPU of the site can change to a mode that serves it (live.modes, "
        "and the modes the site uses per GPU model)"
    )
