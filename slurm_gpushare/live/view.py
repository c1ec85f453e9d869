"""What the live planner sees of the cluster: the queue, the running GPU jobs, the nodes, the recent history.

``ClusterView`` is the planner's input (``live.plan.plan_live``); it is read
through the Slurm client (slurm/) by ``view_from_client``, with what the apply
side keeps (each node's last change, the nodes locked by a gpushare-relayout
reservation, the weights it set) added by ``live.observe``.
"""

from __future__ import annotations

import math
import posixpath
from collections import Counter
from dataclasses import dataclass, field

from ..policy import Site
from ..policy.share import SHARED_GRES
from ..slurm.interface import SlurmClient
from ..slurm.states import drained, unavailable

# squeue reasons of a job that waits for nodes or GRES (not held, not a limit of its account or QOS)
COUNTED_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required_for_job", "NodeDown")
RELAYOUT_REASON = "gpushare relayout"  # the drain reason of a node under (or failed in) relayout starts so


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
    """A job that ran on ``node`` and ended within ``live.history_window`` (sacct, ``ClusterView.history``)."""

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

    @property
    def unavailable(self) -> bool:
        """The node starts no job now (slurm.states)."""
        return unavailable(self.state)


@dataclass(frozen=True)
class ClusterView:
    now: float
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    nodes: dict[str, NodeView]
    changes: dict[str, float] = field(default_factory=dict)  # node -> epoch of its last change (or attempt)
    locked: frozenset[str] = frozenset()  # nodes whose gpushare-relayout-<node> reservation exists
    history: tuple[RecentJob, ...] = ()  # jobs that ended within live.history_window, one per node they ran on
    steered: dict[str, int] = field(default_factory=dict)  # node -> the weight the live planner set (state file)


def view_from_client(
    client: SlurmClient, site: Site, now: float, changes: dict[str, float] | None = None, locked=frozenset()
) -> ClusterView:
    """The queue, running GPU jobs and nodes as the Slurm client (slurm/) reads them (``jobs()``, ``nodes()``)."""
    pending, running = [], []
    for job in client.jobs():
        if job.state == "PENDING":
            if job.gres_request:
                pending.append(_pending(job, now))
        elif job.gres_alloc:
            for node, use in job.gres_alloc.items():
                gres = {k: u.count for k, u in use.items() if u.count}
                if gres:
                    running.append(RunningJob(job.job_id, node, gres, float(job.end_time) if job.end_time else None))
    nodes = {n.name: NodeView(n.name, tuple(n.state), n.reason, dict(n.gres), n.weight) for n in client.nodes()}
    window = site.policy.live.history_window
    history = recent_from_records(client.recent_jobs(now - window, now)) if window > 0 else ()
    return ClusterView(now, tuple(pending), tuple(running), nodes, dict(changes or {}), frozenset(locked), history)


def _pending(job, now: float) -> PendingJob:
    key = next((k for k in job.gres_request if k.startswith("gpu")), next(iter(job.gres_request)))
    age = max(0.0, now - job.submit_time) if job.submit_time else 0.0
    return PendingJob(
        job.job_id, key, int(job.gres_request[key]), age, int(job.priority or 0), job.reason, job.partition
    )


def recent_from_records(records) -> tuple[RecentJob, ...]:
    """``slurm.history.FinishedJob`` records (the client's ``recent_jobs``) as one RecentJob per node a GPU job
    ran on; the untyped ``gpu`` total is dropped where a typed ``gpu:<type>`` says the same."""
    out = []
    for rec in records:
        gres = {k: int(v) for k, v in rec.gres.items() if v and k.split(":", 1)[0] in ("gpu", *SHARED_GRES)}
        if any(k.startswith("gpu:") for k in gres):
            gres.pop("gpu", None)
        if gres:
            out += [RecentJob(str(rec.job_id), node, gres, float(rec.start), float(rec.end)) for node in rec.nodes]
    return tuple(out)


def live_policy_path(site: Site) -> str:
    """Where apply writes the live policy: ``live.policy_file``, else gpushare-live.yaml beside slurm.conf."""
    return site.policy.live.policy_file or posixpath.join(site.cluster.paths.slurm_conf_dir, "gpushare-live.yaml")


def under_relayout(view: NodeView | None, locked: frozenset[str], name: str) -> bool:
    """The node holds a gpushare-relayout reservation or is drained with a gpushare relayout reason."""
    return name in locked or (view is not None and drained(view.state) and view.reason.startswith(RELAYOUT_REASON))


def kind(key: str) -> str:
    """A GRES key as the planner counts it: 'gpu:<type>' as is, 'shard:l40s' / 'mps:x' as 'shard' / 'mps'."""
    name = key.split(":", 1)[0]
    return name if name in SHARED_GRES else key


def by_kind(gres) -> Counter:
    """GRES counts by ``kind``: 'shard:l40s' and 'shard' both as 'shard'."""
    out: Counter = Counter()
    for k, v in gres.items():
        out[kind(k)] += v
    return out


def ready_in(now: float, running) -> float:
    """Seconds until the last of these RunningJobs ends by its time limit (inf when one has none)."""
    if any(r.end_time is None for r in running):
        return math.inf
    return max([0.0] + [r.end_time - now for r in running])
