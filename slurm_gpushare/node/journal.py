"""Per-job journals: what the prolog set up for a job, so the epilog can undo exactly that.

One JSON file per job, ``<state_dir>/jobs/<job id>.json``, written
atomically (write to a temporary file, fsync, rename, fsync the directory):
after a crash a journal is either the old one or the new one. The prolog
writes it *before* it starts anything (state ``preparing``) and again when
done (``ready``), so nothing it starts is ever unrecorded; the epilog marks
it ``ending`` while it undoes, and removes it last. The MPS daemons' reference
count is the number of journals naming a daemon: no separate counter that
could drift from the journals.

The task prolog reads, as the job's user, the journal's ``.task`` twin (see
``paths``): written after the journal once it is ``ready``, removed before
the journal changes state or goes. Both are world-readable (0644) and hold
only ids, UUIDs and numbers, never anything the job chose. Hooks of
concurrent jobs serialise on an flock of ``jobs/.lock``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

from ..atomic import atomic_write
from ..errors import GpushareError
from ..records import dataclass, field
from .paths import JOURNAL_FORMAT, TASK_FORMAT, journal_dir

STATES = ("preparing", "ready", "ending")
_NAME = re.compile(r"^([1-9][0-9]{0,9})\.json$")


class JournalError(GpushareError):
    """A journal that cannot be read or written; names the file."""

    exit_code = 1


@dataclass(frozen=True)
class Device:
    """One GRES the job holds on this node, as Slurm numbered it and as NVML knows it.

    ``visible`` is what the job's CUDA_VISIBLE_DEVICES must say for it (a MIG
    UUID, a GPU UUID for MPS), or None to keep what Slurm set."""

    slurm_index: int
    gpu_index: int
    gpu_uuid: str
    mode: str
    mig_uuid: str | None = None
    gi: int | None = None
    ci: int | None = None
    visible: str | None = None


@dataclass(frozen=True)
class MpsDaemon:
    """One MPS control daemon: for one GPU set, one user, one thread percentage.

    Jobs with the same key share it (the daemon's defaults are the job's
    limits, so only jobs with equal limits may share)."""

    key: str
    gpu_indexes: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    uid: int
    gid: int
    percentage: int
    mem_limit_mib: tuple[int, ...]
    pipe_dir: str
    log_dir: str


@dataclass(frozen=True)
class Journal:
    job_id: int
    uid: int
    gid: int
    node: str
    state: str = "preparing"
    devices: tuple[Device, ...] = ()
    mps: MpsDaemon | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        data = {"format": JOURNAL_FORMAT, "job_id": self.job_id, "uid": self.uid, "gid": self.gid, "node": self.node,
                "state": self.state, "devices": [vars(d) for d in self.devices], "env": dict(self.env), "mps": None}
        if self.mps is not None:
            data["mps"] = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.mps).items()}
        return data

    @classmethod
    def from_json(cls, data: dict, source: str = "journal") -> Journal:
        try:
            if data.get("format") != JOURNAL_FORMAT or data.get("state") not in STATES:
                raise ValueError(f"not a {JOURNAL_FORMAT} journal")
            mps = data.get("mps")
            return cls(
                job_id=int(data["job_id"]), uid=int(data["uid"]), gid=int(data["gid"]), node=str(data["node"]),
                state=data["state"], devices=tuple(Device(**d) for d in data["devices"]),
                mps=None if mps is None else MpsDaemon(**{k: tuple(v) if isinstance(v, list) else v for k, v in mps.items()}),
                env={str(k): str(v) for k, v in data["env"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise JournalError(f"{source}: unreadable journal ({exc})") from None

    def with_state(self, state: str) -> Journal:
        return Journal(self.job_id, self.uid, self.gid, self.node, state, self.devices, self.mps, self.env)


# ---- files -----------------------------------------------------------------------


def write_json(path: Path, data: dict, mode: int = 0o644) -> None:
    """Atomically (readers see the old file or the new one), sorted keys."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True), mode)


def task_text(journal: Journal) -> str:
    """The task prolog's view of a ready journal (format in ``paths``)."""
    rows = [("env", name, value) for name, value in journal.env.items()]
    rows += [("dev", str(d.slurm_index), d.gpu_uuid, d.visible or "-") for d in journal.devices]
    for row in rows:
        if any(not field or any(c.isspace() for c in field) for field in row):
            raise JournalError(f"journal of job {journal.job_id}: empty or blank field in {row!r}")
    return "".join(" ".join(row) + "\n" for row in [(TASK_FORMAT, str(journal.job_id)), *rows])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalStore:
    """The journals of one node, under ``<state_dir>/jobs``."""

    def __init__(self, state_dir: str | Path):
        self.dir = Path(journal_dir(str(state_dir)))

    def path(self, job_id: int) -> Path:
        return self.dir / f"{job_id}.json"

    def task_path(self, job_id: int) -> Path:
        return self.dir / f"{job_id}.task"

    def write(self, journal: Journal) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        if journal.state != "ready":
            self.task_path(journal.job_id).unlink(missing_ok=True)
        write_json(self.path(journal.job_id), journal.to_json())
        if journal.state == "ready":
            atomic_write(self.task_path(journal.job_id), task_text(journal))

    def read(self, job_id: int) -> Journal | None:
        path = self.path(job_id)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise JournalError(f"cannot read journal {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise JournalError(f"{path}: not JSON ({exc})") from None
        return Journal.from_json(data, str(path))

    def remove(self, job_id: int) -> bool:
        self.task_path(job_id).unlink(missing_ok=True)
        try:
            self.path(job_id).unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(self.dir)
        return True

    def job_ids(self) -> list[int]:
        """Jobs with a journal (leftover temporary files are not journals)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m[1]) for m in map(_NAME.match, names) if m)

    def all(self) -> dict[int, Journal]:
        found = {}
        for job_id in self.job_ids():
            journal = self.read(job_id)
            if journal is not None:
                found[job_id] = journal
        return found

    def stray_temporaries(self) -> list[Path]:
        """Half-written files left by a crash between mkstemp and rename, and task files without a journal."""
        try:
            names = {p.name for p in self.dir.iterdir()}
        except FileNotFoundError:
            return []
        strays = [n for n in names if n.startswith(".") and n != ".lock"]
        strays += [n for n in names if n.endswith(".task") and n[: -len(".task")] + ".json" not in names]
        return sorted(self.dir / n for n in strays)

    @contextmanager
    def locked(self):
        """Serialise the hooks of concurrent jobs (and reconcile) on this node."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)
