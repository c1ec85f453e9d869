"""What one run of the live planner does next: its steps (pure: data in, steps out; ``apply`` carries them out).

For each change in flight (``state.Record``, phase locking, waiting, submitting or relayout):

- locking (a run recorded the intent to lock the node, then stopped): its
  lock there: ``Adopt`` (the lock is the change's: recorded waiting, and on
  as waiting); no lock: ``Drop`` (nothing was made: the record is taken
  back, the node's last change is its record again, and a later run
  proposes the change anew if it is still worth it);
- waiting, its lock gone (expired, or deleted by hand): ``Lost`` (kept as an
  attempt: the dwell holds);
- waiting, GPU jobs still on the node: ``Wait``, or ``GiveUp`` once the lock
  is older than ``live.max_wait`` (the lock is deleted, the attempt kept);
- waiting, no GPU job left on the node: ``StartRelayout`` (write the live policy,
  render, submit the root job);
- submitting (a run recorded the new layout, then stopped somewhere among
  the live policy, the configuration, the lock's extension and ``sbatch``):
  a root job named for the node submitted since the change began: ``Found``
  (recorded as the change's relayout job; never a second one); none, the lock
  there: ``StartRelayout`` (the same steps again: each is idempotent, and the job
  is looked for once more under the state file's lock); none and no lock:
  ``Lost`` (the live policy is put back);
- relayout, the job still pending or running: ``Wait``;
- relayout, the job ended: ``Finish`` (COMPLETED 0:0: done; anything else:
  failed, the node left drained with a reason that names the job).

Then each proposal of ``live.plan.plan_live`` on a node with nothing in
flight: ``Take`` (create the lock; ``apply`` chains ``StartRelayout`` at once when
the node has no GPU job). The planner's own limits (dwell, benefit,
max_draining, max_wait, locked) have chosen the proposals already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..slurm.model import JobEnd
from .report import Proposal
from .state import Record, State
from .view import RELAYOUT_REASON
from .weights import WeightChange

# A relayout job that sacct still does not know this long after its submission is taken as failed.
NO_RECORD_GRACE = 600.0


@dataclass(frozen=True)
class Wait:
    node: str
    why: str


@dataclass(frozen=True)
class Lost:
    node: str
    why: str


@dataclass(frozen=True)
class GiveUp:
    node: str
    why: str


@dataclass(frozen=True)
class StartRelayout:
    """Write the live policy, render, submit the root relayout job (``node relayout`` does the node's part)."""

    node: str


@dataclass(frozen=True)
class Finish:
    node: str
    ok: bool
    result: str
    drain: str | None = None  # a reason to drain the node with (the job failed before it drained the node)


@dataclass(frozen=True)
class Adopt:
    """A change recorded as locking whose lock exists: the run that made it stopped before recording it."""

    node: str
    why: str


@dataclass(frozen=True)
class Drop:
    """A change recorded as locking with no lock: taken back, as if never recorded."""

    node: str
    why: str


@dataclass(frozen=True)
class Found:
    """A change recorded as submitting whose relayout job exists: recorded as the change's job."""

    node: str
    job: int


@dataclass(frozen=True)
class Take:
    proposal: Proposal


@dataclass(frozen=True)
class SetWeight:
    change: WeightChange  # scontrol update, no lock, no drain


@dataclass(frozen=True)
class StepInputs:
    """What one run knows when it decides its steps (``apply.LiveApply.run_once`` reads it from Slurm)."""

    now: float
    state: State  # the shared state file: the changes in flight
    locks: frozenset[str]  # nodes whose gpushare-relayout lock (reservation) exists
    max_wait: float  # live.max_wait: s a lock waits for the node's GPU jobs
    relayout_limit: float  # s: the relayout job's time limit
    gpu_jobs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> GPU jobs running there
    job_ends: Mapping[int, JobEnd | None] = field(default_factory=dict)  # relayout job -> its end, None: no record
    node_states: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)  # node -> (words, reason)
    found: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> relayout jobs found by name
    proposals: Sequence[Proposal] = ()  # the plan's (live.plan.plan_live)
    weights: Sequence[WeightChange] = ()  # the plan's node weight changes

    def locked(self, node: str) -> bool:
        return node in self.locks

    def jobs_on(self, node: str) -> tuple[int, ...]:
        return tuple(self.gpu_jobs.get(node, ()))

    def node_state(self, node: str) -> tuple[tuple[str, ...], str]:
        return self.node_states.get(node, ((), ""))


def next_steps(inputs: StepInputs) -> list:
    """The actions of this run, changes in flight first (in node order), then the proposals to start, then the
    weight changes (the plan's; a node under a change of its own keeps its weight).

    A change recorded as submitting is settled by the relayout jobs ``found`` for its node; one under relayout by
    its job's end in ``job_ends``."""
    actions: list = []
    in_flight = inputs.state.in_flight()
    for node, record in sorted(in_flight.items()):
        if record.phase == "locking":
            actions.append(_locking(record, inputs.locked(node)))
        elif record.phase == "submitting":
            actions.append(_submitting(record, inputs.locked(node), inputs.found.get(node, ())))
        else:
            actions.append(_next(inputs, record))
    busy = set(in_flight)
    for p in inputs.proposals:
        if p.node not in busy:
            actions.append(Take(p))
            busy.add(p.node)
    actions += [SetWeight(w) for w in inputs.weights if w.node not in busy]
    return actions


def _locking(record: Record, locked: bool):
    if locked:
        return Adopt(record.node, f"its lock was made by a run that stopped before recording it ({record.planner})")
    return Drop(
        record.node, f"the run that meant to lock it ({record.planner}) stopped before its reservation was made"
    )


def _submitting(record: Record, locked: bool, jobs):
    if jobs:
        return Found(record.node, min(jobs))
    if not locked:
        return Lost(
            record.node,
            f"its lock disappeared before the relayout job of the run that stopped ({record.planner}) was submitted",
        )
    return StartRelayout(record.node)


def _next(inputs: StepInputs, record: Record):
    node, now, max_wait = record.node, inputs.now, inputs.max_wait
    if record.phase == "waiting":
        jobs = inputs.jobs_on(node)
        if not inputs.locked(node):
            return Lost(node, "its lock disappeared before the relayout started (expired or deleted by hand)")
        if jobs:
            waited = now - record.locked_at
            ids = ", ".join(map(str, jobs))
            if waited > max_wait:
                return GiveUp(
                    node, f"GPU jobs {ids} still run {waited:.0f} s after the lock (live.max_wait {max_wait:g} s)"
                )
            return Wait(node, f"waiting for GPU jobs {ids} to end ({waited:.0f} of {max_wait:g} s)")
        return StartRelayout(node)
    # relayout: the root job decides
    end = inputs.job_ends.get(record.job) if record.job is not None else None  # no job: no record of its end
    node_state = inputs.node_state(node)
    if end is None:
        if record.submitted_at is not None and now - record.submitted_at > inputs.relayout_limit + NO_RECORD_GRACE:
            return Finish(
                node,
                False,
                f"relayout job {record.job}: no accounting record "
                f"{now - record.submitted_at:.0f} s after its submission",
                _drain(node_state, f"job {record.job} has no accounting record"),
            )
        return Wait(node, f"relayout job {record.job} not in accounting yet")
    if not end.ended:
        return Wait(node, f"relayout job {record.job} is {end.state}")
    if end.ok:
        return Finish(node, True, f"relayout job {record.job} COMPLETED: {record.change.first()[1]}")
    result = f"relayout job {record.job} ended {end.state} exit {end.exit_code}"
    return Finish(node, False, result, _drain(node_state, f"job {record.job} ended {end.state} exit {end.exit_code}"))


def _drain(node_state, why: str) -> str | None:
    """The reason to drain with, unless the node is drained with the relayout's own reason already."""
    words, reason = node_state
    if "DRAIN" in words and reason.startswith(RELAYOUT_REASON):
        return None
    return f"{RELAYOUT_REASON} failed: {why}"
