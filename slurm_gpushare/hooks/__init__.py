"""Console entry points for Slurm's Prolog, Epilog and TaskProlog (tiny on purpose).

Each creates the real things (runner, NVML backend, MPS control client) and
hands them to ``slurm_gpushare.node``, where planning and execution live.
The task prolog imports nothing but ``node.paths`` and ``node.taskprolog``.
``Seen`` is here so that the prolog and epilog (``_common``) and their metrics
step (``_metrics``) share it without importing each other.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs every node hook start-up time: for type checkers only
if TYPE_CHECKING:
    from ..node.journal import Journal
    from ..node.nodeconfig import NodeSpec
    from ..node.observed import ObservedState


class Seen:
    """What a prolog or epilog run learnt, for the metrics written after it (``_metrics.after_run``).

    Filled field by field as the run goes (a run that fails half-way leaves what it learnt before), so it is a
    small mutable record, not a frozen ``records.record``: its fields are its ``__slots__``, so writing or reading
    a field it does not have raises AttributeError instead of passing a key nobody reads."""

    __slots__ = ("spec", "job_id", "live", "journal", "slice_seconds", "slice_refused")

    def __init__(self) -> None:
        self.spec: NodeSpec | None = None  # the node's spec, once loaded
        self.job_id: int | None = None  # the epilog's job
        self.live: ObservedState | None = None  # the GPUs (and journals) the run observed
        self.journal: Journal | None = None  # the prolog's journal, once written
        self.slice_seconds: float | None = None  # the prolog made the job's per-job MIG instance in this time
        self.slice_refused: str | None = None  # or refused the job: node.perjob.SliceRefused.code

    def __repr__(self) -> str:
        return (
            f"Seen(spec={self.spec!r}, job_id={self.job_id!r}, live={self.live!r}, journal={self.journal!r}, "
            f"slice_seconds={self.slice_seconds!r}, slice_refused={self.slice_refused!r})"
        )
