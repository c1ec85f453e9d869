"""What the product reads from Slurm, one shape whatever backend read it (CLI ``--json`` or pyslurm).

Every field is plain data (str, int, tuples, dicts), so two backends can be
compared with ``==`` and a view dumped as JSON (``gpushare slurm dump``).
GRES are keyed ``name`` or ``name:type`` (``gpu:l40s``, ``shard``), the
way Slurm writes them in a node's ``Gres=`` and a job's ``gres_detail``.
Pure: the parsers of Slurm's GRES strings live here too.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

_PAREN = re.compile(r"\(([^)]*)\)")
_ITEM = re.compile(r",(?=[^,()]+:)")  # items split at commas that start a new 'name:...' (not inside (IDX:0,2))


@dataclass(frozen=True, slots=True)
class GresUse:
    """A GRES held on one node: how many, and which device indexes when Slurm says (gpu; None for shard/mps)."""

    count: int
    indexes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    array_job_id: int | None
    array_task_id: int | None
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str  # PENDING, RUNNING, ... (base state only)
    reason: str  # why pending ("Resources", "Priority"); "None" when running
    nodes: str  # Slurm's node list ("" while pending)
    gres_request: dict[str, int] = field(default_factory=dict)  # tres_per_node: {"gpu:l40s": 1}
    gres_alloc: dict[str, dict[str, GresUse]] = field(default_factory=dict)  # node -> gres -> use
    submit_time: int | None = None  # epoch seconds slurmctld took the job (None: Slurm did not say)
    # epoch seconds a running job ends by its time limit (squeue EndTime: start + limit); None when Slurm did not say
    # (job_summaries() leaves it None: squeue --Format is read without it)
    end_time: int | None = None
    priority: int | None = None  # the job's priority (squeue Priority); None when Slurm did not say

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    state: tuple[str, ...]  # base state first, then flags sorted: ("IDLE", "DRAIN")
    reason: str
    gres: dict[str, int]  # configured: {"gpu:l40s": 2, "shard:l40s": 4}
    gres_alloc: dict[str, int]  # allocated, from the node's TRES in use: {"gpu": 1, "gpu:l40s": 1}
    features: tuple[str, ...]
    active_features: tuple[str, ...]
    weight: int
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    real_memory: int
    alloc_memory: int
    reason_user: str = ""  # who set the reason: "slurm" (SlurmUser) for slurmctld's own drains

    @property
    def base_state(self) -> str:
        return self.state[0] if self.state else ""

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state[1:])

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    state: str
    priority_tier: int
    total_nodes: int
    total_cpus: int

    def to_dict(self) -> dict:
        return asdict(self)


# sacct base states of a job that has ended (the first word of State: "CANCELLED by 0" is CANCELLED)
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reservation as slurmctld holds it (``scontrol show reservation --json``; pyslurm's reservation)."""

    name: str
    nodes: str  # Slurm's node list
    start: int | None  # epoch seconds (None: Slurm did not say)
    end: int | None
    flags: tuple[str, ...]  # sorted: ("IGNORE_JOBS", "MAINT", "SPEC_NODES")
    users: str  # comma-separated, as Slurm prints them

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A job as accounting (sacct) last recorded it: ``state`` PENDING/RUNNING/... or an ended state (its base
    state), exit code 'N:S', end in epoch seconds (None while it runs), the nodes it ran on."""

    job_id: int
    state: str
    exit_code: str
    end: int | None
    node: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == "0:0"

    def to_dict(self) -> dict:
        return asdict(self)


def node_state(parts) -> tuple[str, ...]:
    """Slurm's node state ('MIXED+DRAIN' or ['MIXED', 'DRAIN']) as (base, *sorted flags)."""
    if isinstance(parts, str):
        parts = parts.replace("*", "").split("+")
    parts = [p for p in parts if p]
    if not parts:
        return ()
    return (parts[0], *sorted(set(parts[1:])))


def parse_gres_config(text: str | None) -> dict[str, int]:
    """A node's ``Gres=`` ('gpu:l40s:2,shard:l40s:4(S:0)') as {'gpu:l40s': 2, 'shard:l40s': 4}."""
    out: dict[str, int] = {}
    for key, count, _ in _items(text):
        out[key] = out.get(key, 0) + count
    return out


def parse_gres_detail(text: str | None) -> dict[str, GresUse]:
    """One node's share of a job (``gres_detail``: 'gpu:l40s:1(IDX:0)', 'shard:l40s:2(2/4,0/4)')."""
    out: dict[str, GresUse] = {}
    for key, count, idx in _items(text):
        out[key] = GresUse(count, idx)
    return out


def _items(text: str | None):
    text = (text or "").strip()
    if not text or text in ("(null)", "N/A"):
        return
    for item in _ITEM.split(text):
        m = _PAREN.search(item)
        extra = m[1] if m else ""
        parts = _PAREN.sub("", item).replace("gres/", "").replace("gres:", "").split(":")
        if len(parts) < 2 or not parts[-1].isdigit():
            continue
        key = ":".join(parts[:-1])
        idx = expand_indexes(extra[4:]) if extra.startswith("IDX:") else None
        yield key, int(parts[-1]), idx


def expand_indexes(text: str) -> tuple[int, ...] | None:
    """'0-2,5' -> (0, 1, 2, 5); 'N/A' -> None."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def gres_from_tres(tres: dict[str, float]) -> dict[str, int]:
    """The gres/ entries of a TRES map ({'gres/gpu:l40s': 1, 'cpu': 4}) as {'gpu:l40s': 1}."""
    return {k[5:]: int(v) for k, v in tres.items() if k.startswith("gres/")}


def parse_tres_counts(text: str | None) -> dict[str, float]:
    """'cpu=6,mem=6720M,gres/gpu=1' -> {'cpu': 6.0, 'mem': '6720M'...}: only what gres_from_tres needs (numbers)."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.startswith("gres/"):
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out
