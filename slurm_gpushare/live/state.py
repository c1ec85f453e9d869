"""The live planner's shared state: one JSON file next to the live policy, changed only under a file lock.

Why a file and not Slurm (a node's Comment): the live policy and the
configuration rendered from it are read, changed and written by whichever
planner host changes a node, in the directory slurm.conf lives in (every
planner host and node reads them there); that read-modify-write needs a lock
on that directory anyway, and the same lock covers this file. A node's
Comment is the admin's free text (a planner would overwrite theirs), holds
one string, and a change in flight needs more than one (layout, job id,
times). The Slurm reservation stays the lock on the node itself.

``flock`` on the lock file ``<state>.lock``: on a Linux NFS client it is a
whole-file POSIX lock (nfs(5): "local_lock=none", the default), seen by every
host. Records are written atomically (``atomic_write``), so a reader without
the lock sees the old file or the new one.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..atomic import atomic_write
from ..errors import GpushareError
from ..policy.share import Share
from .change import Change, LayoutStep, ModeStep, share_of_text

FORMAT = "gpushare-live-state/2"
FORMAT_1 = "gpushare-live-state/1"  # read, never written: a record's change as first-GPU fields (``_change_v1``)
# locking: the intent to take the node's lock, written before the reservation is created; submitting: the live
# policy's new layout recorded (with the node's entries before it, ``Record.prior``), written before the live
# policy, the rendered configuration and the relayout job. A run that finds either finishes or undoes the step.
IN_FLIGHT = ("locking", "waiting", "submitting", "relayout")
ENDED = ("done", "failed", "gave_up", "lost")
HISTORY = 200  # ended changes kept (newest last)
_RECORD = {"phase", "locked_at", "line", "job", "submitted_at", "ended_at", "result", "planner", "prior"}
_KEYS = {
    FORMAT: _RECORD | {"node", "layouts", "modes"},
    FORMAT_1: _RECORD | {"node", "gpu", "old_layout", "new_layout", "changes", "modes"},
}


class StateError(GpushareError):
    exit_code = 1


@dataclass(frozen=True)
class Record:
    """One change (or attempt) of one node, as the apply side carries it out."""

    change: Change
    phase: str  # locking, waiting, submitting, relayout, done, failed, gave_up, lost
    locked_at: float  # the lock (reservation) was taken
    line: str = ""  # the proposal's report line
    job: int | None = None  # the relayout job
    submitted_at: float | None = None
    ended_at: float | None = None
    result: str = ""  # how it ended, one line
    planner: str = ""  # host and pid of the run that started it
    # the node's entries of State.layouts and State.modes before this change wrote its own (set with the phase
    # submitting): what the live policy is put back to when the change is lost, given up or not started
    prior: dict | None = None

    @property
    def node(self) -> str:
        return self.change.node

    @property
    def in_flight(self) -> bool:
        return self.phase in IN_FLIGHT

    @property
    def changed_at(self) -> float:
        """When the node last changed (or was tried): the end of a change, else its start."""
        return self.ended_at if self.ended_at is not None else self.locked_at

    def to_json(self) -> dict:
        return {
            **self.change.to_json(),
            "phase": self.phase,
            "locked_at": self.locked_at,
            "line": self.line,
            "job": self.job,
            "submitted_at": self.submitted_at,
            "ended_at": self.ended_at,
            "result": self.result,
            "planner": self.planner,
            "prior": self.prior,
        }

    @classmethod
    def from_json(cls, data: dict, version: str = FORMAT) -> Record:
        if not isinstance(data, dict) or not isinstance(data.get("prior"), (dict, type(None))):
            raise StateError(f"live state: a change record is not one of {version}: prior is not a mapping: {data!r}")
        unknown = sorted(set(data) - _KEYS[version])
        if unknown:
            raise StateError(f"live state: a change record is not one of {version}: unknown keys {unknown}: {data!r}")
        try:
            change = _change_v1(data) if version == FORMAT_1 else Change.from_json(data)
            job, submitted, ended = (data.get(k) for k in ("job", "submitted_at", "ended_at"))
            return cls(
                change,
                str(data["phase"]),
                float(data["locked_at"]),
                str(data.get("line", "")),
                None if job is None else int(job),
                None if submitted is None else float(submitted),
                None if ended is None else float(ended),
                str(data.get("result", "")),
                str(data.get("planner", "")),
                data.get("prior"),
            )
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise StateError(f"live state: a change record is not one of {version}: {exc}: {data!r}") from None


def _change_v1(data: dict) -> Change:
    """A record of format 1: ``changes`` ([gpu, old, new] of every GPU; empty in a record of one GPU, whose
    ``gpu``, ``old_layout`` and ``new_layout`` say it) or ``modes`` ([gpu, old mode as text, new entry])."""
    node = str(data["node"])
    if data.get("modes"):
        return Change(
            node,
            modes=tuple(
                ModeStep(int(g), share_of_text(str(old)), Share.from_entry(new)) for g, old, new in data["modes"]
            ),
        )
    steps = data.get("changes") or [(data["gpu"], data["old_layout"], data["new_layout"])]
    return Change(
        node, layouts=tuple(LayoutStep(int(g), tuple(map(str, old)), tuple(map(str, new))) for g, old, new in steps)
    )


@dataclass
class State:
    """Current change per node, the layouts the live policy carries, the ended changes (bounded)."""

    current: dict[str, Record] = field(default_factory=dict)
    layouts: dict[str, dict[int, tuple[str, ...]]] = field(default_factory=dict)  # node -> gpu -> layout
    modes: dict[str, dict[int, dict]] = field(default_factory=dict)  # node -> gpu -> sharing entry (non-MIG GPUs)
    weights: dict[str, int] = field(default_factory=dict)  # node -> the weight the live planner set (scontrol)
    history: list[Record] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> phase -> how many changes ended so

    def changes(self) -> dict[str, float]:
        """node -> epoch of its last change or attempt (live.view.ClusterView.changes)."""
        return {n: c.changed_at for n, c in self.current.items()}

    def in_flight(self) -> dict[str, Record]:
        return {n: c for n, c in self.current.items() if c.in_flight}

    def take_back(self, node: str) -> None:
        """Forget the node's current record (an intent that made nothing): its last ended change, kept in the
        history, is its record again (its time still holds the node back for live.min_dwell); none: no record."""
        self.current.pop(node, None)
        last = next((c for c in reversed(self.history) if c.node == node), None)
        if last is not None:
            self.current[node] = last  # as it was: not put(), which would count it again

    def node_entries(self, node: str) -> dict:
        """The node's entries of ``layouts`` and ``modes`` as JSON (``Record.prior``)."""
        return {
            "layouts": {str(g): list(lay) for g, lay in sorted(self.layouts.get(node, {}).items())},
            "modes": {str(g): dict(e) for g, e in sorted(self.modes.get(node, {}).items())},
        }

    def apply(self, record: Record) -> Record:
        """Record the change's layouts (or modes) for the live policy; the record with ``prior`` and phase
        submitting. Once: a record that has ``prior`` already is returned as it is."""
        if record.prior is not None:
            return record
        prior = self.node_entries(record.node)
        if record.change.modes:  # all the GPUs of the change, one drain
            self.modes.setdefault(record.node, {}).update(record.change.new_modes)
        else:
            self.layouts.setdefault(record.node, {}).update(record.change.new_layouts)
        return replace(record, phase="submitting", prior=prior)

    def restore(self, change: Record) -> None:
        """Put the node's entries back as they were before ``change`` applied its own (nothing when it did not)."""
        if change.prior is None:
            return
        node = change.node
        layouts = {int(g): tuple(lay) for g, lay in (change.prior.get("layouts") or {}).items()}
        modes = {int(g): dict(e) for g, e in (change.prior.get("modes") or {}).items()}
        if layouts:
            self.layouts[node] = layouts
        else:
            self.layouts.pop(node, None)
        if modes:
            self.modes[node] = modes
        else:
            self.modes.pop(node, None)

    def put(self, change: Record) -> None:
        before = self.current.get(change.node)
        self.current[change.node] = change
        if change.phase in ENDED and (before is None or before.phase not in ENDED):
            self.history = (self.history + [change])[-HISTORY:]
            per = self.counts.setdefault(change.node, {})
            per[change.phase] = per.get(change.phase, 0) + 1

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "current": {n: c.to_json() for n, c in sorted(self.current.items())},
            "layouts": {
                n: {str(g): list(lay) for g, lay in sorted(gl.items())} for n, gl in sorted(self.layouts.items())
            },
            "modes": {n: {str(g): dict(e) for g, e in sorted(ge.items())} for n, ge in sorted(self.modes.items())},
            "weights": dict(sorted(self.weights.items())),
            "history": [c.to_json() for c in self.history],
            "counts": self.counts,
        }

    @classmethod
    def from_json(cls, doc, source: str = "live state") -> State:
        if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, FORMAT_1):
            raise StateError(
                f"{source}: not a {FORMAT} (or {FORMAT_1}) file (format "
                f"{doc.get('format') if isinstance(doc, dict) else '?'!r}); "
                "move it away to start afresh"
            )
        try:
            layouts = {n: {int(g): tuple(lay) for g, lay in gl.items()} for n, gl in (doc.get("layouts") or {}).items()}
            modes = {n: {int(g): dict(e) for g, e in ge.items()} for n, ge in (doc.get("modes") or {}).items()}
            weights = {str(n): int(w) for n, w in (doc.get("weights") or {}).items()}
        except (AttributeError, ValueError, TypeError) as exc:
            raise StateError(f"{source}: layouts, modes or weights: {exc}") from None
        version = doc["format"]
        return cls(
            current={n: Record.from_json(c, version) for n, c in (doc.get("current") or {}).items()},
            layouts=layouts,
            modes=modes,
            weights=weights,
            history=[Record.from_json(c, version) for c in doc.get("history") or []],
            counts={n: dict(v) for n, v in (doc.get("counts") or {}).items()},
        )


class StateFile:
    """The state file and its lock file (``<path>.lock``, never replaced, so every holder locks the same inode)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def read(self) -> State:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise StateError(f"cannot read the live state {self.path}: {exc.strerror}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise StateError(f"{self.path}: not JSON ({exc}); move it away to start afresh") from None
        return State.from_json(doc, str(self.path))

    def write(self, state: State) -> None:
        atomic_write(self.path, json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n")

    @contextmanager
    def locked(self):
        """Hold the lock for a read-modify-write (of this file, the live policy, the rendered configuration)."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)  # closing drops the lock


__all__ = ["Record", "State", "StateError", "StateFile"]
