"""New workloads of the FGD paper's family, drawn from the production trace by the paper's own sampling rules.

    python bench/workloads.py --seed S [--count 10] [--out DIR]     # a family of generated workloads
    python bench/workloads.py --seed S --mix sharing=0.6,multi=0.3   # one workload of a given mix
    python bench/workloads.py --stats FILE...                        # the same figures for existing pod lists

The planner is evaluated on the paper's 17 published pod lists (sim/paper/workloads.py
WORKLOADS); this module makes more of the same kind, from the production
trace (openb_pod_list_default.csv: 8,152 pods, 1,088 CPU-only, 3,078
fractional one-GPU "sharing" pods, 3,911 whole one-GPU pods, 75 multi-GPU
pods), so that the planner can be scored on workloads nobody tuned it on.

The rules, each as the published variants do it (measured from the files in
tests/data/gpu-trace; "GPU demand" is the sum of num_gpu x gpu_milli, the
paper's metric; a "sharing" pod asks one GPU with gpu_milli < 1000):

- ``sharing`` (gpushare40/60/80/100): the pod count and the CPU-only pods are
  kept; every GPU pod is replaced by a draw (with replacement) from the
  trace's sharing pods or from its non-sharing GPU pods (whole one-GPU and
  multi-GPU together), as many GPU pods as before, so that sharing pods make
  the given share of the GPU demand. Published: 0.401, 0.600, 0.800, 1.000
  of GPU demand, 8,152 pods, 1,088 CPU-only, 7,064 GPU pods in each.
- ``multi`` (multigpu20/30/40/50): every pod kept; multi-GPU pods drawn from
  the trace's 75 and appended (new names) until multi-GPU pods make the given
  share of GPU demand. Published: 0.204, 0.302, 0.402, 0.503 (the sharing
  share falls with it, 0.285 to 0.244 ... 0.152). Beyond the paper: where the
  pods already hold more than the target (after a ``sharing`` draw), random
  multi-GPU pods are removed instead.
- ``cpu`` (cpu050/100/200/250): GPU pods kept; every CPU-only pod replaced by
  draws (with replacement) from the trace's 1,088 CPU-only pods up to a new
  total CPU demand. The parameter here is the CPU-only pods' CPUs as a share
  of the cluster's CPUs (107,018 in openb_node_list_gpu_node.csv). Published:
  default 0.179, cpu050 0.061, cpu100 0.131, cpu200 0.290, cpu250 0.385.
- ``typed`` (gpuspec10/20/25/33): the same pods; a random subset of the GPU
  pods (sharing, whole and multi alike) gets a GPU-type constraint
  (``gpu_spec``: 'T4', 'G2', 'V100M16|V100M32', ...) until constrained pods
  make the given share of GPU demand. Published: 0.109, 0.204, 0.259, 0.348.
  The strings and their frequencies are the trace's own, taken from the pods
  with a gpu_spec in the published gpuspec33 list, per kind of pod (its
  sharing pods are constrained to T4, P100 or a five-type list only; its
  multi-GPU pods mostly to G2, G3 and V100s), so a drawn constraint is one the
  trace puts on that kind of pod.

The rules apply in that order (sharing, multi, cpu, typed); a parameter left
None keeps the trace as it is. Where ``sharing`` and ``multi`` are both set,
both are shares of the final GPU demand: the sharing draw then aims at a
sharing share of S / (1 - M) of the demand outside multi-GPU pods, which the
multi step leaves unchanged, so the result has S and M together. Each draw's
count comes from the pool's mean (the expected count for the target), then
single pods are added, removed or swapped until the measured share is within
TOLERANCE (0.5 point; each step aims at 0.2 point, and stops at the closer
side where one pod crosses the target). With ``typed`` set every other
constraint is cleared first; with it None each pod keeps its source's
gpu_spec (the default trace has none). Kept pods keep their names and qos;
every drawn pod is a new Pod named gen-pod-00000, gen-pod-00001, ... (in
draw order, skipping names in use) with its source pod's resources and qos.

``family(seed)`` draws mixes: each sets 1 to 4 of the parameters (every
third one two or more, since the planner was weakest where sharing and
multi-GPU demand mix), sharing 0.2-1.0, multi 0.05-0.5 (sharing + multi at
most 1), typed 0.05-0.4, cpu 0.03-0.45; mix i depends on the seed and i
only, and is generated with seed * 1000 + i. bench/placement.py --family
--generated SEED runs the family table on them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_gpushare.sim.cluster import GPU_MILLI, Pod  # noqa: E402
from slurm_gpushare.sim.paper.workloads import TRACE_DIR, workload_path  # noqa: E402
from slurm_gpushare.sim.trace import load_cluster, load_pods  # noqa: E402

TOLERANCE = 0.005  # the largest miss of a target share in the result (0.5 point)
STEP_TOLERANCE = 0.002  # what each step aims at
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos")
# accepted range of each Mix field: (low, high, low open, high open)
RANGES = {
    "sharing": (0.0, 1.0, True, False),
    "multi": (0.0, 1.0, False, True),
    "typed": (0.0, 1.0, False, False),
    "cpu": (0.0, 2.0, False, False),
}
# family(): the range each parameter is drawn from
FAMILY_RANGES = {"sharing": (0.2, 1.0), "multi": (0.05, 0.5), "typed": (0.05, 0.4), "cpu": (0.03, 0.45)}
MAX_COUNT = 1000  # workloads in one family: workload i of seed S is drawn with seed S * MAX_COUNT + i


def _accepted(field: str) -> str:
    low, high, low_open, high_open = RANGES[field]
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


@dataclass(frozen=True)
class Mix:
    """A generated workload's parameters; None keeps the trace as it is.

    sharing: share of GPU demand from sharing pods; multi: from multi-GPU pods; typed: from pods with a
    gpu_spec; cpu: CPU-only pods' CPUs over the cluster's CPUs.
    """

    sharing: float | None = None
    multi: float | None = None
    typed: float | None = None
    cpu: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"Mix.{f.name}: {value!r} is not a number; accepted: a share in {_accepted(f.name)}")
            low, high, low_open, high_open = RANGES[f.name]
            if value < low or value > high or (low_open and value == low) or (high_open and value == high):
                raise ValueError(f"Mix.{f.name}: {value:g} is out of range; accepted: {_accepted(f.name)}")
        if self.sharing is not None and self.multi is not None and self.sharing + self.multi > 1 + 1e-9:
            raise ValueError(
                f"Mix.sharing + Mix.multi: {self.sharing:g} + {self.multi:g} > 1; accepted: "
                "together at most 1 (both are shares of the same GPU demand)"
            )

    @classmethod
    def parse(cls, text: str) -> Mix:
        """'sharing=0.6,multi=0.3' (fields not named stay None); an unknown field raises ValueError."""
        values: dict[str, float] = {}
        names = [f.name for f in fields(cls)]
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, raw = part.partition("=")
            key = key.strip()
            if key not in names:
                raise ValueError(f"mix {text!r}: unknown field {key!r}; accepted: {', '.join(names)} (name=share)")
            try:
                values[key] = float(raw) if sep else float("nan")
            except ValueError:
                raise ValueError(
                    f"mix {text!r}: Mix.{key}: {raw.strip()!r} is not a number; accepted: a share in {_accepted(key)}"
                ) from None
        return cls(**values)

    def text(self) -> str:
        """'sharing 0.63, multi 0.31' (the fields set), or 'as the trace'."""
        parts = [f"{f.name} {getattr(self, f.name):.2f}" for f in fields(self) if getattr(self, f.name) is not None]
        return ", ".join(parts) or "as the trace"

    def rules(self) -> int:
        return sum(getattr(self, f.name) is not None for f in fields(self))


# ---- the trace (read once) ----


@cache
def trace_pods() -> tuple[Pod, ...]:
    return load_pods(TRACE_DIR / "openb_pod_list_default.csv")


@cache
def typed_pods() -> tuple[Pod, ...]:
    """The published gpuspec33 list's pods with a gpu_spec: where the constraint strings and frequencies come from."""
    return tuple(p for p in load_pods(workload_path("gpuspec33")) if p.gpu_spec)


@cache
def trace_cluster_cpus() -> int:
    cluster = load_cluster(TRACE_DIR / "openb_node_list_gpu_node.csv")
    return sum(n.cpu_milli for n in cluster.nodes) // 1000


def is_sharing(p: Pod) -> bool:
    return p.num_gpu == 1 and p.gpu_milli < GPU_MILLI


def kind(p: Pod) -> str:
    """'cpu', 'sharing', 'whole' (one whole GPU) or 'multi'."""
    if not p.num_gpu:
        return "cpu"
    if is_sharing(p):
        return "sharing"
    return "whole" if p.num_gpu == 1 else "multi"


def stats(pods: Sequence[Pod], cluster_cpus: int | None = None) -> dict:
    """pods, CPU-only pods, GPU pods by kind; sharing, multi and typed shares of the GPU demand; the CPU-only pods'
    CPUs and their share of the cluster's CPUs (the trace cluster's unless given); the GPU demand in GPUs."""
    total = cpus = 0
    by = Counter()
    demand = Counter()
    typed = 0
    for p in pods:
        k = kind(p)
        by[k] += 1
        d = p.gpu_demand_milli
        demand[k] += d
        total += d
        if k == "cpu":
            cpus += p.cpu_milli
        elif p.gpu_spec:
            typed += d
    cluster = cluster_cpus or trace_cluster_cpus()
    share = (lambda x: x / total) if total else (lambda x: 0.0)
    return {
        "pods": len(pods),
        "cpu_only": by["cpu"],
        "sharing_pods": by["sharing"],
        "whole_pods": by["whole"],
        "multi_pods": by["multi"],
        "sharing": share(demand["sharing"]),
        "multi": share(demand["multi"]),
        "typed": share(typed),
        "cpu_only_cpus": cpus / 1000,
        "cpu": cpus / 1000 / cluster,
        "gpu_demand": total / GPU_MILLI,
    }


def stats_text(s: dict) -> str:
    return (
        f"pods {s['pods']:5d} (CPU-only {s['cpu_only']:4d}, sharing {s['sharing_pods']:4d}, whole "
        f"{s['whole_pods']:4d}, multi {s['multi_pods']:4d}) | GPU demand {s['gpu_demand']:6.0f}: sharing "
        f"{s['sharing']:.3f} multi {s['multi']:.3f} typed {s['typed']:.3f} | CPU-only CPUs "
        f"{s['cpu_only_cpus']:6.0f} = {s['cpu']:.3f} of the cluster"
    )


# ---- the generator ----


class _Work:
    """The pod list being built: slots (None: removed), running sums, new names."""

    def __init__(self, pods: Sequence[Pod], rng: np.random.Generator) -> None:
        self.pods: list[Pod | None] = list(pods)
        self.rng = rng
        self.used = {p.name for p in pods}
        self.serial = 0

    def new(self, source: Pod, gpu_spec: str | None = None) -> Pod:
        while f"gen-pod-{self.serial:05d}" in self.used:
            self.serial += 1
        name = f"gen-pod-{self.serial:05d}"
        self.used.add(name)
        self.serial += 1
        return Pod(
            name=name,
            cpu_milli=source.cpu_milli,
            memory_mib=source.memory_mib,
            num_gpu=source.num_gpu,
            gpu_milli=source.gpu_milli,
            qos=source.qos,
            gpu_spec=source.gpu_spec if gpu_spec is None else gpu_spec,
        )

    def draw(self, pool: Sequence[Pod], n: int) -> list[Pod]:
        """n new pods drawn with replacement from pool."""
        if n <= 0:
            return []
        return [self.new(pool[i]) for i in self.rng.integers(0, len(pool), size=n)]

    def slots(self, test: Callable[[Pod], bool]) -> list[int]:
        return [i for i, p in enumerate(self.pods) if p is not None and test(p)]

    def pick(self, indices: list[int]) -> int:
        return indices[int(self.rng.integers(0, len(indices)))]

    def result(self) -> tuple[Pod, ...]:
        return tuple(p for p in self.pods if p is not None)


def _converge(
    value: Callable[[], float], target: float, step: Callable[[bool], Callable[[], None] | None], what: str
) -> None:
    """Single-pod steps until value() is within STEP_TOLERANCE of target: step(up) does one step that raises
    (up) or lowers the value and returns how to undo it (None: no step possible). Where one step crosses the
    target, the closer side is kept."""
    for _ in range(200_000):
        now = value()
        if abs(now - target) <= STEP_TOLERANCE:
            return
        up = now < target
        undo = step(up)
        if undo is None:
            return
        after = value()
        if (after > target) == up and after != target:  # crossed: keep the closer side
            if abs(now - target) < abs(after - target):
                undo()
            return
    raise RuntimeError(f"{what}: no convergence to {target:.3f}")  # pragma: no cover (each step moves the value)


def _apply_sharing(w: _Work, share: float, multi: float | None, pool_sharing: list[Pod], pool_other: list[Pod]) -> None:
    """Every GPU pod replaced by a draw from the sharing or the non-sharing pool, as many as before, so that the
    sharing share of the demand is ``share`` (of the demand outside multi-GPU pods, S / (1 - M), with multi set)."""
    gpu_slots = w.slots(lambda p: p.num_gpu > 0)
    n = len(gpu_slots)
    if not n:
        return
    if not pool_sharing:
        raise ValueError(
            "Mix.sharing: the trace has no sharing pods (num_gpu 1, gpu_milli < 1000) to draw from; accepted: None"
        )
    # what counts beside the sharing demand: all non-sharing demand, or only whole one-GPU pods' with multi set
    counted = (lambda p: p.num_gpu == 1) if multi is not None else (lambda p: True)
    target = share if multi is None else (share / (1 - multi) if multi < 1 else 1.0)
    target = min(target, 1.0)
    if target < 1 and not any(counted(p) for p in pool_other):
        raise ValueError(
            f"Mix.sharing: {share:g} needs non-sharing GPU pods the trace does not have; accepted: 1 for this trace"
        )
    m_s = np.mean([p.gpu_demand_milli for p in pool_sharing])
    m_o = np.mean([p.gpu_demand_milli if counted(p) else 0 for p in pool_other]) if pool_other else 0.0
    n_s = n if target >= 1 else int(round(target * n * m_o / (m_s * (1 - target) + target * m_o)))
    n_s = min(max(n_s, 1), n)
    new = w.draw(pool_sharing, n_s) + w.draw(pool_other, n - n_s)
    order = w.rng.permutation(n)
    for slot, j in zip(gpu_slots, order, strict=False):
        w.pods[slot] = new[j]
    sums = {
        "s": sum(p.gpu_demand_milli for p in new if is_sharing(p)),
        "o": sum(p.gpu_demand_milli for p in new if not is_sharing(p) and counted(p)),
    }

    def value() -> float:
        return sums["s"] / (sums["s"] + sums["o"]) if sums["s"] + sums["o"] else 0.0

    def step(up: bool):
        # up: a counted non-sharing pod becomes a sharing draw; down: a sharing pod becomes a non-sharing draw
        slots = w.slots((lambda p: not is_sharing(p) and p.num_gpu > 0 and counted(p)) if up else is_sharing)
        if not slots:
            return None
        i = w.pick(slots)
        old = w.pods[i]
        fresh = w.draw(pool_sharing if up else pool_other, 1)[0]
        delta = {k: _part(fresh, k, counted) - _part(old, k, counted) for k in sums}
        w.pods[i] = fresh
        for k in sums:
            sums[k] += delta[k]

        def undo() -> None:
            w.pods[i] = old
            for k in sums:
                sums[k] -= delta[k]

        return undo

    _converge(value, target, step, "sharing")


def _part(p: Pod, key: str, counted: Callable[[Pod], bool]) -> int:
    if key == "s":
        return p.gpu_demand_milli if is_sharing(p) else 0
    return p.gpu_demand_milli if p.num_gpu and not is_sharing(p) and counted(p) else 0


def _apply_multi(w: _Work, share: float, pool_multi: list[Pod]) -> None:
    """Multi-GPU pods drawn and appended until they make ``share`` of the GPU demand (removed, where above)."""
    if share > 0 and not pool_multi:
        raise ValueError("Mix.multi: the trace has no multi-GPU pods to draw from; accepted: None or 0")
    live = [p for p in w.pods if p is not None]
    sums = {"m": sum(p.gpu_demand_milli for p in live if p.num_gpu > 1), "d": sum(p.gpu_demand_milli for p in live)}
    if share > 0 and sums["d"] - sums["m"] == 0:
        raise ValueError(
            "Mix.multi: no GPU demand outside multi-GPU pods, so no share below 1 can be reached; accepted: None"
        )
    if share == 0:
        for i in w.slots(lambda p: p.num_gpu > 1):
            w.pods[i] = None
        return
    if pool_multi and sums["m"] < share * sums["d"]:
        # the expected count for the target, from the pool's mean demand
        add = (share * sums["d"] - sums["m"]) / (1 - share)
        n = int(round(add / np.mean([p.gpu_demand_milli for p in pool_multi])))
        for p in w.draw(pool_multi, n):
            w.pods.append(p)
            sums["m"] += p.gpu_demand_milli
            sums["d"] += p.gpu_demand_milli

    def value() -> float:
        return sums["m"] / sums["d"] if sums["d"] else 0.0

    def step(up: bool):
        got = _add_or_remove(w, pool_multi, lambda q: q.num_gpu > 1, up)
        if got is None:
            return None
        i, p = got
        sign = 1 if up else -1
        sums["m"] += sign * p.gpu_demand_milli
        sums["d"] += sign * p.gpu_demand_milli

        def undo() -> None:
            w.pods[i] = None if up else p
            sums["m"] -= sign * p.gpu_demand_milli
            sums["d"] -= sign * p.gpu_demand_milli

        return undo

    _converge(value, share, step, "multi")


def _add_or_remove(w: _Work, pool: list[Pod], kind: Callable[[Pod], bool], up: bool) -> tuple[int, Pod] | None:
    """One pod drawn from ``pool`` and appended (``up``), or one random pod of ``kind`` taken out: (its slot, the
    pod); None when no pod of ``kind`` is left to take out."""
    if up:
        p = w.draw(pool, 1)[0]
        w.pods.append(p)
        return len(w.pods) - 1, p
    slots = w.slots(kind)
    if not slots:
        return None
    i = w.pick(slots)
    p = w.pods[i]
    w.pods[i] = None
    return i, p


def _apply_cpu(w: _Work, share: float, pool_cpu: list[Pod], cluster_cpus: int) -> None:
    """Every CPU-only pod replaced by draws from the CPU-only pool until their CPUs are ``share`` of the cluster's."""
    cpu_slots = w.slots(lambda p: p.num_gpu == 0)
    target = share * cluster_cpus * 1000
    if target > 0 and not pool_cpu:
        raise ValueError("Mix.cpu: the trace has no CPU-only pods to draw from; accepted: None or 0")
    mean_cpu = np.mean([p.cpu_milli for p in pool_cpu]) if pool_cpu else 1.0
    if target > 0 and mean_cpu <= 0:
        raise ValueError("Mix.cpu: the trace's CPU-only pods ask no CPU; accepted: None or 0")
    new = w.draw(pool_cpu, int(round(target / mean_cpu)) if target > 0 else 0)
    for k, slot in enumerate(cpu_slots):
        w.pods[slot] = new[k] if k < len(new) else None
    w.pods.extend(new[len(cpu_slots) :])
    sums = {"c": sum(p.cpu_milli for p in new)}

    def value() -> float:
        return sums["c"] / (cluster_cpus * 1000)

    def step(up: bool):
        got = _add_or_remove(w, pool_cpu, lambda q: q.num_gpu == 0, up)
        if got is None:
            return None
        i, p = got
        sign = 1 if up else -1
        sums["c"] += sign * p.cpu_milli

        def undo() -> None:
            w.pods[i] = None if up else p
            sums["c"] -= sign * p.cpu_milli

        return undo

    _converge(value, share, step, "cpu")


def _apply_typed(w: _Work, share: float, typed_from: Sequence[Pod]) -> None:
    """Constraints cleared, then a random subset of GPU pods constrained until it makes ``share`` of the GPU demand;
    each pod's string drawn from typed_from's strings for its kind of pod (all of them where that kind has none)."""
    specs = [p for p in typed_from if p.gpu_spec and p.num_gpu]
    if share > 0 and not specs:
        raise ValueError(
            "Mix.typed: typed_from has no GPU pod with a gpu_spec to take constraints from; accepted: None or 0"
        )
    for i in w.slots(lambda p: bool(p.gpu_spec)):
        p = w.pods[i]
        w.pods[i] = Pod(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.qos, "")
    gpu_slots = w.slots(lambda p: p.num_gpu > 0)
    total = sum(w.pods[i].gpu_demand_milli for i in gpu_slots)
    if not total or share == 0:
        return
    chosen: list[int] = []
    acc = 0
    for j in w.rng.permutation(len(gpu_slots)):
        i = gpu_slots[j]
        d = w.pods[i].gpu_demand_milli
        if acc >= share * total:
            break
        if acc + d > share * total and abs(acc - share * total) < abs(acc + d - share * total):
            continue  # this one would overshoot by more than it lacks now: try the next (smaller) one
        chosen.append(i)
        acc += d
    tables: dict[str, tuple[list[str], np.ndarray]] = {}
    for k in ("sharing", "whole", "multi", "all"):
        counts = Counter(p.gpu_spec for p in specs if k == "all" or kind(p) == k)
        names = sorted(counts)
        tables[k] = (names, np.array([counts[s] for s in names], dtype=float) / max(1, sum(counts.values())))
    for i in chosen:
        p = w.pods[i]
        names, probs = tables[kind(p)] if tables[kind(p)][0] else tables["all"]
        spec = names[int(w.rng.choice(len(names), p=probs))]
        w.pods[i] = Pod(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.qos, spec)


def generate(
    mix: Mix,
    seed: int,
    base: Sequence[Pod] | None = None,
    typed_from: Sequence[Pod] | None = None,
    cluster_cpus: int | None = None,
) -> tuple[Pod, ...]:
    """A workload of the given mix, drawn from ``base`` (default: the production trace, 8,152 pods) with
    numpy.random.default_rng(seed); constraints from ``typed_from`` (default: the gpuspec33 list's typed pods);
    ``cluster_cpus`` for the cpu share (default: the trace cluster's 107,018). Pure apart from reading the trace
    files for the defaults; the rules and their order are the module's docstring."""
    if not isinstance(mix, Mix):
        raise TypeError(f"mix: {type(mix).__name__} given; accepted: a Mix")
    base = trace_pods() if base is None else tuple(base)
    rng = np.random.default_rng(seed)
    w = _Work(base, rng)
    pool_sharing = [p for p in base if is_sharing(p)]
    pool_other = [p for p in base if p.num_gpu and not is_sharing(p)]
    pool_multi = [p for p in base if p.num_gpu > 1]
    pool_cpu = [p for p in base if not p.num_gpu]
    if mix.sharing is not None:
        _apply_sharing(w, mix.sharing, mix.multi, pool_sharing, pool_other)
    if mix.multi is not None:
        _apply_multi(w, mix.multi, pool_multi)
    if mix.cpu is not None:
        _apply_cpu(w, mix.cpu, pool_cpu, cluster_cpus or trace_cluster_cpus())
    if mix.typed is not None:
        _apply_typed(w, mix.typed, typed_pods() if typed_from is None else typed_from)
    return w.result()


def family(seed: int, count: int = 10) -> list[tuple[str, Mix]]:
    """``count`` mixes drawn from the seed, named gen{seed}-00 ...: each sets 1 to 4 parameters in FAMILY_RANGES
    (sharing + multi at most 1), values to two decimals; every third (00, 03, 06, ...) sets 2 to 4, so at least a
    third of them mix rules. Mix i depends on (seed, i) only: a shorter family is a prefix of a longer one."""
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count: {count} is out of range; accepted: an integer from 1 to {MAX_COUNT}")
    names = ("sharing", "multi", "typed", "cpu")
    out = []
    for i in range(count):
        rng = np.random.default_rng([seed, 0x6D6978, i])  # a stream of its own, apart from generate()'s
        k = int(rng.integers(2, 5)) if i % 3 == 0 else int(rng.integers(1, 5))
        chosen = {names[j] for j in rng.choice(4, size=k, replace=False)}
        values: dict[str, float] = {}
        for f in ("multi", "sharing", "typed", "cpu"):  # multi before sharing: sharing's top depends on it
            if f not in chosen:
                continue
            low, high = FAMILY_RANGES[f]
            if f == "sharing" and "multi" in values:
                high = min(high, 1 - values["multi"])
            values[f] = round(float(rng.uniform(low, high)), 2)
        out.append((f"gen{seed}-{i:02d}", Mix(**values)))
    return out


def write_pod_list(pods: Sequence[Pod], path: str | Path) -> Path:
    """An openb pod list (POD_COLUMNS) that sim/trace.py load_pods reads back as the same Pods; .gz: compressed."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(POD_COLUMNS)
        for p in pods:
            out.writerow([p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec, p.qos])
    return path


def generated(seed: int, count: int = 10) -> list[tuple[str, Mix, tuple[Pod, ...]]]:
    """family(seed, count), each workload generated: generate(mix, seed * MAX_COUNT + i)."""
    return [(name, mix, generate(mix, seed * MAX_COUNT + i)) for i, (name, mix) in enumerate(family(seed, count))]


RULES_HELP = """rules (each as the paper's published variants do it, applied in this order):
  sharing: pod count and CPU-only pods kept; every GPU pod redrawn from the trace's sharing pods (1 GPU,
           gpu_milli < 1000) or its other GPU pods until sharing pods make this share of GPU demand (gpushareX).
  multi:   every pod kept; multi-GPU pods drawn from the trace's 75 and appended until they make this share of
           GPU demand (multigpuX); removed instead where already above.
  cpu:     GPU pods kept; CPU-only pods redrawn from the trace's 1,088 until their CPUs make this share of the
           cluster's 107,018 CPUs (cpuXXX: 0.061 ... 0.385; the trace 0.179).
  typed:   the same pods; a random subset of GPU pods gets a gpu_spec drawn from the gpuspec33 list's own
           constraints until it makes this share of GPU demand (gpuspecX).
each target is hit within 0.5 point; with sharing and multi both set both hold in the result."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=RULES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, help="the family's seed (its mixes and their draws)")
    ap.add_argument("--count", type=int, default=10, help="workloads in the family (default 10)")
    ap.add_argument(
        "--mix", help="instead of a family: one workload of this mix, e.g. sharing=0.6,multi=0.3 (drawn with --seed)"
    )
    ap.add_argument("--out", metavar="DIR", help="also write DIR/openb_pod_list_<name>.csv for each workload")
    ap.add_argument(
        "--stats",
        nargs="+",
        metavar="FILE",
        help="only print these pod lists' figures (a file or a published workload's name)",
    )
    args = ap.parse_args(argv)
    if args.stats:
        for item in args.stats:
            path = workload_path(item)
            print(f"{path.name:36s} {stats_text(stats(load_pods(path)))}")
        return
    if args.seed is None:
        ap.error("--seed is required (or --stats FILE...)")
    try:
        if args.mix is not None:
            mix = Mix.parse(args.mix)
            rows = [(f"mix{args.seed}", mix, generate(mix, args.seed))]
        else:
            rows = generated(args.seed, args.count)
    except ValueError as e:
        ap.error(str(e))
    print(f"trace: {len(trace_pods())} pods; {stats_text(stats(trace_pods()))}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, mix, pods in rows:
        print(f"{name:10s} {mix.text():50s} {stats_text(stats(pods))}")
        if args.out:
            write_pod_list(pods, Path(args.out) / f"openb_pod_list_{name}.csv")
    if args.out:
        print(f"written: {len(rows)} pod lists in {args.out}")


if __name__ == "__main__":
    main()
