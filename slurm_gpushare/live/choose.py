"""A node's best change for the blocked jobs: new MIG layouts (chosen here) or new GPU modes (``live.modes``).

Every set is checked with the whole policy (``policy.document``) before it is
kept; the recent mix (``live.recent``) is subtracted from every score when the
node has one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from ..errors import PolicyError
from ..policy import Site
from ..policy.document import with_layouts, with_modes
from ..policy.share import Mode, Share
from ..policy.site import GpuSlot, Group
from . import modes
from .catalogue import candidates, node_caps, serve_type
from .change import Change, LayoutStep, ModeStep
from .recent import RecentMix
from .view import PendingJob, kind


@dataclass
class Best:
    """A node's best change and what it does to the blocked jobs."""

    layouts: tuple[LayoutStep, ...]  # every GPU whose layout changes (none for a change of modes)
    new_served: list[PendingJob]
    dropped: list[PendingJob]
    benefit: float  # jobs started, less those the present layout would start, less the stranded recent mix
    wait: float
    caps: Counter = field(default_factory=Counter)  # the node's GPU GRES after the change
    stranded: float = 0.0  # recent-mix jobs the change would turn away over min_dwell (RecentMix)
    history: str = ""  # RecentMix.text of the change ('' without one)
    modes: tuple[ModeStep, ...] = ()  # a change of modes (live.modes) instead

    def change(self, node: str) -> Change:
        return Change(node, self.layouts, self.modes)


def best_layouts(
    site: Site,
    doc: dict,
    name: str,
    jobs: list[PendingJob],
    valid: dict,
    refused: dict,
    history: RecentMix | None = None,
) -> Best | None:
    """The node's new MIG layouts that start the most of ``jobs`` (net), chosen together for one drain, among the
    sets of layouts the policy accepts (``with_layouts`` validates the node's whole set: an alias or tier type the
    site names must stay). GPU by GPU in index order (greedy): the catalogue layout that, with the layouts chosen
    for the GPUs before it, starts the most jobs on the node replaces the GPU's layout when it starts more than
    keeping it (ties: the older jobs, then the smaller change, then the catalogue's order). ``refused[name]``:
    the set chosen without the policy's check, and why the policy refuses it (when it does).

    ``history`` (the node's recent mix): the choice is made again with the stranded recent jobs subtracted from
    every score; when no set is worth it then, the set chosen without history comes back with its stranded jobs
    subtracted from its benefit (and ``history`` saying which), so that the planner holds it and says why."""
    if not jobs:
        return None
    by_type: dict[str, list[PendingJob]] = {}
    for job in jobs:
        by_type.setdefault(job.gres, []).append(job)
    base = node_caps(site, name)
    slots = relayout_slots(site.group_for_node(name))
    plain = _choose(slots, base, by_type, None)
    refused.pop(name, None)
    if plain is None:
        return None
    accept = None
    why = refusal(doc, name, plain.layouts, valid)
    if why:
        refused[name] = (plain, why)
        accept = lambda steps: not refusal(doc, name, steps, valid)  # noqa: E731
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


def best_modes(
    site: Site, doc: dict, name: str, jobs: list[PendingJob], valid: dict, history: RecentMix | None
) -> Best | None:
    """The node's best change of GPU modes (``modes.best_mode_change``), every set checked with the policy."""

    def accept(changed: dict[int, Share]) -> bool:
        key = (name, "modes", tuple(sorted(changed.items())))
        if key not in valid:
            try:
                with_modes(doc, name, {g: share.to_entry() for g, share in changed.items()})
                valid[key] = ""
            except (PolicyError, ValueError) as exc:
                valid[key] = str(exc)
        return not valid[key]

    def make(gained, dropped, benefit, wait, caps, stranded, text, steps) -> Best:
        return Best((), gained, dropped, benefit, wait, Counter(caps), stranded, text, steps)

    return modes.best_mode_change(site, name, jobs, accept, history, kind, make)


def relayout_slots(group: Group) -> tuple[GpuSlot, ...]:
    """The group's GPUs the live loop may lay out again: fixed MIG. A per-job MIG GPU (mode mig, no layout) is left
    alone: its instances come and go with its jobs, with no drain."""
    return tuple(s for s in group.slots(Mode.MIG) if not s.share.is_per_job_mig)


def mode_entries(site: Site, name: str) -> tuple[dict[int, Share], dict[int, str]]:
    """The node's non-MIG GPUs' shares, and their Slurm types (``modes.capacity``' arguments)."""
    slots = [s for s in site.group_for_node(name).gpus if not s.share.is_mig]
    return {s.index: s.share for s in slots}, {s.index: s.slurm_type for s in slots}


def refusal(doc: dict, name: str, steps, valid: dict) -> str:
    """Why the policy refuses these layouts of the node ('' when it accepts them); cached in ``valid``."""
    key = (name, tuple((g, new) for g, _old, new in steps))
    if key not in valid:
        try:
            with_layouts(doc, name, {g: new for g, _old, new in steps})
            valid[key] = ""
        except PolicyError as exc:
            valid[key] = "; ".join(f"{p.path}: {p.message}" if p.path else p.message for p in exc.problems[:2])
        except ValueError as exc:
            valid[key] = str(exc)
    return valid[key]


class _Score:
    """How many of the blocked jobs (and how long they waited) a node's GRES counts start, less the recent jobs
    those counts would strand (``history``); memoised per type and count."""

    def __init__(self, by_type: dict[str, list[PendingJob]], history: RecentMix | None):
        self.by_type, self.history = by_type, history
        self.memo: dict[tuple[str, int], tuple[int, float]] = {}

    def lost(self, caps) -> float:
        return self.history.stranded(caps) if self.history is not None else 0.0

    def served(self, t: str, cap: int) -> tuple[int, float]:
        got = self.memo.get((t, cap))
        if got is None:
            js = serve_type(cap, self.by_type[t])
            got = self.memo[(t, cap)] = (len(js), sum(j.age_s for j in js))
        return got

    def __call__(self, caps: Counter) -> tuple[float, float]:
        n = 0
        wait: float = 0
        for t in self.by_type:
            k, w = self.served(t, caps[t])
            n += k
            wait += w
        return n - self.lost(caps), wait


def _choose(
    slots, base: Counter, by_type: dict[str, list[PendingJob]], accept, history: RecentMix | None = None
) -> Best | None:
    """The greedy choice of ``best_layouts``; ``accept(steps)`` (when given) must accept the set chosen so far
    with each GPU's new layout, else the GPU's next best layout is tried, else the GPU keeps its layout.
    ``history``: every score (and the benefit) less the recent jobs the node's GRES after it would strand."""
    score = _Score(by_type, history)
    caps = Counter(base)
    steps: list[LayoutStep] = []
    for slot in slots:
        caps = _choose_gpu(slot, caps, score, steps, accept)
    if not steps:
        return None
    return _outcome(base, caps, by_type, tuple(steps), score.lost(caps), history)


def _choose_gpu(slot, caps: Counter, score: _Score, steps: list[LayoutStep], accept) -> Counter:
    """The GPU's best new layout with the layouts chosen before it (appended to ``steps``) when it starts more
    than keeping its own; the node's GRES counts after."""
    old = Counter(f"gpu:{t}" for t in slot.mig_types())
    old_profiles = Counter(slot.layout)
    keep_n = score(caps)[0]
    scored = []
    for layout, profiles, types in candidates(slot.model):
        if profiles == old_profiles:
            continue
        n, wait = score(caps - old + types)
        if n <= keep_n:
            continue
        moved = sum(((profiles - old_profiles) + (old_profiles - profiles)).values())
        scored.append(((-n, -wait, moved, layout), layout, types))
    for _key, layout, types in sorted(scored, key=lambda s: s[0]):
        step = LayoutStep(slot.index, tuple(slot.layout), tuple(layout))
        if accept is None or accept(tuple(steps) + (step,)):
            steps.append(step)
            return caps - old + types
    return caps


def _outcome(
    base: Counter, caps: Counter, by_type, steps: tuple[LayoutStep, ...], stranded: float, history: RecentMix | None
) -> Best | None:
    """The jobs the new layouts start that the present ones would not, and those they drop; None unless the
    change starts more than it drops (net of the stranded recent mix)."""
    gained, dropped = [], []
    for t, js in by_type.items():
        before = serve_type(base[t], js)
        after = serve_type(caps[t], js)
        was = {j.job_id for j in before}
        now_ids = {j.job_id for j in after}
        gained += [j for j in after if j.job_id not in was]
        dropped += [j for j in before if j.job_id not in now_ids]
    benefit = len(gained) - len(dropped) - stranded
    if benefit <= 0:
        return None
    wait = sum(j.age_s for j in gained) - sum(j.age_s for j in dropped)
    text = history.text(caps) if stranded and history is not None else ""  # stranded is 0 without a history
    return Best(steps, gained, dropped, benefit, wait, Counter(caps), stranded, text)
