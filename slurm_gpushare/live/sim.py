"""The live planner's loop in a simulator with departures: a static MIG layout against `plan_live`. Pure.

Data in (a policy document, jobs; ``trace_pool`` takes pods and times the caller read with ``trace``),
figures out. Every node is an A100-SXM4-40GB MIG node of one policy document; the site, the live limits (the
policy's ``live:``
section) and the layouts come from that document, and every change goes through the product's
``policy.document.with_layouts`` and ``policy.build_site``, so the planner that decides is the product's own.

What the simulated Slurm does (``LiveSim``):

- jobs are single-node, one MIG instance each (``gpu:<type>:1``), with CPUs and memory;
- scheduling, at every arrival, departure and layout change: jobs in priority (arrival) order, FIFO per
  GRES type: a job starts when every earlier job of its type has started and a node has a free instance of
  its type and its CPUs and memory; jobs of other types do not block it (what Slurm's backfill gives when
  instance types share no records and CPUs/memory do not bind; backfill's reservations are not modelled);
- node choice as slurmmodel (eval_nodes.c: lowest Weight, then the node with the fewest idle CPUs, first
  among equals, nodes in natural name order); inside the node the lowest-indexed free instance of the type
  in gres.conf order (GPU 0 first, each GPU's instances in layout order);
- a job ends at start + duration, and its time limit is its duration (squeue's EndTime is exact);
- the live loop (``live=True``) every ``interval`` seconds: build a ``ClusterView`` (pending jobs that have
  waited, running jobs with their end times, nodes with their configured GRES, the time of each node's last
  change, the locked nodes) and call the decision (``plan_live`` unless a test passes another); each
  proposal on a node that is not locked locks it (the gpushare-relayout-<node> reservation: no new job
  starts there); at the first loop run at which a locked node has no GPU job left (the same run when it has
  none already) its relayout starts, the node is drained for ``live.change_cost`` seconds, then gets every
  GPU layout of the proposal (``Proposal.change``: all the node's GPUs that change, in the one drain;
  ``with_layouts``), its change time is recorded and the lock is released;
- the static run never changes a layout.

Figures (``SimResult``): pending time per job (start - submit; a job still pending at the horizon counts
until the horizon and is also counted as not started), GPU allocation (compute slices of occupied MIG
instances over 7 x GPUs, integrated over [0, horizon]), jobs finished by the horizon, relayouts (node
changes) and GPU layout changes.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..hardware import GpuModel, get_model
from ..hardware.packing import covering, pack
from ..policy import Site, build_site
from ..policy.document import with_layouts
from ..sim.cluster import Pod
from ..sim.slurmmodel import consec_pick, natural_key
from .plan import plan_live
from .view import ClusterView, NodeView, PendingJob, RunningJob

MODEL = "A100-SXM4-40GB"
MAX_TIME = 86400  # s: the tier's max_time (1 day): trace runtimes are capped here
TIER = "mig"
GROUP = "sim"


@dataclass(frozen=True)
class SimJob:
    """One job: submitted at ``submit`` (s), runs ``duration`` s on one MIG instance of ``profile``."""

    job_id: int
    submit: float
    duration: float
    profile: str
    cpus: int = 1
    memory_mib: int = 0
    phase: int = 0


@dataclass(frozen=True)
class Phase:
    """``hours`` of arrivals whose MIG profiles are drawn with these weights, ``load`` x the cluster's slices
    offered."""

    name: str
    hours: float
    mix: tuple[tuple[str, float], ...]
    load: float = 0.8


@dataclass
class SimResult:
    name: str
    horizon: float
    jobs: int
    started: int
    finished: int
    not_started: int
    pending_mean: float
    pending_p95: float
    allocation: float  # % of compute slices occupied, time-averaged
    relayouts: int  # node layout changes
    gpu_changes: int  # GPU layout changes (a node change may change several GPUs)
    plan_calls: int = 0
    pending_by_profile: dict[str, float] = field(default_factory=dict)
    pending_by_phase: dict[int, float] = field(default_factory=dict)
    changes: list[tuple[float, str, int, tuple[str, ...]]] = field(default_factory=list)  # (time, node, gpu, layout)
    waits: dict[int, float] = field(default_factory=dict)  # job -> pending time (censored at the horizon)
    ends: dict[int, float] = field(default_factory=dict)  # job -> end time (jobs that ended by the horizon)


# ---- the site ------------------------------------------------------------------------------------------------


def node_names(nodes: int) -> list[str]:
    return [f"sim{i:02d}" for i in range(1, nodes + 1)]


def site_doc(
    nodes: int,
    layouts: Sequence[Sequence[str]],
    *,
    cpus: int = 256,
    memory_mb: int = 2_000_000,
    live: Mapping | None = None,
) -> dict:
    """The policy document of ``nodes`` nodes sim01.. of one group, GPU i laid out as ``layouts[i]``, one tier."""
    from hostlist import collect_hostlist

    sharing = [{"gpus": i, "mode": "mig", "layout": list(lay)} for i, lay in enumerate(layouts)]
    doc = {
        "version": 1,
        "cluster": {"name": "livesim", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {
                "name": GROUP,
                "nodes": collect_hostlist(node_names(nodes)),
                "gpu": {"model": MODEL, "count": len(layouts)},
                "cpus": cpus,
                "memory_mb": memory_mb,
                "sharing": sharing,
            }
        ],
        "tiers": [{"name": TIER, "node_groups": [GROUP], "default": True, "max_time": "1-00:00:00"}],
    }
    if live is not None:
        doc["live"] = dict(live)
    return doc


def node_layouts(site: Site) -> dict[str, list[tuple[str, ...]]]:
    """node -> each GPU's MIG layout (profiles in gres.conf order), from the validated site."""
    out = {}
    for g in site.groups:
        lays = [tuple(s.layout) if s.share.is_mig else () for s in g.gpus]
        for n in g.nodes:
            out[n] = list(lays)
    return out


# ---- the simulator ---------------------------------------------------------------------------------------------

_ARRIVE, _END, _TICK, _DONE = 1, 0, 3, 2  # at one time: departures, arrivals, relayouts done, then the loop


class LiveSim:
    """One run: ``doc`` the starting policy (with its ``live:`` limits), ``jobs`` the arrivals."""

    def __init__(
        self,
        doc: dict,
        jobs: Sequence[SimJob],
        *,
        horizon: float,
        live: bool,
        interval: float = 300.0,
        decide: Callable = plan_live,
        with_layouts: Callable = with_layouts,
        name: str = "",
    ):
        self.doc = doc
        self.site = build_site(doc, "livesim")
        self.model: GpuModel = get_model(MODEL)
        self.jobs = {j.job_id: j for j in jobs}
        self.horizon = float(horizon)
        self.live = live
        self.interval = float(interval)
        self.name = name or ("live" if live else "static")
        self.decide, self.with_layouts = decide, with_layouts  # the product's planner unless a test passes another
        lim = self.site.policy.live
        self.change_cost = float(lim.change_cost)
        self.names = sorted(node_layouts(self.site), key=natural_key)
        self.index = {n: i for i, n in enumerate(self.names)}
        spec = {n: (g.spec.cpus, g.spec.memory_mb, g.spec.weight or 1) for g in self.site.groups for n in g.nodes}
        self.cpu = np.array([spec[n][0] for n in self.names], dtype=np.int64)
        self.mem = np.array([spec[n][1] for n in self.names], dtype=np.int64)
        self.weight = np.array([spec[n][2] for n in self.names], dtype=np.int64)
        self.gpus = sum(len(g.gpus) * len(g.nodes) for g in self.site.groups)
        self.records: dict[str, list[list]] = {}  # node -> [[gpu, profile, slurm type, job or None], ...]
        lays = node_layouts(self.site)
        for n in self.names:
            self._set_records(n, lays[n])
        self.queues: dict[str, deque[int]] = {}  # slurm type -> pending job ids in arrival order
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.where: dict[int, tuple[str, int]] = {}  # running job -> (node, record index)
        self.locked: dict[str, dict[int, tuple[str, ...]]] = {}  # node -> {gpu: new layout}
        self.draining: set[str] = set()  # locked nodes whose relayout runs (drained for change_cost)
        self.changed: dict[str, float] = {}
        self.change_log: list[tuple[float, str, int, tuple[str, ...]]] = []
        self._fresh: set[str] = set()  # nodes locked by this loop run's proposals
        self.relayouts = 0
        self.plan_calls = 0
        self.occupied = 0  # compute slices of occupied instances, now
        self.slice_seconds = 0.0
        self.now = 0.0
        self.events: list[tuple[float, int, int, int]] = []
        self._seq = 0

    # -- records ----------------------------------------------------------------------------------------------
    def _set_records(self, node: str, layouts: Sequence[Sequence[str]]) -> None:
        self.records[node] = [[g, p, self.model.mig_slurm_type(p), None] for g, lay in enumerate(layouts) for p in lay]

    def slurm_type(self, profile: str) -> str:
        return self.model.mig_slurm_type(profile)

    def configured(self, node: str) -> dict[str, int]:
        return dict(Counter(f"gpu:{r[2]}" for r in self.records[node]))

    # -- events -----------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, payload))

    def run(self) -> SimResult:
        for j in sorted(self.jobs.values(), key=lambda j: (j.submit, j.job_id)):
            if j.submit < self.horizon:
                self._push(j.submit, _ARRIVE, j.job_id)
        if self.live:
            t = self.interval
            while t < self.horizon:
                self._push(t, _TICK, 0)
                t += self.interval
        while self.events and self.events[0][0] <= self.horizon:
            t = self.events[0][0]
            self._advance(t)
            dirty = False
            while self.events and self.events[0][0] == t:
                _, kind, _, payload = heapq.heappop(self.events)
                if kind == _END:
                    self._end(payload)
                    dirty = True
                elif kind == _DONE:
                    self._relayout_done(self.names[payload])
                    dirty = True
                elif kind == _ARRIVE:
                    self.queues.setdefault(self.slurm_type(self.jobs[payload].profile), deque()).append(payload)
                    dirty = True
                else:
                    if dirty:
                        self._schedule()
                        dirty = False
                    self._tick()
                    dirty = True
            if dirty:
                self._schedule()
        self._advance(self.horizon)
        return self._result()

    def _advance(self, t: float) -> None:
        self.slice_seconds += self.occupied * (t - self.now)
        self.now = t

    # -- Slurm ------------------------------------------------------------------------------------------------
    def _schedule(self) -> None:
        heads = [(self.jobs[q[0]].submit, q[0], t) for t, q in self.queues.items() if q]
        heapq.heapify(heads)
        while heads:
            _, jid, t = heapq.heappop(heads)
            if not self._try_start(jid, t):
                continue  # this type waits for its head (FIFO per type)
            q = self.queues[t]
            q.popleft()
            if q:
                heapq.heappush(heads, (self.jobs[q[0]].submit, q[0], t))

    def _try_start(self, jid: int, stype: str) -> bool:
        job = self.jobs[jid]
        ok = np.zeros(len(self.names), dtype=bool)
        for i, n in enumerate(self.names):
            if n in self.locked or self.cpu[i] < job.cpus or self.mem[i] < job.memory_mib:
                continue
            ok[i] = any(r[3] is None and r[2] == stype for r in self.records[n])
        i = consec_pick(ok, self.weight, self.cpu)
        if i < 0:
            return False
        n = self.names[i]
        k = next(k for k, r in enumerate(self.records[n]) if r[3] is None and r[2] == stype)
        self.records[n][k][3] = jid
        self.cpu[i] -= job.cpus
        self.mem[i] -= job.memory_mib
        self.occupied += self.model.profile(job.profile).compute_slices
        self.start[jid] = self.now
        self.where[jid] = (n, k)
        self._push(self.now + job.duration, _END, jid)
        return True

    def _end(self, jid: int) -> None:
        job = self.jobs[jid]
        n, k = self.where.pop(jid)
        i = self.index[n]
        self.records[n][k][3] = None
        self.cpu[i] += job.cpus
        self.mem[i] += job.memory_mib
        self.occupied -= self.model.profile(job.profile).compute_slices
        self.end[jid] = self.now

    # -- the live loop ----------------------------------------------------------------------------------------
    def _busy(self, node: str) -> bool:
        return any(r[3] is not None for r in self.records[node])

    def _tick(self) -> None:
        for n in sorted(self.locked, key=natural_key):  # locks taken earlier whose jobs have ended since
            if n not in self.draining and not self._busy(n):
                self._begin_relayout(n)
        self.plan_calls += 1
        plan = self.decide(self.site, self.view())
        for p in plan.proposals:
            if p.node in self.locked and p.node not in self._fresh:
                continue  # held by an earlier lock: that change is carried out first
            self._fresh.add(p.node)
            lock = self.locked.setdefault(p.node, {})
            lock.update(p.change.new_layouts)  # every GPU of the proposal, in the one drain
        for n in sorted(self._fresh, key=natural_key):
            if not self._busy(n):
                self._begin_relayout(n)
        self._fresh.clear()

    def _begin_relayout(self, node: str) -> None:
        self.draining.add(node)
        self._push(self.now + self.change_cost, _DONE, self.index[node])

    def _relayout_done(self, node: str) -> None:
        doc = self.doc
        layouts = {gpu: tuple(layout) for gpu, layout in sorted(self.locked.pop(node).items())}
        doc = self.with_layouts(doc, node, layouts)  # validated as one set, as the apply side writes it
        self.change_log += [(self.now, node, gpu, layout) for gpu, layout in layouts.items()]
        self.doc = doc
        self.site = build_site(doc, "livesim")
        self._set_records(node, node_layouts(self.site)[node])
        self.draining.discard(node)
        self.changed[node] = self.now
        self.relayouts += 1

    def view(self) -> ClusterView:
        """The simulator's state as ``view.view_from_client`` would read it from Slurm."""
        pending = []
        for stype, q in self.queues.items():
            for pos, jid in enumerate(q):
                age = self.now - self.jobs[jid].submit
                pending.append(
                    PendingJob(
                        job_id=jid,
                        gres=f"gpu:{stype}",
                        count=1,
                        age_s=age,
                        priority=int(age) + 1,
                        reason="Resources" if pos == 0 else "Priority",
                        partition=TIER,
                    )
                )
        pending.sort(key=lambda p: (-p.priority, p.job_id))
        running = []
        for jid, (n, k) in self.where.items():
            running.append(
                RunningJob(
                    job_id=jid,
                    node=n,
                    gres={f"gpu:{self.records[n][k][2]}": 1},
                    end_time=self.start[jid] + self.jobs[jid].duration,
                )
            )
        nodes = {}
        for n in self.names:
            busy = sum(r[3] is not None for r in self.records[n])
            state = ["ALLOCATED" if busy == len(self.records[n]) and busy else "MIXED" if busy else "IDLE"]
            reason = ""
            if n in self.draining:
                state.append("DRAIN")
                reason = "gpushare relayout: applying the live layout"
            elif n in self.locked:
                state.append("MAINTENANCE")
                state.append("RESERVED")
            nodes[n] = NodeView(name=n, state=tuple(state), reason=reason, gres=self.configured(n))
        return ClusterView(
            now=self.now,
            pending=tuple(pending),
            running=tuple(sorted(running, key=lambda r: r.job_id)),
            nodes=nodes,
            changes=dict(self.changed),
            locked=frozenset(self.locked),
        )

    # -- figures ----------------------------------------------------------------------------------------------
    def _result(self) -> SimResult:
        arrived = [j for j in self.jobs.values() if j.submit < self.horizon]
        waits = {j.job_id: self.start.get(j.job_id, self.horizon) - j.submit for j in arrived}
        w = np.array(list(waits.values()), dtype=float) if waits else np.zeros(1)
        by_prof: dict[str, list[float]] = {}
        by_phase: dict[int, list[float]] = {}
        for j in arrived:
            by_prof.setdefault(j.profile, []).append(waits[j.job_id])
            by_phase.setdefault(j.phase, []).append(waits[j.job_id])
        total = 7 * self.gpus * self.horizon  # A100: 7 compute slices
        return SimResult(
            name=self.name,
            horizon=self.horizon,
            jobs=len(arrived),
            started=len(self.start),
            finished=len(self.end),
            not_started=len(arrived) - len(self.start),
            pending_mean=float(w.mean()),
            pending_p95=float(np.percentile(w, 95)),
            allocation=100.0 * self.slice_seconds / total if total else 0.0,
            relayouts=self.relayouts,
            gpu_changes=len(self.change_log),
            plan_calls=self.plan_calls,
            pending_by_profile={k: float(np.mean(v)) for k, v in sorted(by_prof.items())},
            pending_by_phase={k: float(np.mean(v)) for k, v in sorted(by_phase.items())},
            changes=list(self.change_log),
            waits=waits,
            ends=dict(self.end),
        )


def simulate(
    doc: dict,
    jobs: Sequence[SimJob],
    *,
    horizon: float,
    live: bool,
    interval: float = 300.0,
    decide: Callable = plan_live,
    with_layouts: Callable = with_layouts,
    name: str = "",
) -> SimResult:
    sim = LiveSim(
        doc, jobs, horizon=horizon, live=live, interval=interval, decide=decide, with_layouts=with_layouts, name=name
    )
    return sim.run()


# ---- arrivals from the trace -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracePool:
    """The trace's one-GPU fractional pods by the MIG profile their share rounds up to (S2's rounding), each with
    its CPUs, memory and runtime (None where the trace has none)."""

    by_profile: dict[str, tuple[tuple[int, int, float | None], ...]]  # profile -> ((cpus, memory_mib, runtime), ...)

    def runtimes(self, profile: str) -> np.ndarray:
        return np.array([r for _, _, r in self.by_profile[profile] if r is not None], dtype=float)

    def mean_runtime(self, profile: str) -> float:
        return float(self.runtimes(profile).mean())


def trace_pool(
    pods: Sequence[Pod],
    times: Mapping[str, tuple[int, int | None, int | None]],
    model: GpuModel | None = None,
    max_time: float = MAX_TIME,
) -> TracePool:
    """Runtime = deletion_time - scheduled_time for a pod the trace scheduled (capped at ``max_time``, at least
    1 s); None for a pod never scheduled (pod_phase Pending: its deletion - creation is a wait, not a run)."""
    model = model or get_model(MODEL)
    out: dict[str, list] = {}
    for p in pods:
        if p.num_gpu != 1 or p.gpu_milli >= 1000:
            continue
        profile = covering(model, p.gpu_milli)
        if profile is None:
            continue
        _, sched, deleted = times.get(p.name, (0, None, None))
        run = None
        if sched is not None and deleted is not None:
            run = float(min(max(deleted - sched, 1), max_time))
        cpus = max(1, -(-p.cpu_milli // 1000))
        out.setdefault(profile, []).append((cpus, p.memory_mib, run))
    return TracePool({k: tuple(v) for k, v in sorted(out.items())})


def default_phases(hours: float = 12.0, load: float = 0.8) -> tuple[Phase, ...]:
    """Small notebooks, then 3g training runs, then small again: A (40 % 1g.5gb, 40 % 1g.10gb, 20 % 3g.20gb),
    B (10 %, 10 %, 80 %), A."""
    a = (("1g.5gb", 0.4), ("1g.10gb", 0.4), ("3g.20gb", 0.2))
    b = (("1g.5gb", 0.1), ("1g.10gb", 0.1), ("3g.20gb", 0.8))
    return (Phase("A", hours, a, load), Phase("B", hours, b, load), Phase("A", hours, a, load))


def trace_jobs(
    pool: TracePool, phases: Sequence[Phase], gpus: int, seed: int, model: GpuModel | None = None
) -> list[SimJob]:
    """Poisson arrivals, phase by phase, seeded.

    In each phase the rate is ``load`` x the cluster's compute slices (7 x ``gpus``) over the phase's mean
    slice-seconds per job (sum over profiles of weight x mean runtime x compute slices). Each arrival draws
    a profile by the phase's weights, then one of the trace's pods of that profile uniformly (its CPUs,
    memory and runtime); a pod without a runtime gets one drawn uniformly from the known runtimes of its
    profile's pods (the stated distribution: that profile's empirical runtimes).
    """
    model = model or get_model(MODEL)
    rng = np.random.default_rng(seed)
    jobs: list[SimJob] = []
    t0 = 0.0
    for k, ph in enumerate(phases):
        profiles = [p for p, _ in ph.mix]
        w = np.array([x for _, x in ph.mix], dtype=float)
        w = w / w.sum()
        per_job = sum(
            wi * pool.mean_runtime(p) * model.profile(p).compute_slices for p, wi in zip(profiles, w, strict=False)
        )
        rate = ph.load * 7 * gpus / per_job
        end = t0 + ph.hours * 3600.0
        t = t0
        while True:
            t += float(rng.exponential(1.0 / rate))
            if t >= end:
                break
            prof = profiles[int(rng.choice(len(profiles), p=w))]
            rows = pool.by_profile[prof]
            cpus, mem, run = rows[int(rng.integers(len(rows)))]
            if run is None:
                known = pool.runtimes(prof)
                run = float(known[int(rng.integers(len(known)))])
            jobs.append(SimJob(len(jobs) + 1, t, run, prof, cpus, mem, k))
        t0 = end
    return jobs


def static_layouts(pool: TracePool, phase: Phase, gpus: int, model: GpuModel | None = None) -> list[tuple[str, ...]]:
    """The static planner's packing (``hardware.packing.pack``) of ``phase``'s mix for one node of ``gpus`` GPUs.

    Each profile's share of the running instances is its weight x mean runtime (Little's law); the counts
    are scaled up until the packing fills the node's GPUs, and the node is filled with that packing.
    """
    model = model or get_model(MODEL)
    share = {p: w * pool.mean_runtime(p) for p, w in phase.mix if w > 0}
    total = sum(share.values())
    best: list[tuple[str, ...]] = []
    scale = 1
    while True:
        need = Counter({p: max(1, round(scale * s / total)) for p, s in share.items()})
        lays = pack(model, need)
        if len(lays) > gpus:
            break
        best = lays
        scale += 1
        if scale > 7 * gpus * 4:
            break
    if not best:
        raise ValueError(f"phase {phase.name}: its mix needs more than {gpus} GPUs for one instance of each profile")
    while len(best) < gpus:
        best.append(best[len(best) % max(1, len(best))])
    return [tuple(x) for x in best[:gpus]]


def summary_line(r: SimResult) -> str:
    return (
        f"{r.name}: jobs {r.jobs}, pending mean {r.pending_mean:.0f} s, p95 {r.pending_p95:.0f} s, "
        f"allocation {r.allocation:.2f} %, finished {r.finished}, not started {r.not_started}, "
        f"relayouts {r.relayouts}"
    )
