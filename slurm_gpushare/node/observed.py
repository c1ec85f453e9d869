"""What the node hooks share (prolog, epilog, reconcile): the GPU state they observe,
the journal write they plan, and the error that drains a node.

Its own module so that no hook imports another hook's module for a type.
"""

from __future__ import annotations

from ..errors import GpushareError
from ..gpu.backend import GpuProcess, MigDevice
from ..records import field, record
from .journal import Journal


class NodeUnsafe(GpushareError):
    """A hook found the node unsafe around a job: every reason, in one line naming job and node."""

    exit_code = 1

    def __init__(self, job_id: int, node: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"job {job_id} on {node}: " + "; ".join(reasons))


@record
class ObservedGpu:
    index: int
    uuid: str
    minor: int
    memory_mib: int
    mig_current: bool | None
    mig_devices: tuple[MigDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    compute_mode: str | None = (
        None  # nvidia-smi's name (EXCLUSIVE_PROCESS, ...); None: not read (only MPS prologs read it)
    )

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


@record
class ObservedState:
    gpus: dict[int, ObservedGpu]
    journals: dict[int, Journal] = field(default_factory=dict)
    mps_alive: frozenset[str] = frozenset()
    proc_jobs: dict[int, int | None] = field(default_factory=dict)  # pid -> job id, 0 no job, None not here

    def by_minor(self, minor: int) -> ObservedGpu | None:
        return next((g for g in self.gpus.values() if g.minor == minor), None)


def observe_gpus(backend, indexes=None) -> dict[int, ObservedGpu]:
    """The GPUs (all, or ``indexes``) with MIG devices and processes, read once."""
    found = {}
    for index in [g.index for g in backend.gpus()] if indexes is None else indexes:
        info = backend.gpu(index)
        migs = tuple(backend.mig_devices(index)) if info.mig_current else ()
        found[index] = ObservedGpu(
            index, info.uuid, info.minor, info.memory_mib, info.mig_current, migs, tuple(backend.processes(index))
        )
    return found


@record
class WriteJournal:
    journal: Journal

    def __str__(self) -> str:
        return f"write journal of job {self.journal.job_id} ({self.journal.state})"
