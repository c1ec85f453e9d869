"""The live planner's node weights: keep small jobs off the nodes whose whole GPUs the pending large jobs need.

Pure. Slurm allocates, all else equal, the nodes of the lowest ``Weight``
first (slurm.conf(5), "Weight"); ``scontrol update NodeName=<node>
Weight=<n>`` changes it on the running controller, with no drain and no
reconfigure (scontrol(1), node update: the value set so is lost at the
next ``scontrol reconfigure`` or restart, when slurm.conf's is read again).

A *large* job asks for two or more whole GPUs of one type on a node and is
blocked (it fits no idle GPUs of its partition now). It needs a node whose
GPUs of that type are all free at once, and small jobs of the same type (one
GPU, or MPS / shard jobs) that keep landing on such a node keep it from ever
being free. For each blocked large job, in priority order, the node of its
partition that could hold it and will be free soonest (its GPU jobs' time
limits) is *kept* for it: its weight is raised above every other node that
serves the same small jobs, so Slurm places new small jobs there first. A
kept node whose weight is already above theirs needs nothing. Nothing is
proposed when no other node could take the small jobs. When no large job is
blocked any more, a node the live planner steered (``ClusterView.steered``,
from the apply side's state file) whose Slurm weight is still the one it set
gets the policy's back; one whose weight someone else changed since (an
admin, a reconfigure) is left as it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .text import mins
from .view import ready_in

DEFAULT_WEIGHT = 1  # slurm.conf(5): a node without Weight= has weight 1


@dataclass(frozen=True)
class WeightChange:
    node: str
    old: int
    new: int
    line: str
    jobs: tuple[int, ...] = ()  # the blocked large jobs the node is kept for (none: the policy's weight back)

    def to_dict(self) -> dict:
        return asdict(self)


def policy_weight(site, node: str) -> int:
    return site.group_for_node(node).spec.weight or DEFAULT_WEIGHT


def whole_types(site, node: str) -> dict[str, int]:
    """'gpu:<type>' -> GPUs of the node not shared by MIG (exclusive, MPS or shard: a whole-GPU job may take
    any of them when no job holds it)."""
    out: dict[str, int] = {}
    for slot in site.group_for_node(node).gpus:
        if not slot.share.is_mig:
            key = f"gpu:{slot.slurm_type}"
            out[key] = out.get(key, 0) + 1
    return out


def plan_weights(site, view, blocked, serves, startable, running_on, kind) -> list[WeightChange]:
    """The weight changes of this run. ``blocked``: the counted pending jobs no idle capacity fits now (priority
    order); ``serves(node, job)``; ``startable``: nodes that start jobs; ``running_on``: node -> RunningJob;
    ``kind``: a GRES key as the planner counts it ('shard:l40s' -> 'shard')."""
    nodes = sorted(n for n in startable if n in view.nodes)
    weight = {n: view.nodes[n].weight if view.nodes[n].weight is not None else policy_weight(site, n) for n in nodes}
    large = [j for j in blocked if kind(j.gres).startswith("gpu:") and j.count >= 2]
    if not large:
        return _weights_back(site, view)
    kept = _kept_nodes(site, view, large, nodes, serves, running_on, kind)
    out = []
    for node, jobs in sorted(kept.items()):
        t = kind(jobs[0].gres)
        others = [n for n in nodes if n not in kept and t in whole_types(site, n)]
        if not others:
            continue  # no other node for the small jobs of this type: a weight would steer nothing
        above = max(weight[n] for n in others) + 1
        if weight[node] >= above:
            continue
        new = min(above, 65533)
        line = _keep_line(view, node, jobs[0], t, weight, new, others, running_on)
        out.append(WeightChange(node, weight[node], new, line, tuple(j.job_id for j in jobs)))
    return out


def _kept_nodes(site, view, large, nodes, serves, running_on, kind) -> dict[str, list]:
    """Node -> the large job it is kept for: per job in priority order, the node not kept yet that could hold it
    and is free soonest."""
    kept: dict[str, list] = {}
    for job in large:
        fit = [
            n
            for n in nodes
            if serves(n, job) and whole_types(site, n).get(kind(job.gres), 0) >= job.count and n not in kept
        ]
        if not fit:
            continue
        node = min(fit, key=lambda n: (ready_in(view.now, running_on.get(n, ())), n))
        kept[node] = [job]
    return kept


def _keep_line(view, node: str, job, t: str, weight: dict[str, int], new: int, others, running_on) -> str:
    small = sorted({r.job_id for r in running_on.get(node, ())})
    busy = (
        f"its GPU jobs {_ids(small)} end in {_mins_up(ready_in(view.now, running_on.get(node, ())))}"
        if small
        else "it has no GPU job now"
    )
    return (
        f"job {job.job_id} has waited {mins(job.age_s)} for {job.count} x {t.split(':', 1)[1]} on one node; "
        f"{node} can hold it ({busy}): weight {weight[node]} -> {new}, above {', '.join(others)} "
        f"({', '.join(str(weight[n]) for n in others)}), so new small {t.split(':', 1)[1]} jobs go there "
        "first; cost: none (scontrol update, no drain; slurm.conf's weight comes back at the next "
        "reconfigure)"
    )


def _weights_back(site, view) -> list[WeightChange]:
    """Nothing large waits: the policy's weight back on each node the live planner steered whose Slurm weight is
    still the one it set."""
    out = []
    for node, set_to in sorted(view.steered.items()):
        seen = view.nodes.get(node)
        try:
            want = policy_weight(site, node)
        except KeyError:  # no longer in the policy
            continue
        if seen is not None and seen.weight == set_to and set_to != want:
            out.append(
                WeightChange(
                    node,
                    seen.weight,
                    want,
                    f"no job waits for several whole GPUs on one node; "
                    f"{node}: weight {seen.weight} -> {want} (the policy's)",
                )
            )
    return out


def _ids(ids) -> str:
    ids = list(ids)
    return ",".join(map(str, ids[:7])) + (f" and {len(ids) - 7} more" if len(ids) > 7 else "")


def _mins_up(seconds: float) -> str:
    return "an unknown time (no time limit)" if math.isinf(seconds) else f"{math.ceil(seconds / 60)} min"
