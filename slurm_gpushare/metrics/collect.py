"""The controller's metric families, computed from one read of Slurm and the site policy. Pure.

Input is what the Slurm client returns (``slurm.model`` Job and Node, sshare
rows, sacctmgr association rows), or None for a part whose read failed: the
families that need it are left out and the rest are still computed. Output
is plain data (``Family``), which ``exporter`` turns into prometheus_client
families; nothing here imports prometheus_client.

GPU-equivalents use the billing fractions (``accounting.usage.GpuConverter``
over ``policy.billing.tier_fractions``): a MIG slice is its share of its GPU
(1g.5gb of an A100-40GB = 1/7), a shard 1/replicas, an MPS unit 1/units, a
whole GPU 1. A per-job MIG slice (held as its profile's weight in carrier
shards per node) is the fixed slice of its profile, kind mig.

Per-job MIG GPUs: the slices running jobs hold, per node and profile, from
each job's carrier shards on the node (a weight is one profile there). How
many more of a profile could be made depends on where the running instances
sit on each GPU, which Slurm does not know: the node textfile says it
(``gpushare_node_mig_per_job_free``, from the node's journals). A running job's units are what Slurm allocated per node
(``gres_detail``); where the backend does not say (pyslurm 24.11 leaves
``gres_alloc`` empty) the per-node request times the number of nodes.

Labels come from Slurm and the policy only (accounts, users, partitions,
GRES types, node names, pending reasons), never job ids.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..accounting.usage import GpuConverter
from ..policy import Site
from ..policy.share import SHARED_GRES
from ..slurm import states
from ..slurm.model import Job, Node
from ..slurm.sacctmgr import AssocRow
from ..slurm.sshare import ShareRow

GPU_GRES = ("gpu", "shard", "mps")


@dataclass
class Family:
    """One metric family: name (without _total for counters), type, help, label names, samples by label values."""

    name: str
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    samples: dict[tuple[str, ...], float] = field(default_factory=dict)

    def add(self, key: tuple[str, ...], value: float) -> None:
        self.samples[key] = self.samples.get(key, 0.0) + value


@dataclass(frozen=True)
class SlurmRead:
    """One scrape's read of Slurm; None where that part could not be read."""

    jobs: Sequence[Job] | None
    nodes: Sequence[Node] | None
    shares: Sequence[ShareRow] | None
    associations: Sequence[AssocRow] | None
    now: float


class SiteMetrics:
    """What the policy decides about metrics: fractions (billing's), MIG types, tiers. Built once per exporter."""

    def __init__(self, site: Site):
        self.site = site
        self.converter = GpuConverter(site)
        self.mig_types = frozenset(t for g in site.groups for s in g.gpus if s.share.is_mig for t in s.mig_types())
        self.mig_types |= {t for g in site.groups for t in g.slice_types}  # per-job slices are MIG slices too
        # per-job MIG groups: carrier shards per node -> the profile they carry
        self.carried = {
            g.name: {
                w: p
                for s in g.gpus
                if s.share.is_per_job_mig
                for p, w in zip(s.share.profiles, s.share.weights, strict=True)
            }
            for g in site.groups
            if g.slice_types
        }
        self.tiers = frozenset(t.name for t in site.tiers)
        self._units: dict[tuple[str, str, int, int], tuple[str, str, float]] = {}
        self._typed: dict[tuple[str, str], str] = {}

    def tier(self, partition: str) -> str:
        """A policy tier is a Slurm partition of the same name; another partition is named as it is."""
        return partition

    def typed(self, node: str, key: str) -> str:
        """An untyped shard/mps key as 'shard:<type>' when the policy gives that node's GPUs of that mode one
        Slurm type (the node registers them typed; a job's gres_detail does not say the type)."""
        name, _, gtype = key.partition(":")
        if gtype or name not in SHARED_GRES:
            return key
        memo = (node, name)
        hit = self._typed.get(memo)
        if hit is None:
            try:
                types = {s.slurm_type for s in self.site.group_for_node(node).slots(name)}
            except KeyError:  # a node the policy does not name
                types = set()
            hit = self._typed[memo] = f"{name}:{types.pop()}" if len(types) == 1 else key
        return hit

    def node_slices(self, node: str) -> dict[int, str]:
        """A per-job MIG node's carrier shards per node -> the profile they carry; {} for another node."""
        try:
            return self.carried.get(self.site.group_for_node(node).name, {})
        except KeyError:  # a node the policy does not name
            return {}

    def units(self, partition: str, key: str, count: int, nodes: int = 1) -> tuple[str, str, float]:
        """(kind, gres_type, GPU-equivalents) of ``count`` units of GRES ``key`` ('gpu:l40s', 'shard', ...) over
        ``nodes`` nodes."""
        memo = (partition, key, count, nodes)
        hit = self._units.get(memo)
        if hit is None:
            hit = self._units[memo] = self._convert(partition, key, count, nodes)
        return hit

    def _convert(self, partition: str, key: str, count: int, nodes: int) -> tuple[str, str, float]:
        name, _, gtype = key.partition(":")
        tres = {f"gres/{key}": float(count)} if gtype or name != "gpu" else {"gres/gpu": float(count)}
        job = self.converter.convert_tres(partition, {**tres, "node": float(nodes)})
        kind_name = job.kinds[0][0] if job.kinds else key  # 'gpu:<type>' (an untyped GPU may resolve to one)
        if name == "gpu" or kind_name.startswith("gpu:"):  # a GPU, a MIG slice, or shards that carry a slice
            gtype = kind_name.partition(":")[2]
            return ("mig" if gtype in self.mig_types else "whole"), gtype, job.gpus
        return name, gtype, job.gpus


def split(key: str) -> tuple[str, str]:
    name, _, gtype = key.partition(":")
    return name, gtype


# ---- the families ---------------------------------------------------------------------------------


def families(sm: SiteMetrics, snap: SlurmRead) -> list[Family]:
    """Every family the snapshot's parts allow, in a stable order."""
    out: list[Family] = []
    if snap.jobs is not None:
        out.append(allocated(sm, snap.jobs))
        out += pending(sm, snap.jobs, snap.now)
        if sm.carried:
            out.append(per_job_slices(sm, snap.jobs, snap.nodes))
    if snap.nodes is not None:
        out += supply(snap.nodes, snap.jobs)
        out += node_state(snap.nodes)
        if snap.jobs is not None:
            out.append(stranded(snap.nodes, snap.jobs))
    if snap.shares is not None:
        out += fairshare(snap.shares)
    if snap.associations is not None:
        out += quota(snap.associations, snap.jobs)
    return out


def running_units(job: Job, typed: Callable[[str, str], str] | None = None) -> dict[str, int]:
    """GRES units a running job holds over all its nodes: {'gpu:l40s': 2, 'shard': 1}.

    ``typed(node, key)`` may name an untyped key's type on that node (Slurm's gres_detail says 'shard:1'
    on a node configured 'shard:l40s:4').
    """
    out: Counter[str] = Counter()
    if job.gres_alloc:
        for node, use in job.gres_alloc.items():
            for key, u in use.items():
                out[typed(node, key) if typed else key] += u.count
        return dict(out)
    n = node_count(job.nodes) if job.gres_request else 0
    return {key: count * n for key, count in job.gres_request.items()}


def node_count(nodes: str) -> int:
    if not nodes:
        return 1
    from hostlist import expand_hostlist

    try:
        return len(expand_hostlist(nodes)) or 1
    except Exception:  # hostlist.BadHostlist: count the commas rather than fail the scrape
        return nodes.count(",") + 1


def allocated(sm: SiteMetrics, jobs: Iterable[Job]) -> Family:
    fam = Family(
        "gpushare_gpu_equivalents_allocated",
        "gauge",
        "GPU-equivalents held by running jobs now (billing's fractions: a MIG slice its share of the GPU, "
        "a shard 1/replicas, an MPS unit 1/units); tenant is the Slurm account, tier the partition",
        ("tenant", "user", "tier", "kind", "gres_type"),
    )
    for job in jobs:
        if job.state != "RUNNING":
            continue
        tier = sm.tier(job.partition)
        nodes = len(job.gres_alloc) or node_count(job.nodes)
        for key, count in running_units(job, sm.typed).items():
            if split(key)[0] not in GPU_GRES or count <= 0:
                continue
            kind, gtype, gpus = sm.units(job.partition, key, count, nodes)
            fam.add((job.account, job.user, tier, kind, gtype), gpus)
    return fam


def per_job_slices(sm: SiteMetrics, jobs: Iterable[Job], nodes: Iterable[Node] | None) -> Family:
    """Per-job MIG slices running jobs hold, by node and profile; every profile of every per-job node the nodes'
    read names, at 0 when none runs."""
    fam = Family(
        "gpushare_per_job_mig_slices",
        "gauge",
        "Per-job MIG slices running jobs hold on the node, by profile (from each job's carrier shards there; how "
        "many more fit is the node's gpushare_node_mig_per_job_free)",
        ("node", "profile"),
    )
    for n in nodes or ():
        for profile in sm.node_slices(n.name).values():
            fam.add((n.name, profile), 0)
    for job in jobs:
        if job.state != "RUNNING":
            continue
        for node, key, count in _per_node(job):
            carried = sm.node_slices(node).get(count) if split(key)[0] == "shard" else None
            if carried is not None:
                fam.add((node, carried), 1)
    return fam


def _per_node(job: Job) -> Iterable[tuple[str, str, int]]:
    """(node, GRES key, units) a running job holds on each node: Slurm's per-node allocation, or where the backend
    does not say (pyslurm 24.11) its per-node request on each of its nodes."""
    if job.gres_alloc:
        return [(node, key, u.count) for node, use in job.gres_alloc.items() for key, u in use.items()]
    from hostlist import expand_hostlist

    try:
        names = expand_hostlist(job.nodes) if job.nodes else []
    except Exception:  # hostlist.BadHostlist: leave the job out rather than fail the scrape
        return []
    return [(node, key, count) for node in names for key, count in job.gres_request.items()]


def pending(sm: SiteMetrics, jobs: Iterable[Job], now: float) -> list[Family]:
    """Pending jobs, the GPU-equivalents they ask for and the oldest's age, by what they ask for: a per-job MIG
    slice (carried by shards: its profile's weight, ``policy.billing.carried_slices``) as the gpu type of its
    profile, like a fixed slice of that profile."""
    labels = ("gres", "gres_type", "reason")
    count = Family(
        "gpushare_jobs_pending",
        "gauge",
        "Pending jobs by the GRES they ask for (gres and gres_type empty for jobs asking none; a job asking "
        "two GRES counts under each) and Slurm's pending reason",
        labels,
    )
    gpus = Family(
        "gpushare_pending_gpu_equivalents",
        "gauge",
        "GPU-equivalents pending jobs ask for (the per-node request, counted once per job)",
        labels,
    )
    oldest: dict[tuple[str, str], float] = {}
    for job in jobs:
        if job.state != "PENDING":
            continue
        partition = job.partition.split(",")[0]
        asks = [(k, c) for k, c in job.gres_request.items() if split(k)[0] in GPU_GRES] or [("", 0)]
        for key, n in asks:
            kind, carried, equivalents = sm.units(partition, key, n) if n > 0 else ("", "", 0.0)
            name, gtype = split(key)
            if name == "shard" and kind == "mig":  # a per-job slice's carrier shards: the slice the job asked for
                name, gtype = "gpu", carried
            count.add((name, gtype, job.reason), 1)
            gpus.add((name, gtype, job.reason), equivalents)
            if job.submit_time:
                oldest[name, gtype] = min(oldest.get((name, gtype), job.submit_time), job.submit_time)
    age = Family(
        "gpushare_pending_oldest_age_seconds",
        "gauge",
        "Seconds since the oldest pending job asking this GRES was submitted",
        ("gres", "gres_type"),
    )
    for gres, t in oldest.items():
        age.add(gres, max(0.0, now - t))
    return [count, gpus, age]


def node_allocated(node: Node, key: str, running_on_node: Mapping[str, int] | None) -> int:
    """Units of configured GRES ``key`` in use on the node.

    From the node's TRES in use: Slurm lists a typed GRES both typed and
    untyped ('gres/gpu:l40s=1,gres/gpu=1') but shard and mps only untyped
    ('gres/shard=1' on a node configured 'shard:l40s:4'). When a name has
    several types on the node and a type has no typed entry, the running
    jobs' per-node allocations (the CLI backend's gres_detail) decide.
    """
    alloc = node.gres_alloc
    if key in alloc:
        return alloc[key]
    name, _ = split(key)
    same = [k for k in node.gres if split(k)[0] == name]
    if len(same) == 1:
        return alloc.get(name, 0)
    missing = [k for k in same if k not in alloc]
    if len(missing) == 1:
        return max(0, alloc.get(name, 0) - sum(alloc.get(k, 0) for k in same if k in alloc))
    return (running_on_node or {}).get(key, 0)


def _running_by_node(jobs: Iterable[Job] | None) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for job in jobs or ():
        if job.state == "RUNNING":
            for node, use in job.gres_alloc.items():
                for key, u in use.items():
                    out[node][key] += u.count
    return out


def supply(nodes: Iterable[Node], jobs: Iterable[Job] | None) -> list[Family]:
    labels = ("node", "gres", "gres_type")
    note = "; on a node with shard or mps the gpu row is the GPU they ride on"
    conf = Family(
        "gpushare_gres_configured",
        "gauge",
        "GRES units the node declares (MIG slices are gpu with a MIG type)" + note,
        labels,
    )
    used = Family("gpushare_gres_allocated", "gauge", "GRES units allocated to jobs on the node now" + note, labels)
    free = Family(
        "gpushare_gres_free",
        "gauge",
        "GRES units configured and not allocated (Slurm's counters; "
        "a drained node's free units are counted too)" + note,
        labels,
    )
    by_node = _running_by_node(jobs)
    for node in nodes:
        for key, total in node.gres.items():
            name, gtype = split(key)
            if name not in GPU_GRES:
                continue
            n = node_allocated(node, key, by_node.get(node.name))
            conf.add((node.name, name, gtype), total)
            used.add((node.name, name, gtype), n)
            free.add((node.name, name, gtype), max(0, total - n))
    return [conf, used, free]


def state_text(node: Node) -> str:
    return "+".join(node.state)


def is_drained(node: Node) -> bool:
    return states.drained(node.state)


def available(node: Node) -> bool:
    """False when the node takes no new jobs (``slurm.states``): its free units are not stranded but unavailable."""
    return not states.unavailable(node.state)


def node_state(nodes: Iterable[Node]) -> list[Family]:
    info = Family(
        "gpushare_node_info",
        "gauge",
        "1 for each node, with its Slurm state (base state, then flags sorted, joined by +) and reason",
        ("node", "state", "reason"),
    )
    drained = Family(
        "gpushare_node_drained", "gauge", "1 for each drained or draining node, with Slurm's reason", ("node", "reason")
    )
    for node in nodes:
        info.add((node.name, state_text(node), node.reason), 1)
        if is_drained(node):
            drained.add((node.name, node.reason), 1)
    return [info, drained]


@dataclass(frozen=True)
class Ask:
    """One pending job's GRES request, as far as fitting free units goes."""

    partitions: frozenset[str]
    name: str
    gtype: str
    count: int

    def fits(self, node: Node, name: str, gtype: str, free: int) -> bool:
        return (
            name == self.name
            and (not self.gtype or self.gtype == gtype)
            and self.count <= free
            and bool(self.partitions & set(node.partitions))
        )


def stranded(nodes: Iterable[Node], jobs: Iterable[Job]) -> Family:
    fam = Family(
        "gpushare_stranded_units",
        "gauge",
        "Free GRES units on an available node that no pending job can use (wrong type or size, too few "
        "on the node, or not in the job's partitions): the fragmentation the planner works on. 0 when no "
        "job asking gpu, shard or mps is pending (idle capacity is not stranded); drained and down nodes "
        "are not counted here (see gpushare_node_drained)",
        ("node", "gres", "gres_type"),
    )
    asks = {
        Ask(frozenset(j.partition.split(",")), *split(k), c)
        for j in jobs
        if j.state == "PENDING"
        for k, c in j.gres_request.items()
        if split(k)[0] in GPU_GRES
    }
    by_node = _running_by_node(jobs)
    for node in nodes:
        if not available(node):
            continue
        for key, total in node.gres.items():
            name, gtype = split(key)
            if name not in GPU_GRES:
                continue
            free = max(0, total - node_allocated(node, key, by_node.get(node.name)))
            stuck = free > 0 and bool(asks) and not any(a.fits(node, name, gtype, free) for a in asks)
            fam.add((node.name, name, gtype), free if stuck else 0)
    return fam


def fairshare(rows: Iterable[ShareRow]) -> list[Family]:
    labels = ("account", "user")
    level = Family(
        "gpushare_fairshare_level_fs",
        "gauge",
        "Fair Tree LevelFS of each association as sshare reports it (user empty for an account row; "
        "+Inf for an association with no usage; left out where sshare prints none)",
        labels,
    )
    factor = Family(
        "gpushare_fairshare_factor",
        "gauge",
        "Fair-share factor (0..1) of each association as sshare reports it (users only under Fair Tree)",
        labels,
    )
    for row in rows:
        if row.level_fs is not None:
            level.samples[row.key] = row.level_fs
        if row.fairshare is not None:
            factor.samples[row.key] = row.fairshare
    return [level, factor]


def held_tres(job: Job) -> Counter[str]:
    """The gres TRES a running job counts against GrpTRES: gres/gpu for every GPU or MIG slice, typed ones too."""
    out: Counter[str] = Counter()
    for key, count in running_units(job).items():
        name, gtype = split(key)
        out[f"gres/{name}"] += count
        if gtype:
            out[f"gres/{key}"] += count
    return out


def quota(assocs: Iterable[AssocRow], jobs: Iterable[Job] | None) -> list[Family]:
    labels = ("account", "tres")
    limit = Family("gpushare_quota_limit", "gauge", "GrpTRES limit of each account (sacctmgr)", labels)
    used = Family(
        "gpushare_quota_used",
        "gauge",
        "TRES the running jobs of the account and its sub-accounts hold now, for each gres TRES the "
        "account has a GrpTRES limit on (the units GrpTRES counts)",
        labels,
    )
    accounts = [a for a in assocs if a.user is None]
    children: dict[str, list[str]] = defaultdict(list)
    for a in accounts:
        if a.parent and a.parent != a.account:
            children[a.parent].append(a.account)
    own: dict[str, Counter[str]] = defaultdict(Counter)
    for job in jobs or ():
        if job.state == "RUNNING":
            own[job.account].update(held_tres(job))

    def subtree(account: str, seen: set[str]) -> Counter[str]:
        total = Counter(own.get(account, {}))
        for child in children.get(account, ()):
            if child not in seen:
                seen.add(child)
                total.update(subtree(child, seen))
        return total

    for a in accounts:
        if not a.grp_tres:
            continue
        held = subtree(a.account, {a.account}) if jobs is not None else None
        for tres, value in sorted(a.grp_tres.items()):
            limit.samples[a.account, tres] = value
            if held is not None and tres.startswith("gres/"):
                used.samples[a.account, tres] = held.get(tres, 0)
    return [used, limit]
