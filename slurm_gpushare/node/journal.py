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
the journal changes state or goes. The directory is root's, 0711: a user can
open a file whose name they know but not list the jobs; the journal is 0600,
the task file 0644 (only ids, UUIDs and numbers, never anything the job
chose). Hooks of concurrent jobs serialise on an flock of ``jobs/.lock``.

One bad journal never stops the node (docs/admins/journal.md). A journal that
cannot be read (not a regular file, a link, not UTF-8, not JSON, not a
format this version reads, a field missing or wrong, another job's id) is
set aside: renamed, never followed, to ``<job id>.json.bad-<UTC time>`` in
the same directory, reported on stderr and in ``JournalStore.quarantined``,
and the other journals are read as usual. Only a holder of the journal lock
renames; a reader without it (metrics) skips the file. Whether a GPU is in
doubt is decided by one rule, ``JournalStore.doubts``: the job of a journal
set aside still runs on the node (Slurm says so, or it is the job whose
epilog is running) and no readable journal of that job says what it holds.
Then, and only then, the node is drained with a reason naming the file.

Journals written by earlier versions are read: every format in
``READ_FORMATS``; a field added since has a default, so an older file
without it reads as the older version meant it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import sys
import time
from contextlib import contextmanager

from ..atomic import atomic_write
from ..errors import GpushareError
from ..policy.share import Mode
from ..records import field, record, replace
from .paths import JOURNAL_FORMAT, TASK_FORMAT, journal_dir, plain

TYPE_CHECKING = False  # pathlib and typing cost every node hook milliseconds at start-up: for type checkers only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

STATES = ("preparing", "ready", "ending")
# every journal format this version reads: the one it writes and those of earlier versions (same fields, or
# fewer: a field added later has a default). gpushare-journal/1 is the only one written so far.
READ_FORMATS = tuple(dict.fromkeys((JOURNAL_FORMAT, "gpushare-journal/1")))
JOURNAL_MODE, TASK_MODE, DIR_MODE = 0o600, 0o644, 0o711
MAX_BYTES = 1 << 20  # a journal is a few hundred bytes; anything this large is not one
_NAME = re.compile(r"^([1-9][0-9]{0,9})\.json$")
_ASIDE = re.compile(r"^([1-9][0-9]{0,9})\.json\.bad-[0-9TZ]+(\.[0-9]+)?$")


class JournalError(GpushareError):
    """A journal that cannot be read or written; names the file."""

    exit_code = 1


@record
class Device:
    """One GRES the job holds on this node, as Slurm numbered it and as NVML knows it.

    ``visible`` is what the job's CUDA_VISIBLE_DEVICES must say for it (a MIG
    UUID, a GPU UUID for MPS), or None to keep what Slurm set.

    Per-job MIG (``node.perjob``): ``profile`` is the instance made for the job
    and ``start`` its memory slice, recorded before it is created (``gi``,
    ``ci`` and ``mig_uuid`` once made), so the epilog or the health check can
    destroy what a crash left. Written only when set: other jobs' journals are
    as before."""

    slurm_index: int
    gpu_index: int
    gpu_uuid: str
    mode: str
    mig_uuid: str | None = None
    gi: int | None = None
    ci: int | None = None
    visible: str | None = None
    profile: str | None = None
    start: int | None = None
    minor: int | None = None  # MIG devices: the GPU's device minor (/dev/nvidia<minor>), for its capability files

    @property
    def per_job(self) -> bool:
        """A per-job MIG instance made for this job (destroyed when it ends), not a slice of a fixed layout."""
        return self.profile is not None

    def to_json(self) -> dict:
        data = vars(self)
        return {k: v for k, v in data.items() if k not in _PER_JOB or v is not None}

    @property
    def is_mig(self) -> bool:
        return self.mode == Mode.MIG

    @property
    def is_mps(self) -> bool:
        """An MPS share of the GPU (not an MPS GPU allocated whole: "mps-whole")."""
        return self.mode == Mode.MPS

    @property
    def is_shared(self) -> bool:
        """A share of a GPU other jobs may use too (MPS, a shard), not the GPU whole."""
        return self.mode in (Mode.MPS, Mode.SHARD)


_PER_JOB = ("profile", "start", "minor")  # Device's per-job MIG fields: in a journal only when set


@record
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


@record
class Journal:
    job_id: int
    uid: int
    gid: int
    node: str
    state: str = "preparing"
    devices: tuple[Device, ...] = ()
    mps: MpsDaemon | None = None
    env: dict[str, str] = field(default_factory=dict)
    # SLURM_JOB_START_TIME of the run the prolog set up (None where Slurm gave none): which run of the job this is,
    # when Slurm starts the same job id again on the node before the earlier run's epilog (``later_run``)
    start_time: int | None = None

    def to_json(self) -> dict:
        data = {
            "format": JOURNAL_FORMAT,
            "job_id": self.job_id,
            "uid": self.uid,
            "gid": self.gid,
            "node": self.node,
            "state": self.state,
            "devices": [d.to_json() for d in self.devices],
            "env": dict(self.env),
            "mps": None,
        }
        if self.start_time is not None:
            data["start_time"] = self.start_time
        if self.mps is not None:
            data["mps"] = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.mps).items()}
        return data

    @classmethod
    def from_json(cls, data: dict, source: str = "journal") -> Journal:
        try:
            if data.get("format") not in READ_FORMATS:
                raise ValueError(f"format {data.get('format')!r} is not one of {', '.join(READ_FORMATS)}")
            if data.get("state") not in STATES:
                raise ValueError(f"state {data.get('state')!r} is not one of {', '.join(STATES)}")
            mps = data.get("mps")
            return cls(
                job_id=int(data["job_id"]),
                uid=int(data["uid"]),
                gid=int(data["gid"]),
                node=str(data["node"]),
                state=data["state"],
                devices=tuple(Device(**d) for d in data["devices"]),
                mps=None if mps is None else MpsDaemon(**_daemon_fields(mps)),
                env={str(k): str(v) for k, v in data["env"].items()},
                start_time=None if data.get("start_time") is None else int(data["start_time"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise JournalError(f"{source}: unreadable journal ({exc})") from None

    def with_state(self, state: str) -> Journal:
        return replace(self, state=state)

    def later_than(self, start_time: int | None) -> bool:
        """Was this journal written for a later run of the job than the one that started at ``start_time``? True
        only where both times are known: Slurm started the job again on this node (slurmctld, restarted, had lost
        the earlier run's end) and the later run's prolog came before the earlier run's epilog. That epilog must
        leave the journal, the daemon and the instances to the later run (docs/reference/slurm-behaviour.md)."""
        return self.start_time is not None and start_time is not None and self.start_time > start_time


def _daemon_fields(mps: dict) -> dict[str, Any]:
    """A journal's ``mps`` entry as ``MpsDaemon``'s fields: JSON's lists back to tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in mps.items()}


# ---- files -----------------------------------------------------------------------


def write_json(path: str | os.PathLike, data: dict, mode: int = JOURNAL_MODE) -> None:
    """Atomically (readers see the old file or the new one), sorted keys."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True), mode)


def task_text(journal: Journal) -> str:
    """The task prolog's view of a ready journal (format in ``paths``)."""
    rows: list[tuple[str, ...]] = [("env", name, value) for name, value in journal.env.items()]
    rows += [("dev", str(d.slurm_index), d.gpu_uuid, d.visible or "-") for d in journal.devices]
    for row in rows:
        if any(not field or any(c.isspace() for c in field) for field in row):
            raise JournalError(f"journal of job {journal.job_id}: empty or blank field in {row!r}")
    return "".join(" ".join(row) + "\n" for row in [(TASK_FORMAT, str(journal.job_id)), *rows])


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@record
class SetAside:
    """A journal file that could not be read, and where it lies now.

    ``path`` is the ``.bad-`` file it was renamed to, or the journal's own path when it was not moved (a
    reader without the journal lock, or a rename that failed: ``moved`` False). ``reason`` says what was wrong
    with it ("" for a file set aside by an earlier run)."""

    job_id: int
    path: str
    reason: str = ""
    moved: bool = True

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.path}: unreadable journal of job {self.job_id}{why}, " + (
            "set aside" if self.moved else "left in place"
        )

    def doubt(self) -> str:
        """The drain reason's part: names the file first (a reason is cut at 200 characters), then the doubt."""
        return (
            f"{self.path}: unreadable journal of job {self.job_id}, set aside; "
            "what the job holds on the GPUs is unknown"
        )


class JournalStore:
    """The journals of one node, under ``<state_dir>/jobs``.

    ``quarantined``: the journals this store set aside (or, without the lock, skipped) since it was made, in
    order; ``set_aside()``: every ``.bad-`` file in the directory, from this run or earlier ones."""

    def __init__(self, state_dir: str | os.PathLike, report=None):
        self.dirname = plain(
            journal_dir(os.fspath(state_dir))
        )  # str paths inside: pathlib costs every hook ~17 M instructions
        self.quarantined: list[SetAside] = []
        self._report = report or _stderr
        self._held = 0

    def file(self, job_id: int) -> str:
        return os.path.join(self.dirname, f"{job_id}.json")

    def task_file(self, job_id: int) -> str:
        return os.path.join(self.dirname, f"{job_id}.task")

    @property
    def dir(self) -> Path:
        from pathlib import Path

        return Path(self.dirname)

    def path(self, job_id: int) -> Path:
        return self.dir / f"{job_id}.json"

    def task_path(self, job_id: int) -> Path:
        return self.dir / f"{job_id}.task"

    def write(self, journal: Journal) -> None:
        self._ensure_dir()
        if journal.state != "ready":
            _unlink(self.task_file(journal.job_id))
        write_json(self.file(journal.job_id), journal.to_json())
        if journal.state == "ready":
            atomic_write(self.task_file(journal.job_id), task_text(journal), TASK_MODE)

    def read(self, job_id: int) -> Journal | None:
        """The job's journal, None without one. An unreadable one is set aside (under the lock) and raises
        JournalError naming the file: it is the job this caller acts for, and what it holds is unknown."""
        try:
            return self._load(job_id)
        except _Bad as bad:
            aside = self._set_aside(job_id, self.file(job_id), str(bad))
            raise JournalError(f"{aside}; what the job holds on the GPUs is unknown") from None

    def peek(self, job_id: int) -> Journal | None:
        """The job's journal read without the lock (a journal is replaced whole, by rename), for a hook that must
        not wait on other jobs' prologs: None without one; an unreadable one raises JournalError naming it and
        is left where it is (only a holder of the lock sets one aside)."""
        try:
            return self._load(job_id)
        except _Bad as bad:
            raise JournalError(f"{self.file(job_id)}: {bad}") from None

    def _load(self, job_id: int) -> Journal | None:
        """The job's journal as its file holds it, None without one; _Bad when it cannot be read as one."""
        try:
            return _parse(job_id, self.file(job_id))
        except FileNotFoundError:
            return None

    def remove(self, job_id: int) -> bool:
        _unlink(self.task_file(job_id))
        try:
            os.unlink(self.file(job_id))
        except FileNotFoundError:
            return False
        _fsync_dir(self.dirname)
        return True

    def job_ids(self) -> list[int]:
        """Jobs with a journal (leftover temporary files and journals set aside are not journals)."""
        return sorted(int(m[1]) for m in map(_NAME.match, self._names()) if m)

    def all(self) -> dict[int, Journal]:
        """Every readable journal. One that cannot be read is set aside and reported, never raised:
        one bad file must not stop every hook on the node (see ``doubts``)."""
        found = {}
        for job_id in self.job_ids():
            path = self.file(job_id)
            try:
                found[job_id] = _parse(job_id, path)
            except FileNotFoundError:
                continue  # removed since listed: that job's epilog ended
            except _Bad as bad:
                self._set_aside(job_id, path, str(bad))
        return found

    def set_aside(self) -> list[SetAside]:
        """Every journal set aside in this directory, by this run or an earlier one, oldest name first."""
        by_name = {os.path.basename(q.path): q for q in self.quarantined if q.moved}
        return [
            by_name.get(n) or SetAside(int(m[1]), os.path.join(self.dirname, n))
            for n in sorted(self._names())
            if (m := _ASIDE.match(n))
        ]

    def doubts(self, running) -> list[SetAside]:
        """The rule for a GPU in doubt: a journal set aside whose job Slurm still runs on this node
        (``running``: job ids, as ``reconcile.running_jobs`` reads them) while no readable journal of that job
        is here. Such a job's epilog would find nothing to undo and its GPUs, MPS daemon or MIG device might
        be handed to the next job: drain, naming the file. A job that no longer runs is not a doubt (what it
        left is an orphan for reconcile: a daemon no journal names, a GPU the next prolog finds busy); nor is
        a job whose prolog ran again and wrote a new journal."""
        running, present = set(running), set(self.job_ids())
        return [q for q in self.set_aside() if q.job_id in running and q.job_id not in present]

    def stray_temporaries(self) -> list[Path]:
        """Half-written files left by a crash between mkstemp and rename, and task files without a journal."""
        names = set(self._names())
        strays = [n for n in names if n.startswith(".") and n != ".lock"]
        strays += [n for n in names if n.endswith(".task") and n[: -len(".task")] + ".json" not in names]
        return sorted(self.dir / n for n in strays)

    @contextmanager
    def locked(self):
        """Serialise the hooks of concurrent jobs (and reconcile) on this node."""
        self._ensure_dir()
        fd = os.open(os.path.join(self.dirname, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held += 1
            try:
                yield self
            finally:
                self._held -= 1
        finally:
            os.close(fd)

    # ---- inside ----

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.dirname)
        except FileNotFoundError:
            return []

    def _ensure_dir(self) -> None:
        """The journal directory (and a missing state dir) made root's, 0711, through a descriptor of the
        directory itself: a link in its place is refused, never followed."""
        for d in (os.path.dirname(self.dirname), self.dirname):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                pass
        fd = os.open(self.dirname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)

    def _set_aside(self, job_id: int, path: str, reason: str) -> SetAside:
        """Rename a bad journal aside (only under the journal lock: a reader without it could rename a good
        journal that replaced the bad one meanwhile); report it either way."""
        aside = SetAside(job_id, str(path), reason, moved=False)
        if self._held:
            target = self._aside_name(path)
            try:
                os.rename(path, target)  # renames a link itself, never what it points to
                _fsync_dir(self.dirname)
                aside = SetAside(job_id, str(target), reason)
            except FileNotFoundError:
                pass  # gone since it was read (not a journal any more)
            except OSError as exc:
                aside = SetAside(job_id, str(path), f"{reason}; not moved: {exc.strerror}", moved=False)
        self.quarantined.append(aside)
        self._report(f"gpushare journal: {aside}")
        return aside

    def _aside_name(self, path: str) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{path}.bad-{stamp}"
        n = 0
        while os.path.lexists(target):
            n += 1
            target = f"{path}.bad-{stamp}.{n}"
        return target


class _Bad(Exception):
    """Why a journal file cannot be read (the text goes into the report)."""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _parse(job_id: int, path: str) -> Journal:
    """The journal at ``path``; FileNotFoundError without one, _Bad naming what is wrong."""
    data = _load(path)
    try:
        journal = Journal.from_json(data, str(path))
    except JournalError as exc:
        raise _Bad(str(exc).split(": ", 1)[-1]) from None
    if journal.job_id != job_id:
        raise _Bad(f"names job {journal.job_id}, not {job_id}")
    return journal


def _load(path: str):
    """The JSON in a regular file at ``path``, opened without following a link or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _Bad("a symbolic link" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Bad("not a regular file")
        if info.st_size > MAX_BYTES:
            raise _Bad(f"{info.st_size} bytes, more than a journal's {MAX_BYTES}")
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise _Bad(f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Bad("not UTF-8 text") from None
    except ValueError as exc:
        raise _Bad(f"not JSON: {exc}") from None
