"""What the planner reads off the demand model and the site before it builds a candidate. Pure.

The node groups as the planner sees them (``supply``), the shares split between MIG slices and MPS, the
demand scaled to the site, the CPU-rich and CPU-poor groups with their CPU bounds, the MPS units that express
every share, the MIG slices the shares round up to, and the CPUs each pool's GPU jobs leave.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..hardware import GpuModel
from ..hardware.packing import GPU_MILLI, covering
from ..policy import Site
from .demand import Demand

CPU_RICH = 2.0  # a node is CPU-rich when it has this many times the CPUs per GPU that GPU jobs ask for
HEADROOM = 1.03  # pools are sized for the demand plus this much, for the spread of arrivals
MIG_CPUS = 1.5  # MIG nodes: at least this many times the CPUs per GPU their slices' jobs ask, if there are enough


@dataclass(frozen=True)
class GroupInfo:
    """A node group of the base policy as the planner sizes pools on it (``index``: its place in the site)."""

    index: int
    name: str
    nodes: tuple[str, ...]
    gpus: int  # per node
    cpus: int
    memory_mb: int
    model: str
    mig: bool

    @property
    def cpus_per_gpu(self) -> float:
        return self.cpus / self.gpus


def supply(site: Site) -> list[GroupInfo]:
    """The site's node groups, in order."""
    return [
        GroupInfo(i, g.name, g.nodes, len(g.gpus), g.spec.cpus, g.spec.memory_mb, g.model.name, g.model.mig_capable)
        for i, g in enumerate(site.groups)
    ]


def split_shares(demand: Demand, isolate: Sequence[str], mig_all: bool) -> tuple[dict[int, int], dict[int, int]]:
    """Fractional shares: ({milli: jobs} that must get MIG slices, {milli: jobs} that share through MPS)."""
    iso = {q.lower() for q in isolate}
    mig: Counter = Counter()
    mps: Counter = Counter()
    for cls, n in demand.counts.items():
        if cls.kind != "fraction":
            continue
        (mig if mig_all or cls.qos.lower() in iso else mps)[cls.gpu_milli] += n
    return dict(mig), dict(mps)


def demand_scale(demand: Demand, groups: list[GroupInfo]) -> float:
    """Demand counts are scaled to the cluster: the trace's jobs as if they had arrived at 100 % of its GPUs."""
    gpus = sum(g.gpus * len(g.nodes) for g in groups)
    return gpus * GPU_MILLI / demand.gpu_milli if demand.gpu_milli else 1.0


def mps_units(fractions: dict[int, int]) -> int:
    """The fewest mps units per GPU that give every share (in thousandths of a GPU) exactly; 100 when none does."""
    for units in (2, 4, 5, 10, 20, 25, 50, 100):
        if all(m % (GPU_MILLI // units) == 0 for m in fractions):
            return units
    return 100


def scaled_counts(counts: dict[int, int], factor: float) -> dict[int, int]:
    """{share: jobs} times ``factor`` in whole jobs that keep the total (largest remainder; ties: larger share).

    Rounding each class up on its own would inflate a small site's demand: six share sizes of one or two
    jobs each, scaled by 0.24, would count as six jobs instead of two or three.
    """
    exact = {m: n * factor for m, n in counts.items()}
    total = sum(exact.values())
    if factor >= 1 or total == 0:
        return {m: math.ceil(x - 1e-9) for m, x in exact.items()}
    out = {m: math.floor(x) for m, x in exact.items()}
    left = max(1, round(total)) - sum(out.values())
    for m in sorted(exact, key=lambda m: (-(exact[m] - out[m]), -m))[: max(0, left)]:
        out[m] += 1
    return {m: n for m, n in out.items() if n}


def cpu_rich(groups: list[GroupInfo], demand: Demand, taken: dict[int, int]) -> set[int]:
    """Groups with at least CPU_RICH x the CPUs per GPU that GPU jobs ask, when they are a minority of the GPUs
    left (when most GPUs are CPU-rich, none is: the pool would be the cluster)."""
    per_gpu = demand.cpus_per_gpu()
    if not per_gpu:
        return set()
    left = {g.index: (len(g.nodes) - taken.get(g.index, 0)) * g.gpus for g in groups}
    rich = {g.index for g in groups if left[g.index] and g.cpus_per_gpu >= CPU_RICH * per_gpu}
    return rich if 2 * sum(left[i] for i in rich) < sum(left.values()) else set()


def heavy_threshold(demand: Demand, groups: list[GroupInfo], rich: set[int]) -> int:
    """CPUs above which a single-GPU job belongs on CPU-rich nodes: the CPU-rich pool's spare CPUs, after its own
    GPUs' share and the CPU-only jobs, taken by the single-GPU jobs asking the most CPUs.

    GPUs and CPUs that jobs held to the CPU-rich nodes' models (``gpu_spec`` / --constraint naming only those)
    ask are not spare: no other node can run those jobs. On the paper's gpuspec25 (906 jobs held to T4, the
    CPU-rich model) the threshold without them sent so many CPU-heavy jobs to the T4 nodes that the held jobs
    found no T4 GPU."""
    rich_gpus = sum(g.gpus * len(g.nodes) for g in groups if g.index in rich)
    rich_cpus = sum(g.cpus * len(g.nodes) for g in groups if g.index in rich)
    cpu_jobs = demand.cpus_by_kind()["cpu"]
    models = {g.model.lower() for g in groups if g.index in rich}
    held_gpus, held_cpus = demand.held_demand(models)
    spare_gpus = rich_gpus - held_gpus
    spare_cpus = rich_cpus - cpu_jobs - held_cpus
    ones = sorted(
        ((c.cpus, n) for c, n in demand.counts.items() if c.kind == "whole" and not c.held_to(models)), reverse=True
    )
    threshold = max((c for c, _ in ones), default=1)
    for cpus, n in ones:
        if n > spare_gpus or n * cpus > spare_cpus:
            break
        spare_gpus -= n
        spare_cpus -= n * cpus
        threshold = cpus - 1
    return max(1, threshold)


def bulk_cpus_per_gpu(groups: list[GroupInfo]) -> float:
    """CPUs per GPU of the node shape (GPUs and CPUs per node) that holds the most GPUs; the first among equals."""
    gpus: Counter = Counter()
    for g in groups:
        gpus[(g.gpus, g.cpus)] += g.gpus * len(g.nodes)
    (per_node, cpus), _n = max(gpus.items(), key=lambda kv: kv[1])
    return cpus / per_node


def lean_groups(
    groups: list[GroupInfo], demand: Demand, rich: set[int], *taken: dict[int, int]
) -> tuple[set[int], int]:
    """(CPU-poor groups with nodes left for pool 'lean', the most CPUs a job may ask to be sent there first).

    A group is CPU-poor with fewer CPUs per GPU than GPU jobs ask on average, and the pool is made only when
    such GPUs are a minority of the GPUs left outside the CPU-rich pool; the CPU bound is the whole CPUs
    per GPU of the CPU-poor GPUs' majority (weighted by GPUs), so a job sent there first leaves no GPU of a
    typical CPU-poor node without CPUs.
    """
    per_gpu = demand.cpus_per_gpu()
    left = {g.index: len(g.nodes) - sum(t.get(g.index, 0) for t in taken) for g in groups}
    lean = {g.index for g in groups if left[g.index] > 0 and g.index not in rich and g.cpus_per_gpu < per_gpu}
    gpus = {g.index: left[g.index] * g.gpus for g in groups if g.index not in rich}
    if not lean or 2 * sum(gpus[i] for i in lean) >= sum(gpus.values()):
        return set(), 0  # a pool for the few CPU-poor nodes only: when most are, it would be the whole-GPU pool
    by_cpus: Counter = Counter()
    for g in groups:
        if g.index in lean:
            by_cpus[int(g.cpus_per_gpu)] += left[g.index] * g.gpus
    light = max(by_cpus, key=lambda c: (by_cpus[c], -c))
    return lean, max(1, light)


def spare_cpus(
    cpus: dict[str, int],
    demand: Demand,
    scale: float,
    mig_frac: dict[int, int],
    heavy: int,
    rich: bool,
    how: str = "rich",
    gpus: dict[str, int] | None = None,
) -> list[tuple[str, float]]:
    """Tiers by the CPUs their GPU jobs leave idle (most first, only those with some left).

    With ``gpus`` (GPUs per tier), a tier's GPU jobs use its CPUs only as far as its GPUs hold them: the CPUs
    of the jobs that do not fit are counted on the whole-GPU pool 'gpu', where they spill.
    """
    used: dict[str, float] = {}  # CPUs per tier
    asked: dict[str, float] = {}  # GPUs asked per tier
    for cls, n in demand.counts.items():
        if cls.kind == "cpu":
            continue
        if cls.kind == "fraction":
            tier = "mig" if cls.gpu_milli in mig_frac and "mig" in cpus else "frac"
        elif rich and cls.kind == "whole" and cls.cpus > heavy:
            tier = "cpu"
        else:
            tier = "gpu"
        tier = tier if tier in cpus else "gpu"
        used[tier] = used.get(tier, 0) + cls.cpus * n * scale
        asked[tier] = asked.get(tier, 0) + cls.gpu_demand_milli * n * scale / GPU_MILLI
    if gpus:
        for tier in list(used):
            if tier != "gpu" and "gpu" in cpus and asked[tier] > gpus.get(tier, 0):
                held = used[tier] * gpus.get(tier, 0) / asked[tier]
                used["gpu"] = used.get("gpu", 0) + (used[tier] - held)
                used[tier] = held
    spare = [(t, c - used.get(t, 0)) for t, c in cpus.items() if c - used.get(t, 0) > 0]
    # the CPU-rich pool first; shared pools last: Slurm fills the busiest node first, so CPU-only jobs would take the
    # CPUs a pool's slices and shares still need, and strand them
    if how == "spare":
        return sorted(spare, key=lambda x: -x[1])
    if how == "first":
        return sorted(spare, key=lambda x: (x[0] != "cpu", -x[1]))
    return sorted(spare, key=lambda x: (x[0] != "cpu", x[0] in ("mig", "frac"), -x[1]))


def slices_needed(
    model: GpuModel, fractions: dict[int, int], whole_slice: bool = True, allowed: tuple[str, ...] = ()
) -> tuple[Counter, int]:
    """(slices per profile, jobs left to whole GPUs) for {milli: jobs}.

    ``whole_slice``: a share only the whole-GPU profile covers gets that slice
    (isolation); otherwise it is left to a whole GPU (and counted apart).
    """
    need: Counter = Counter()
    whole = 0
    for milli, n in fractions.items():
        name = covering(model, milli, allowed)
        if name is None or (not whole_slice and model.profile(name).compute_slices == model.compute_slices):
            whole += n
        else:
            need[name] += n
    return need, whole
