"""GPU-equivalent usage: what each job held, in whole-GPU units, over a time window. Pure.

A job's allocated GPU TRES become GPU-equivalents with the same unit
fractions the billing weights use (``policy.billing.tier_fractions`` of the
job's partition): a 1g.5gb slice of an A100-40GB is 1/7 GPU, a shard
1/replicas, an MPS unit 1/units. A per-job MIG slice of profile p is
allocated as weight(p) carrier shards per node (``gres/shard``): on a
per-job tier that count is the slice it carries, counted as the fixed slice
of p is (``policy.billing.carried_slices``), so a per-job 1g.5gb is 1/7 GPU
like a fixed one, whatever a carrier shard bills. A typed request shows up twice in AllocTRES
(``gres/gpu:<type>=1`` and ``gres/gpu=1``): the typed one counts, and only
the untyped remainder falls back to a whole GPU (or to the partition's one
GPU type, when it has exactly one).

Usage can be decayed to the window's end the way Slurm decays raw usage:
with D = 1 - 0.693/half_life per second, a second of use t seconds ago
counts D^t. Aggregation is streaming: one record at a time, one Totals per
group, and a cache keyed by (partition, AllocTRES) so the thousands of
identical job shapes of a real cluster are converted once.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from ..policy import Site
from ..policy.billing import carried_slices, tier_fractions
from ..policy.share import Mode
from ..slurm.parsable import parse_tres
from ..slurm.sacct import JobRecord
from .timeline import Timeline

DIMENSIONS = ("account", "user", "assoc", "partition", "gpu-kind")
NO_GPU = "(none)"


@dataclass(frozen=True)
class AllocationGpus:
    """What one allocation holds at any moment: GPU-equivalents in all and by kind, and billing units."""

    gpus: float
    kinds: tuple[tuple[str, float], ...]
    billing: float
    unknown: tuple[str, ...] = ()


class GpuConverter:
    """AllocTRES of a job in a partition -> AllocationGpus, with the policy's unit fractions."""

    def __init__(self, site: Site, cache_size: int = 1 << 16):
        self._tiers = {t.name: tier_fractions(t.groups) for t in site.tiers}
        self._slices = {t.name: s for t in site.tiers if (s := carried_slices(t.groups))}
        self._anywhere: dict[str, float] = {}
        for fractions in self._tiers.values():
            for k, v in fractions.items():
                self._anywhere.setdefault(k, v)
        self._cache: dict[tuple[str, str], AllocationGpus] = {}
        self._cache_size = cache_size

    def convert(self, partition: str, alloc_tres: str) -> AllocationGpus:
        key = (partition, alloc_tres)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            hit = self._cache[key] = self.convert_tres(partition, parse_tres(alloc_tres))
        return hit

    def fractions(self, partition: str) -> Mapping[str, float]:
        return self._tiers.get(partition, self._anywhere)

    def convert_tres(self, partition: str, tres: Mapping[str, float]) -> AllocationGpus:
        fr = self.fractions(partition)
        kinds: defaultdict[str, float] = defaultdict(int)  # as a Counter, but of GPU-equivalents
        unknown: list[str] = []
        typed = 0.0
        for name, count in tres.items():
            if name.startswith("gres/gpu:"):
                f = fr.get(name, self._anywhere.get(name))
                if f is None:
                    unknown.append(name)
                    f = 1.0
                kinds[name[5:]] += count * f
                typed += count
        untyped = tres.get("gres/gpu", 0) - typed
        if untyped > 0:
            kind, f = self._untyped(fr)
            kinds[kind] += untyped * f
        for shared in (Mode.SHARD.value, Mode.MPS.value):
            count = _shared_count(tres, shared)
            if count and not (shared == Mode.SHARD.value and self._carried(partition, count, tres, kinds)):
                f = fr.get(f"gres/{shared}", self._anywhere.get(f"gres/{shared}"))
                if f is None:
                    unknown.append(f"gres/{shared}")
                else:
                    kinds[shared] += count * f
        gpus = sum(kinds.values())
        return AllocationGpus(gpus, tuple(sorted(kinds.items())), float(tres.get("billing", 0)), tuple(unknown))

    def _carried(self, partition: str, count: float, tres: Mapping[str, float], kinds: defaultdict[str, float]) -> bool:
        """Shards on a per-job MIG tier that carry one slice per node: counted in ``kinds`` as that slice."""
        slices = self._slices.get(partition)
        nodes = tres.get("node") or 1
        per_node = count / nodes
        hit = slices.get(int(per_node)) if slices and per_node.is_integer() else None
        if hit is None:
            return False
        kinds[hit[0]] += nodes * hit[1]
        return True

    @staticmethod
    def _untyped(fr: Mapping[str, float]) -> tuple[str, float]:
        """An untyped GPU is a whole GPU, unless the partition has a single GPU type."""
        types = [(k[5:], v) for k, v in fr.items() if k.startswith("gres/gpu:")]
        return types[0] if len(types) == 1 else ("gpu", 1.0)


def _shared_count(tres: Mapping[str, float], name: str) -> float:
    """Shards/MPS units, counted once even when a typed request adds ``gres/shard:<type>`` too."""
    plain = tres.get(f"gres/{name}")
    if plain is not None:
        return plain
    return sum(v for k, v in tres.items() if k.startswith(f"gres/{name}:"))


def decay_factor(half_life: float) -> float:
    """Slurm's per-second decay D = 1 - 0.693/half_life (priority_multifactor.c); 1 without decay."""
    return 1.0 - 0.693 / half_life if half_life and half_life > 0 else 1.0


def decayed_seconds(a: float, b: float, at: float, half_life: float | None, calc_period: float | None = None) -> float:
    """Seconds of use in [a, b], each weighted D^(at - t): usage as of time ``at``.

    Without ``calc_period``: the integral, Slurm's limit for short
    PriorityCalcPeriod. With it: Slurm's accrual, period by period (on
    boundaries at multiples of calc_period): a period's new usage is its
    length times D^length, then decays with everything else, so each piece
    counts D^(at - piece start). slurmctld's periods start when its decay
    thread does, and a job's last piece is charged at its end, so real
    usage differs from either by up to one period's decay.
    """
    return _decayed(a, b, at, decay_rate(half_life or 0), calc_period)


def decay_rate(half_life: float) -> float:
    """k = -ln D, so that D^t = e^(-k t); 0 means no decay."""
    d = decay_factor(half_life)
    return -math.log(d) if d < 1.0 else 0.0


def _decayed(a: float, b: float, at: float, k: float, calc_period: float | None) -> float:
    if b <= a:
        return 0.0
    if not k:
        return b - a
    if not calc_period:
        return (math.exp(-k * (at - b)) - math.exp(-k * (at - a))) / k
    return _periods(a, b, at, k, calc_period)


def _periods(a: float, b: float, at: float, k: float, p: float) -> float:
    first_end = min(b, (math.floor(a / p) + 1) * p)
    total = (first_end - a) * math.exp(-k * (at - a))
    full = int((b - first_end) // p)
    if full:
        r = math.exp(k * p)  # each later period is less decayed by e^(kp)
        total += p * math.exp(-k * (at - first_end)) * (r**full - 1) / (r - 1)
    last = first_end + full * p
    if b > last:
        total += (b - last) * math.exp(-k * (at - last))
    return total


@dataclass(slots=True)
class Totals:
    """Sums for one group. ``fs_seconds`` is usage as Fair Tree would count it in GPU-equivalents:
    decayed to the window end and multiplied by the job QOS's UsageFactor."""

    jobs: int = 0
    gpu_seconds: float = 0.0
    billing_seconds: float = 0.0
    fs_seconds: float = 0.0

    def add(self, gpu: float, billing: float, fs: float) -> None:
        self.jobs += 1
        self.gpu_seconds += gpu
        self.billing_seconds += billing
        self.fs_seconds += fs


_KEYS: dict[str, Callable[[JobRecord], Hashable]] = {
    "account": attrgetter("account"),
    "user": attrgetter("user"),
    "assoc": attrgetter("account", "user"),
    "partition": attrgetter("partition"),
}


@dataclass
class UsageAggregator:
    """Streams job records into per-group Totals over [since, until), jobs clipped to the window."""

    converter: GpuConverter
    since: float
    until: float
    by: str = "account"
    half_life: float | None = None
    calc_period: float | None = None
    qos_factors: Mapping[str, float] = field(default_factory=dict)
    groups: dict = field(default_factory=dict)
    total: Totals = field(default_factory=Totals)
    outside: int = 0
    unknown_tres: Counter = field(default_factory=Counter)
    # When given, each group's GPU-seconds are also spread over its time buckets (same intervals, same figures).
    timeline: Timeline | None = None

    def __post_init__(self):
        if self.by not in DIMENSIONS:
            raise ValueError(f"cannot group by {self.by!r}; one of {', '.join(DIMENSIONS)}")
        self._key = _KEYS.get(self.by)
        self._k = decay_rate(self.half_life) if self.half_life is not None else 0.0
        if self.until <= self.since:
            raise ValueError("the window is empty: until must be after since")

    def feed(self, records: Iterable[JobRecord]) -> UsageAggregator:
        add = self.add
        for rec in records:
            add(rec)
        return self

    def add(self, rec: JobRecord) -> None:
        window = self._clip(rec.start, rec.end)
        if window is None:
            self.outside += 1
            return
        a, b = window
        job = self.converter.convert(rec.partition, rec.alloc_tres)
        if job.unknown:
            self.unknown_tres.update(job.unknown)
        seconds = b - a
        weight = self._weight(a, b, rec.qos)
        self.total.add(job.gpus * seconds, job.billing * seconds, job.gpus * weight)
        if self.by == "gpu-kind":
            self._by_kind(job, seconds, weight, a, b)
            return
        key = self._key(rec)
        totals = self.groups.get(key)
        if totals is None:
            totals = self.groups[key] = Totals()
        totals.add(job.gpus * seconds, job.billing * seconds, job.gpus * weight)
        if self.timeline is not None:
            self.timeline.add(key, a, b, job.gpus)

    def _clip(self, start: float | None, end: float | None) -> tuple[float, float] | None:
        """The part of [start, end] inside the window; a job still running runs to the window's end."""
        if start is None:
            return None
        a = start if start > self.since else self.since
        b = self.until if end is None or end > self.until else end
        return (a, b) if b > a else None

    def _weight(self, a: float, b: float, qos: str) -> float:
        """Seconds as Fair Tree counts them: decayed to the window end, times the QOS UsageFactor."""
        w = _decayed(a, b, self.until, self._k, self.calc_period) if self._k else b - a
        return w * self.qos_factors.get(qos, 1.0) if self.qos_factors else w

    def _by_kind(self, job: AllocationGpus, seconds: float, weight: float, a: float, b: float) -> None:
        """Each kind a job used gets its part; billing is shared in proportion to GPU-equivalents."""
        kinds = job.kinds or ((NO_GPU, 0.0),)
        for kind, gpus in kinds:
            share = gpus / job.gpus if job.gpus else 1.0
            totals = self.groups.get(kind)
            if totals is None:
                totals = self.groups[kind] = Totals()
            totals.add(gpus * seconds, job.billing * seconds * share, gpus * weight)
            if self.timeline is not None:
                self.timeline.add(kind, a, b, gpus)


def aggregate(site: Site, records: Iterable[JobRecord], since: float, until: float, **kw) -> UsageAggregator:
    """One pass over ``records``; the QOS usage factors are the policy's tiers' (QOS named after tiers)."""
    kw.setdefault("qos_factors", {t.name: t.spec.usage_factor for t in site.tiers})
    return UsageAggregator(GpuConverter(site), since, until, **kw).feed(records)
