"""The demand model: what a site's jobs ask for, as a distribution of request classes. Pure.

A request class is one shape of job: GPU count, per-GPU share (milli: 1000 is
a whole GPU), whole CPUs, memory, QoS/tier class and the GPU (or MIG) type it
names. Three sources give the same model:

- an openb trace CSV (the FGD paper's format; ``read_openb`` keeps the pods so
  the simulator can replay them);
- job records of the site's own history, as ``slurm/sacct.py`` reads them
  (``sacct --json`` or ``--parsable2``, live or recorded);
- the pending queue, as ``squeue --json`` prints it.

Parsers take text or records, never commands: the CLI reads files and calls
``slurm/`` for live data.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import GpushareError
from ..sim.cluster import GPU_MILLI, Pod
from ..sim.trace import TraceError, parse_pods
from ..slurm.parsable import SlurmParseError, parse_tres

KINDS = ("cpu", "fraction", "whole", "multi")


class DemandError(GpushareError):
    """A demand source that cannot be read; the message names the source, the row and the field."""

    exit_code = 1


def spec_models(spec: str) -> list[str]:
    """The GPU models a trace pod's ``gpu_spec`` allows ('V100M16|V100M32'), as node feature names (lower case),
    each once; [] for none (an empty spec, or separators only: any model, as the paper's simulator reads it)."""
    return list(dict.fromkeys(t.lower() for t in spec.split("|") if t))


@dataclass(frozen=True, order=True)
class RequestClass:
    """One shape of request. ``gpu_milli`` is per GPU (0 without GPUs); ``cpus`` are whole CPUs as Slurm counts them."""

    num_gpu: int
    gpu_milli: int
    cpus: int
    memory_mib: int
    qos: str = ""
    gpu_spec: str = ""

    @property
    def kind(self) -> str:
        """'cpu' (no GPU), 'fraction' (part of one GPU), 'whole' (one GPU) or 'multi' (several whole GPUs)."""
        if self.num_gpu == 0:
            return "cpu"
        if self.gpu_milli < GPU_MILLI:
            return "fraction"
        return "whole" if self.num_gpu == 1 else "multi"

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def held_to(self, models: set[str]) -> bool:
        """Whether ``gpu_spec`` names GPU models and only models among ``models`` (lower-case names, as node
        features; an empty spec allows any model)."""
        allowed = spec_models(self.gpu_spec)
        return bool(allowed) and set(allowed) <= models


@dataclass(frozen=True)
class Demand:
    """Request classes and how many jobs asked for each, from one source."""

    source: str
    counts: Mapping[RequestClass, int] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return sum(self.counts.values())

    def by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for cls, n in self.counts.items():
            out[cls.kind] += n
        return out

    def gpu_milli_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for cls, n in self.counts.items():
            out[cls.kind] += n * cls.gpu_demand_milli
        return out

    def cpus_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for cls, n in self.counts.items():
            out[cls.kind] += n * cls.cpus
        return out

    def held_demand(self, models: set[str]) -> tuple[float, int]:
        """(GPUs, CPUs) asked by the GPU jobs whose ``gpu_spec`` allows only models among ``models`` (lower-case
        names, as node features): the demand that no other GPU can take."""
        gpus, cpus = 0.0, 0
        for cls, n in self.counts.items():
            if cls.num_gpu and cls.held_to(models):
                gpus += n * cls.gpu_demand_milli / GPU_MILLI
                cpus += n * cls.cpus
        return gpus, cpus

    def memory_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for cls, n in self.counts.items():
            out[cls.kind] += n * cls.memory_mib
        return out

    @property
    def gpu_milli(self) -> int:
        return sum(n * c.gpu_demand_milli for c, n in self.counts.items())

    def fractions(self) -> dict[int, int]:
        """{per-GPU share in milli: jobs} for the fractional requests, ascending."""
        out: Counter[int] = Counter()
        for cls, n in self.counts.items():
            if cls.kind == "fraction":
                out[cls.gpu_milli] += n
        return dict(sorted(out.items()))

    def gpu_counts(self) -> dict[int, int]:
        """{GPUs per job: jobs} for whole-GPU requests."""
        out: Counter[int] = Counter()
        for cls, n in self.counts.items():
            if cls.kind in ("whole", "multi"):
                out[cls.num_gpu] += n
        return dict(sorted(out.items()))

    def qos_by_kind(self) -> dict[tuple[str, str], int]:
        out: Counter[tuple[str, str]] = Counter()
        for cls, n in self.counts.items():
            out[cls.qos, cls.kind] += n
        return dict(sorted(out.items()))

    def cpus_per_gpu(self) -> float:
        """Whole CPUs asked per GPU asked, over the GPU jobs (0 without GPU jobs)."""
        gpu = sum(n * c.gpu_demand_milli for c, n in self.counts.items() if c.num_gpu)
        cpus = sum(n * c.cpus for c, n in self.counts.items() if c.num_gpu)
        return cpus * GPU_MILLI / gpu if gpu else 0.0

    def units_needed(self) -> int:
        """The fewest MPS units per GPU that give every fractional share exactly: lcm-free, a divisor of 100.

        A share of 470 milli needs 100 units (47 of them); shares that are all
        multiples of 250 milli need only 4. 100 when any share is finer.
        """
        for units in (2, 4, 5, 10, 20, 25, 50, 100):
            step = GPU_MILLI // units
            if all(m % step == 0 for m in self.fractions()):
                return units
        return 100


def cpus_of(cpu_milli: int) -> int:
    """Slurm allocates whole CPUs: a pod's millicores rounded up (a CPU-less pod still gets one)."""
    return max(1, math.ceil(cpu_milli / 1000))


def class_of(pod: Pod) -> RequestClass:
    milli = pod.gpu_milli if pod.num_gpu else 0
    return RequestClass(pod.num_gpu, milli, cpus_of(pod.cpu_milli), pod.memory_mib, pod.qos, pod.gpu_spec)


def from_pods(pods: Iterable[Pod], source: str) -> Demand:
    return Demand(source, dict(sorted(Counter(class_of(p) for p in pods).items())))


# ---- openb trace CSV ----


def read_openb(text: str, source: str = "trace") -> list[Pod]:
    """Pods of an openb pod list: ``trace.parse_pods`` (the one reader of the format), its errors as DemandError.

    Required columns: name, cpu_milli, memory_mib, num_gpu, gpu_milli; gpu_spec
    and qos are read when present, other columns ignored. gpu_milli is the share
    of each GPU (1-1000); a pod without GPUs asks no share (its gpu_milli must
    still be a number from 0 to 1000, and is ignored).
    """
    try:
        return list(parse_pods(text, source))
    except TraceError as exc:
        raise DemandError(str(exc)) from None


def from_openb(text: str, source: str = "trace") -> Demand:
    return from_pods(read_openb(text, source), f"openb:{source}")


# ---- the site's history (sacct) ----


@dataclass(frozen=True)
class Units:
    """How the site's GRES counts map to GPU shares: MPS units and shard replicas per GPU, MIG types' shares.

    ``type_milli``: {GPU type: milli of one GPU} for MIG instance types
    (e.g. 'a100_40g_1g.5gb': 142); whole-GPU types are not listed.
    """

    mps: int = 100
    shard: int = 1
    type_milli: Mapping[str, int] = field(default_factory=dict)


def request_of(tres: Mapping[str, float], qos: str, units: Units, where: str) -> RequestClass:
    """One job's request class from its TRES (sacct's ReqTRES or AllocTRES, or squeue's tres_per_node)."""
    cpus = max(1, int(tres.get("cpu", 1)))
    mem = int(tres.get("mem", 0))
    gpus = {k[len("gres/gpu:") :]: int(v) for k, v in tres.items() if k.startswith("gres/gpu:") and v}
    whole = int(tres.get("gres/gpu", 0)) or sum(gpus.values())
    mps, shard = int(tres.get("gres/mps", 0)), int(tres.get("gres/shard", 0))
    if mps:
        return RequestClass(1, _share(mps, units.mps, "gres/mps", where), cpus, mem, qos)
    if shard:
        return RequestClass(1, _share(shard, units.shard, "gres/shard", where), cpus, mem, qos)
    if not whole:
        return RequestClass(0, 0, cpus, mem, qos)
    gtype = next(iter(gpus)) if len(gpus) == 1 else ""
    if gtype in units.type_milli:
        return RequestClass(1, units.type_milli[gtype], cpus, mem, qos, gtype)
    return RequestClass(whole, GPU_MILLI, cpus, mem, qos, gtype)


def _share(count: int, per_gpu: int, name: str, where: str) -> int:
    if per_gpu < 1:
        raise DemandError(f"{where}: {name}={count} but the policy gives no {name} units per GPU")
    return min(GPU_MILLI, max(1, round(count * GPU_MILLI / per_gpu)))


def from_job_records(records: Iterable, units: Units = Units(), source: str = "sacct") -> Demand:
    """Request classes of finished/running jobs (``slurm.sacct.JobRecord``): ReqTRES when recorded, else AllocTRES.

    Job steps (ids with a '.') are skipped; sacct -X gives allocations only anyway.
    """
    counts: Counter[RequestClass] = Counter()
    for rec in records:
        if "." in rec.job_id:
            continue
        text = rec.req_tres or rec.alloc_tres
        if not text:
            continue
        try:
            tres = parse_tres(text)
        except (SlurmParseError, ValueError) as exc:
            raise DemandError(f"{source}: job {rec.job_id}: TRES {text!r} is not readable: {exc}") from None
        counts[request_of(tres, rec.qos, units, f"{source}: job {rec.job_id}")] += 1
    return Demand(f"sacct:{source}", dict(sorted(counts.items())))


# ---- the pending queue (squeue --json) ----

_MEM = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def from_squeue_json(text: str, units: Units = Units(), source: str = "squeue") -> Demand:
    """Request classes of the PENDING jobs in ``squeue --json`` output (data_parser 0.0.40-0.0.42).

    Read per job: ``tres_per_node``/``tres_per_job`` (e.g. 'gres/mps:47',
    'gres/gpu:a100:2'), ``cpus``, ``memory_per_node`` or ``memory_per_cpu``,
    ``qos`` and ``job_state``.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DemandError(f"{source}: not squeue --json output: {exc}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise DemandError(f"{source}: no 'jobs' list; expected the output of squeue --json")
    counts: Counter[RequestClass] = Counter()
    for job in jobs:
        state = job.get("job_state")
        state = state if isinstance(state, list) else [state]
        if "PENDING" not in state:
            continue
        where = f"{source}: job {job.get('job_id', '?')}"
        cpus = int(_num(job.get("cpus")) or 1)
        mem = _num(job.get("memory_per_node"))
        if not mem:
            mem = (_num(job.get("memory_per_cpu")) or 0) * cpus
        tres = {"cpu": cpus, "mem": mem or 0}
        for key in ("tres_per_node", "tres_per_job"):
            tres.update(_gres_tres(job.get(key) or "", where))
        counts[request_of(tres, str(job.get("qos") or ""), units, where)] += 1
    return Demand(f"squeue:{source}", dict(sorted(counts.items())))


def _num(value) -> float | None:
    """A data_parser number: plain, or {set, infinite, number}."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value if isinstance(value, (int, float)) else None


def _gres_tres(text: str, where: str) -> dict[str, float]:
    """squeue's tres_per_node/tres_per_job ('gres/gpu:a100:2', 'gres/mps:47') as TRES counts, by the submission
    grammar."""
    from ..submit.parse import BadRequest, Gres, parse_field

    out: dict[str, float] = {}
    if not text:
        return out
    try:
        entries = parse_field("tres_per_node", text)
    except BadRequest as exc:
        raise DemandError(f"{where}: GRES {text!r} is not readable: {exc}") from None
    for e in entries:
        if isinstance(e, Gres):
            key = f"gres/{e.name}:{e.type}" if e.type else f"gres/{e.name}"
            out[key] = out.get(key, 0) + e.count
    return out


def format_demand(d: Demand) -> list[str]:
    """The report's demand section: jobs and GPU demand by kind, QoS mix, fractional shares."""
    kinds, milli, cpus = d.by_kind(), d.gpu_milli_by_kind(), d.cpus_by_kind()
    lines = [f"demand: {d.jobs} jobs from {d.source}, {d.gpu_milli / GPU_MILLI:.1f} GPUs asked in all"]
    for k in KINDS:
        if kinds[k]:
            lines.append(f"  {k:<9} {kinds[k]:>7} jobs  {milli[k] / GPU_MILLI:>9.1f} GPUs  {cpus[k]:>8} CPUs")
    if d.fractions():
        top = sorted(d.fractions().items(), key=lambda kv: -kv[1])[:8]
        lines.append("  fractional shares (milli: jobs): " + ", ".join(f"{m}: {n}" for m, n in top))
    gc = d.gpu_counts()
    if gc:
        lines.append("  whole-GPU jobs by GPU count: " + ", ".join(f"{g}: {n}" for g, n in gc.items()))
    qos = d.qos_by_kind()
    if any(q for q, _ in qos):
        lines.append("  by QoS: " + ", ".join(f"{q or '-'}/{k}: {n}" for (q, k), n in qos.items()))
    if d.cpus_per_gpu():
        lines.append(f"  CPUs per GPU asked (GPU jobs): {d.cpus_per_gpu():.1f}")
    return lines


def pack_estimate(fractions: dict[int, int], seed: int = 1) -> int:
    """GPUs the shares fill when packed first-fit in a random order (as they arrive): an estimate, not a bound.
    Pure, so kept per input (the planner asks it the same question for every candidate it builds)."""
    return _pack_estimate(tuple(fractions.items()), seed)  # in the given order: the shuffle starts from it


@functools.lru_cache(maxsize=64)
def _pack_estimate(fractions: tuple[tuple[int, int], ...], seed: int) -> int:
    items = [m for m, n in fractions for _ in range(n)]
    random.Random(seed).shuffle(items)
    try:
        import numpy as np  # optional ([sim]): the same first fit, the bin search vectorised
    except ImportError:
        return _first_fit(items)
    free = np.zeros(len(items) + 1, dtype=np.int64)  # every bin that can open, unopened ones past ``used``
    used = 0
    for m in items:
        j = int(np.argmax(free[:used] >= m)) if used else 0
        if used and free[j] >= m:
            free[j] -= m
        else:
            free[used] = GPU_MILLI - m
            used += 1
    return used


def _first_fit(items: list[int]) -> int:
    free: list[int] = []
    for m in items:
        for j, f in enumerate(free):
            if f >= m:
                free[j] -= m
                break
        else:
            free.append(GPU_MILLI - m)
    return len(free)
