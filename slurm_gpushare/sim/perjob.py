"""Per-job MIG GPUs in the simulator: the slice the prolog places on the GPU Slurm picked. Pure.

A per-job MIG GPU is declared to Slurm as one gpu record and ``capacity``
carrier shards (``policy.perjob``); a job asking for a slice of profile p
takes ``weight(p)`` shards of one GPU, the GPU Slurm's own pick gives it
(first fit, or least loaded with LL_SHARED_GRES: ``slurmmodel``). Slurm never
sees the instances: the prolog then places the slice on that GPU
(``hardware.migplace.choose``, its default rule unless told otherwise, no reuse:
the epilog destroys each instance), and a slice with no legal placement there
is refused and the job requeued. ``Carrier`` is one per-job GPU kind (model,
profiles, weights, count, placement rule); ``Slices`` holds the instances of
each per-job GPU of a cluster; ``churn`` replays one-slice jobs that arrive and
leave on a pool of per-job GPUs and counts the jobs requeued for want of a
placement (what carrier weights trade against allocation: planner.migtune).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache

from ..hardware import get_model
from ..hardware.migplace import DEFAULT_RULE, Instance, choose

GpuKey = tuple  # a per-job GPU: (node index, GPU index) in the Slurm model, (node name, GPU index) in a churn replay


@dataclass(frozen=True)
class Carrier:
    """A per-job GPU kind: ``slices`` are (profile, carrier weight) in the policy's order, ``capacity`` the
    shard Count per GPU, ``rule`` the prolog's placement rule (hardware.migplace.RULES)."""

    model: str
    slices: tuple[tuple[str, int], ...]
    capacity: int
    rule: str = DEFAULT_RULE

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.slices)

    def weight(self, profile: str) -> int:
        """The shards a slice of ``profile`` takes; KeyError naming the allowed profiles for any other."""
        for name, w in self.slices:
            if name == profile:
                return w
        raise KeyError(f"{profile} is not a per-job profile of this {self.model} ({', '.join(self.profiles)})")

    def place(self, instances: tuple[Instance, ...], profile: str) -> int | None:
        """The start the prolog gives a new ``profile`` slice beside ``instances`` (sorted); None: nowhere."""
        return _start(self.model, profile, instances, self.profiles, self.rule)


@lru_cache(maxsize=100_000)
def _start(model: str, profile: str, instances: tuple[Instance, ...], allowed: tuple[str, ...], rule: str):
    got = choose(get_model(model), profile, list(instances), allowed=allowed, rule=rule)
    return None if got is None else got.start


@dataclass
class Slices:
    """The instances on each per-job GPU (by ``GpuKey``) and how many
    slices were refused for want of a legal placement."""

    on: dict[GpuKey, list[Instance]] = field(default_factory=dict)
    refused: int = 0

    def place(self, carrier: Carrier, gpu: GpuKey, profile: str) -> Instance | None:
        """Place a ``profile`` slice on ``gpu``; None (and counted) when it has no legal placement there."""
        held = self.on.setdefault(gpu, [])
        start = carrier.place(tuple(sorted(held)), profile)
        if start is None:
            self.refused += 1
            return None
        instance = (profile, start)
        held.append(instance)
        return instance

    def release(self, gpu: GpuKey, instance: Instance) -> None:
        """The epilog destroyed ``instance`` on ``gpu``."""
        self.on[gpu].remove(instance)


# ---- a per-job MIG pool under churn: arrivals, ends and requeues ---------------------------------------------------

FIRST_FIT, LEAST_LOADED = "first-fit", "LL_SHARED_GRES"  # Slurm's pick of a GPU inside the node
PICKS = (FIRST_FIT, LEAST_LOADED)


@dataclass(frozen=True)
class ChurnJob:
    """A one-slice job: it arrives at ``arrival`` (s), asks for one ``profile`` slice and runs ``duration`` s."""

    arrival: float
    duration: float
    profile: str


@dataclass(frozen=True)
class Churn:
    """One replay: jobs, jobs admitted at least once, jobs requeued at least once for want of a placement, and the
    allocation (compute slices of running instances over the pool's, time average until the last arrival)."""

    jobs: int
    admitted: int
    requeued: int
    allocation: float

    @property
    def requeue_share(self) -> float:
        """Jobs requeued at least once over jobs admitted at least once (0 when none was admitted)."""
        return self.requeued / self.admitted if self.admitted else 0.0


def churn(
    carrier: Carrier,
    jobs: list[ChurnJob],
    nodes: int,
    gpus: int,
    pick: str = FIRST_FIT,
    delay: float = 120.0,
) -> Churn:
    """Replay ``jobs`` (by arrival) on ``nodes`` x ``gpus`` per-job MIG GPUs of ``carrier``.

    At every arrival, end and requeue the waiting jobs are tried in arrival order (one that Slurm cannot admit
    is passed over, as backfill would). Slurm admits a job on a GPU with ``weight(profile)`` shards free: the
    node with the fewest free shards that has such a GPU (CPUs and memory are not modelled; Slurm's best fit on
    idle CPUs packs nodes much the same way), first among equals, and in it the GPU ``pick`` names (the lowest
    index, or the most free shards: LL_SHARED_GRES). The prolog places the slice there (``Carrier.place``, no
    reuse); a slice with no legal start is refused, its shards released, and the job requeued ``delay`` s later.
    """
    if pick not in PICKS:
        raise ValueError(f"{pick!r} is not a GPU pick; allowed: {', '.join(PICKS)}")
    return _ChurnRun(carrier, nodes, gpus, pick, delay).run(sorted(jobs, key=lambda j: j.arrival))


class _ChurnRun:
    def __init__(self, carrier: Carrier, nodes: int, gpus: int, pick: str, delay: float):
        self.carrier, self.pick, self.delay = carrier, pick, delay
        self.free = [[carrier.capacity] * gpus for _ in range(nodes)]
        self.slices = Slices()
        self.compute = {p: get_model(carrier.model).profile(p).compute_slices for p in carrier.profiles}
        self.events: list[tuple[float, int, int, int]] = []  # (time, 0 end / 1 arrival, job, where: node*gpus+gpu)
        self.held: dict[int, Instance] = {}
        self.ever: set[int] = set()
        self.requeued: set[int] = set()

    def run(self, jobs: list[ChurnJob]) -> Churn:
        if not jobs:
            return Churn(0, 0, 0, 0.0)
        for i, job in enumerate(jobs):
            heapq.heappush(self.events, (job.arrival, 1, i, -1))
        horizon, last, busy, area, queue = jobs[-1].arrival, 0.0, 0, 0.0, []
        while self.events:
            t, kind, i, where = heapq.heappop(self.events)
            area += busy * max(0.0, min(t, horizon) - last)
            last = max(last, min(t, horizon))
            if kind == 0:
                busy -= self._end(jobs[i], i, where)
            else:
                queue.append(i)
            busy += self._schedule(jobs, queue, t)
        total = horizon * sum(len(n) for n in self.free) * get_model(self.carrier.model).compute_slices
        return Churn(len(jobs), len(self.ever), len(self.requeued), area / total if total else 0.0)

    def _schedule(self, jobs: list[ChurnJob], queue: list[int], t: float) -> int:
        """Start what Slurm admits and the prolog places, requeue what it cannot; the compute slices started."""
        started, keep = 0, []
        for i in queue:
            job = jobs[i]
            need = self.carrier.weight(job.profile)
            where = self._gpu(need)
            if where is None:
                keep.append(i)
                continue
            self.ever.add(i)
            node, gpu = where
            instance = self.slices.place(self.carrier, where, job.profile)
            if instance is None:
                self.requeued.add(i)
                heapq.heappush(self.events, (t + self.delay, 1, i, -1))
                continue
            self.free[node][gpu] -= need
            self.held[i] = instance
            started += self.compute[job.profile]
            heapq.heappush(self.events, (t + job.duration, 0, i, node * len(self.free[0]) + gpu))
        queue[:] = keep
        return started

    def _gpu(self, need: int) -> tuple[int, int] | None:
        nodes = [n for n, free in enumerate(self.free) if max(free) >= need]
        if not nodes:
            return None
        node = min(nodes, key=lambda n: (sum(self.free[n]), n))
        free = self.free[node]
        room = [g for g, f in enumerate(free) if f >= need]
        return node, room[0] if self.pick == FIRST_FIT else max(room, key=lambda g: (free[g], -g))

    def _end(self, job: ChurnJob, i: int, where: int) -> int:
        node, gpu = divmod(where, len(self.free[0]))
        self.free[node][gpu] += self.carrier.weight(job.profile)
        self.slices.release((node, gpu), self.held.pop(i))
        return self.compute[job.profile]
