"""The live planner's mode changes: which non-MIG GPU of a node should be exclusive, MPS or shared. Pure.

``live.plan.plan_live`` calls ``best_mode_change`` (through ``live.choose``) for every node with
GPUs not shared by MIG, beside its MIG layout choice, and proposes the
better of the two for the node (one drain either way).

What a GPU may become (``options``): exclusive, or one of the MPS / shard
settings the site already uses on GPUs of the same model (the same
``units``, ``replicas``, ``compute_mode``): derived from the policy, never
typed twice, so the billing of a partition keeps one weight per TRES. MIG
mode is never changed (gpushare never does: it needs a GPU reset), and a
set with MPS and shards on one node is never tried (Slurm does not support
it; ``policy.groups`` refuses it). Every set chosen is validated with the
whole policy (``with_modes``) before it is kept.

The score of a set of modes is the number of blocked jobs the empty node
would start with it (``starts``: in priority order; a whole-GPU job takes
GPUs of its type with no job on them, exclusive ones first; an MPS or shard
job takes its units or shards on one GPU of that mode, the fullest that
fits, as Slurm allocates a shared GRES from one GPU by default), less the
recent jobs it would strand (``live.recent.RecentMix``, on the GRES kinds
``capacity`` counts: whole GPUs kept exclusive, MPS units, shards). GPU by
GPU in index order (greedy, as for MIG layouts), a GPU takes the mode that
scores best with the modes chosen before it, if that starts more than keeping
its own (ties: the higher priorities, then the older jobs, then the order of
``options``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..policy.share import SHARED_GRES, Mode, Share
from ..records import replace
from .change import ModeStep

SHARED = SHARED_GRES


def options(site, slot) -> tuple[Share, ...]:
    """The shares the GPU may take: exclusive, and every MPS / shard setting the site uses on GPUs of its model
    (its own first); the GPU keeps its Slurm type. () for a MIG GPU, fixed or per-job (the live loop leaves a
    per-job GPU alone)."""
    if slot.share.is_mig or slot.share.is_per_job_mig:
        return ()
    found: dict[Share, Share] = {}
    shared = [s.share for g in site.groups for s in g.gpus if s.model == slot.model and s.share.shared_gres]
    for share in [slot.share, Share()] + shared:
        share = replace(share, type=slot.share.type)
        found.setdefault(share, share)
    return tuple(found.values())


def capacity(entries: dict[int, Share], types: dict[int, str]) -> Counter:
    """What the GPUs offer by kind, for the history: 'gpu:<type>' per exclusive GPU, MPS units, shards."""
    caps: Counter = Counter()
    for gpu, share in entries.items():
        if share.shared_gres:
            caps[share.shared_gres] += share.shared_count
        elif not share.is_mig:
            caps[f"gpu:{types[gpu]}"] += 1
    return caps


@dataclass
class _Gpu:
    mode: Mode
    type: str
    left: int  # units or shards not allocated
    whole: bool = False  # a whole-GPU job has it
    shared: bool = False  # an MPS or shard job has part of it


def starts(entries: dict[int, Share], types: dict[int, str], jobs, kind) -> list:
    """The jobs (in the order given: priority) that start on the empty node with these GPU shares."""
    gpus = [_Gpu(e.mode, types[g], e.shared_count) for g, e in sorted(entries.items())]
    out = []
    for job in jobs:
        k = kind(job.gres)
        if k in SHARED:
            fits = [g for g in gpus if g.mode == k and not g.whole and g.left >= job.count]
            if fits:
                g = min(fits, key=lambda g: g.left)
                g.left -= job.count
                g.shared = True
                out.append(job)
        elif k.startswith("gpu:"):
            free = sorted(
                (g for g in gpus if g.type == k[4:] and not g.whole and not g.shared),
                key=lambda g: g.mode is not Mode.EXCLUSIVE,
            )
            if len(free) >= job.count:
                for g in free[: job.count]:
                    g.whole = True
                out.append(job)
    return out


def kinds(site) -> frozenset[str]:
    """The GRES kinds a mode change can make room for: 'mps' / 'shard' where some non-MIG GPU may take that mode,
    'gpu:<type>' of every non-MIG GPU that has a mode to change to."""
    out: set[str] = set()
    for group in site.groups:
        for slot in group.gpus:
            opts = options(site, slot)
            if len(opts) > 1:
                out.update(e.shared_gres for e in opts if e.shared_gres)
                out.add(f"gpu:{slot.slurm_type}")
    return frozenset(out)


def mixes_mps_and_shard(group, entries: dict[int, Share]) -> bool:
    return set(SHARED) <= {entries.get(s.index, s.share).shared_gres for s in group.gpus}


def best_mode_change(site, name: str, jobs, accept, history, kind, make_best):
    """The node's new GPU modes that start the most of ``jobs`` (net of the stranded recent mix), or None.

    ``accept(changed entries)``: whether the policy takes the node's GPUs so (``with_modes`` validates);
    ``history``: the node's ``RecentMix`` over ``capacity`` (or None); ``kind``: a job's GRES key as a kind;
    ``make_best(gained, dropped, benefit, wait, caps, stranded, text, steps)``: the planner's ``Best``.
    As for MIG layouts: when no set is worth it with the history, the set chosen without it comes back with its
    stranded jobs subtracted from its benefit, so that the planner holds it and says why."""
    group = site.group_for_node(name)
    slots = [s for s in group.gpus if not s.share.is_mig]
    opts = {s.index: options(site, s) for s in slots}
    if not any(len(o) > 1 for o in opts.values()):
        return None
    wanted = kinds(site)
    jobs = [j for j in jobs if kind(j.gres) in wanted]
    if not jobs:
        return None
    types = {s.index: s.slurm_type for s in slots}
    current = {s.index: s.share for s in slots}
    plain = _choose(group, slots, opts, current, types, jobs, kind, accept, None)
    if plain is None:
        return None
    lost = history.stranded(capacity(plain, types)) if history is not None else 0.0
    if lost:
        kept = _choose(group, slots, opts, current, types, jobs, kind, accept, history)
        if kept is not None:
            return _best(kept, current, types, jobs, kind, history, make_best, force=False)
    return _best(plain, current, types, jobs, kind, history, make_best, force=bool(lost))


def _choose(group, slots, opts, current, types, jobs, kind, accept, history) -> dict | None:
    """GPU by GPU, the mode that scores best with the modes chosen before it, if better than keeping its own;
    the node's new entries, or None when no GPU changes."""

    def score(entries) -> tuple[float, int, float]:
        """(jobs started less the stranded, then their priorities, then their ages: the ties)"""
        lost = history.stranded(capacity(entries, types)) if history is not None else 0.0
        started = starts(entries, types, jobs, kind)
        return len(started) - lost, sum(j.priority for j in started), sum(j.age_s for j in started)

    chosen, keep = dict(current), score(current)
    for slot in slots:
        scored: list[tuple[tuple[float, ...], int, tuple[float, int, float], dict]] = []  # (key, order, score, modes)
        for entry in opts[slot.index]:
            if entry == chosen[slot.index]:
                continue
            trial = {**chosen, slot.index: entry}
            if mixes_mps_and_shard(group, trial):
                continue
            value = score(trial)
            if value[0] > keep[0]:
                scored.append((tuple(-v for v in value), len(scored), value, trial))
        for _key, _n, value, trial in sorted(scored, key=lambda s: (s[0], s[1])):
            if accept({g: e for g, e in trial.items() if e != current[g]}):
                chosen, keep = trial, value
                break
    return chosen if chosen != current else None


def _best(chosen, current, types, jobs, kind, history, make_best, force: bool):
    """The planner's ``Best`` for the node's new entries (None when it starts no more jobs, net, unless
    ``force``: the set chosen without the history, kept to be held with it)."""
    changed = {g: e for g, e in chosen.items() if e != current[g]}
    before = {j.job_id for j in starts(current, types, jobs, kind)}
    after_jobs = starts(chosen, types, jobs, kind)
    after = {j.job_id for j in after_jobs}
    gained = [j for j in after_jobs if j.job_id not in before]
    dropped = [j for j in jobs if j.job_id in before and j.job_id not in after]
    caps = capacity(chosen, types)
    stranded = history.stranded(caps) if history is not None else 0.0
    benefit = len(gained) - len(dropped) - stranded
    if benefit <= 0 and not force or not gained:
        return None
    text = history.text(caps) if stranded else ""
    steps = tuple(ModeStep(g, current[g], changed[g]) for g in sorted(changed))
    wait = sum(j.age_s for j in gained) - sum(j.age_s for j in dropped)
    return make_best(gained, dropped, benefit, wait, caps, stranded, text, steps)
