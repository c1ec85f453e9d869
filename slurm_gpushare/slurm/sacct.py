"""Job usage records from sacct (``-p`` with a delimiter no user knows, or recorded ``--parsable2`` or
``--json``), streamed one job at a time.

Every reader here is a generator: a month of a busy cluster is millions of
jobs, and nothing downstream needs more than one at a time. The live query
asks sacct one day at a time (the Runner buffers a command's whole output)
and hands each job to exactly one day, so no job is counted twice.

The JSON shape is data_parser v0.0.42 (Slurm 24.11): ``{"jobs": [{"job_id",
"user", "account", "partition", "qos", "state": {"current": [...]},
"time": {"start", "end", "elapsed"}, "tres": {"allocated": [{"type",
"name", "count"}]}}]}``; timestamps may also come as ``{"set", "number"}``
objects (older parsers), which are accepted.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import IO, Protocol

from ..proc import Runner
from .parsable import SlurmParseError, delimited, delimiter, fast_time_parser, format_tres, parse_tres, skip

FIELDS = (
    "JobID",
    "User",
    "Account",
    "Partition",
    "State",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "AllocTRES",
    "ReqTRES",
    "QOS",
)
DAY = 86400.0


@dataclass(slots=True)
class JobRecord:
    """One job allocation (``sacct -X``): who, where, when, and what it was given."""

    job_id: str
    user: str
    account: str
    partition: str
    state: str
    start: float | None
    end: float | None
    elapsed: int
    alloc_tres: str
    req_tres: str = ""
    qos: str = ""

    def tres(self) -> dict[str, float]:
        """The allocated TRES as numbers (parsed on demand: most consumers cache by the string)."""
        return parse_tres(self.alloc_tres)


class JobSource(Protocol):
    """Anything that yields the jobs that ran in a window: sacct, a recorded file, pyslurm."""

    def records(self, since: float, until: float) -> Iterator[JobRecord]: ...


def parse_parsable2(
    lines: Iterable[str], *, tz: tzinfo | None = None, fields: Sequence[str] = FIELDS, source: str = "sacct output"
) -> Iterator[JobRecord]:
    """Jobs from ``sacct -P --noheader -o <fields>`` lines, in the order given.

    A header line (``JobID|User|...``) is skipped if present. ``tz`` is the
    zone naive timestamps were printed in (None: this host's). One tight
    loop, no per-field calls: this runs a million times for a month.
    """
    jid, user, acct, part, state, start, end, raw, alloc, req, qos = _indices(fields, source)
    when = fast_time_parser(tz)
    n, header = len(fields), fields[0]
    for number, line in enumerate(lines, 1):
        f = line.rstrip("\r\n").split("|")
        if len(f) != n:
            fitted = _refit(f, n, line, number, source)
            if fitted is None:
                continue
            f = fitted
        if f[0] == header:
            continue
        f.append("")  # what a field sacct was not asked for reads as (index -1)
        r = f[raw]
        yield JobRecord(
            f[jid],
            f[user],
            f[acct],
            f[part],
            f[state],
            when(f[start]),
            when(f[end]),
            int(r) if r.isdigit() else 0,
            f[alloc],
            f[req],
            f[qos],
        )


def parse_delimited(
    text: str,
    delim: str,
    *,
    fields: Sequence[str] = FIELDS,
    tz: tzinfo | None = None,
    source: str = "sacct",
    skipped: Counter | None = None,
) -> Iterator[JobRecord]:
    """Jobs from ``sacct -p --noheader --delimiter=<delim> -o <fields>`` (``sacct_argv``), lazily.

    Why not ``--json``: it is ~25 times the bytes for the same jobs and is
    decoded whole per command. Why not plain ``-P``: User, Account and QOS
    are printed as slurmdbd holds them, and without enforced associations
    the account and QOS are whatever the user typed, newlines and ``|``
    included, which would let a job forge records. ``delim`` is new for
    every command and unknown to any user (``parsable.delimiter``), and sacct
    prints it after every field, the last one too: a record ends only at the
    delimiter and a newline, so a field's newline stays inside its record.
    A record that does not parse is skipped and counted in
    ``skipped[source]``; the rest are read.
    """
    jid, user, acct, part, state, start, end, raw, alloc, req, qos = _indices(fields, source)
    when = fast_time_parser(tz)
    for f in delimited(text, delim, len(fields), source, skipped):
        f.append("")  # what a field sacct was not asked for reads as (index -1)
        r = f[raw]
        try:
            rec = JobRecord(
                f[jid],
                f[user],
                f[acct],
                f[part],
                f[state],
                when(f[start]),
                when(f[end]),
                int(r) if r.isdigit() else 0,
                f[alloc],
                f[req],
                f[qos],
            )
        except SlurmParseError as exc:
            skip(skipped, source, f"job {f[jid][:40]!r}: {exc}")
            continue
        yield rec


def _indices(fields: Sequence[str], source: str) -> tuple[int, ...]:
    index = {name.lower(): i for i, name in enumerate(fields)}
    missing = [f for f in ("jobid", "account", "partition", "start", "end", "alloctres") if f not in index]
    if missing:
        raise SlurmParseError(f"{source}: sacct fields must include {', '.join(missing)}")
    names = (
        "jobid",
        "user",
        "account",
        "partition",
        "state",
        "start",
        "end",
        "elapsedraw",
        "alloctres",
        "reqtres",
        "qos",
    )
    return tuple(index.get(k, -1) for k in names)


def _refit(f: list[str], n: int, line: str, number: int, source: str) -> list[str] | None:
    """A line with the wrong field count: blank (skip), --parsable's trailing '|' (drop it), or an error."""
    if f == [""]:
        return None
    if len(f) == n + 1 and f[-1] == "":
        return f[:-1]
    raise SlurmParseError(f"{source} line {number}: {len(f)} fields, expected {n}: {line[:120]!r}")


def parse_json(stream: IO, *, chunk_size: int = 1 << 20, source: str = "sacct --json") -> Iterator[JobRecord]:
    """Jobs from ``sacct --json`` output, decoding one job object at a time (never the whole document)."""
    for job in iter_json_array(stream, "jobs", chunk_size=chunk_size, source=source):
        yield job_from_json(job)


def job_from_json(job: dict) -> JobRecord:
    """One data_parser job object as a JobRecord (TRES written back as sacct's ``k=v,`` string)."""
    t = job.get("time") or {}
    state = (job.get("state") or {}).get("current") or []
    if isinstance(state, str):
        state = [state]
    return JobRecord(
        job_id=_job_id(job),
        user=_name(job.get("user")),
        account=job.get("account") or "",
        partition=job.get("partition") or "",
        state=",".join(state),
        start=_stamp(t.get("start")),
        end=_stamp(t.get("end")),
        elapsed=int(_number(t.get("elapsed")) or 0),
        alloc_tres=_tres_string((job.get("tres") or {}).get("allocated") or []),
        req_tres=_tres_string((job.get("tres") or {}).get("requested") or []),
        qos=_name(job.get("qos")),
    )


def _job_id(job: dict) -> str:
    array = job.get("array") or {}
    task = _number(array.get("task_id"))
    parent = _number(array.get("job_id"))
    if parent and task is not None:
        return f"{int(parent)}_{int(task)}"
    return str(job.get("job_id", ""))


def _name(value) -> str:
    if isinstance(value, dict):
        return value.get("name") or ""
    return value or ""


def _number(value):
    """A plain number, or data_parser's ``{"set": true, "infinite": false, "number": N}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value


def _stamp(value) -> float | None:
    n = _number(value)
    return float(n) if n else None


def _tres_string(items: list[dict]) -> str:
    tres: dict[str, float] = {}
    for item in items:
        if (item.get("count") or 0) < 0:
            continue  # NO_VAL64 as int64 (24.11 lists "energy" with count -2): sacct -P leaves it out
        kind, name = item.get("type", ""), item.get("name") or ""
        key = f"{kind}/{name}" if name else kind
        tres[key] = tres.get(key, 0) + (item.get("count") or 0)
    return format_tres(tres)


def iter_json_array(stream: IO, key: str, *, chunk_size: int = 1 << 20, source: str = "JSON") -> Iterator[dict]:
    """Yield the elements of the top-level ``key`` array of a JSON object, reading in chunks.

    Other top-level members are decoded and dropped. Memory stays at one
    chunk plus one element, whatever the document's size.
    """
    reader = _Chunks(stream, chunk_size, source)
    reader.expect("{")
    while True:
        if reader.peek() == "}":
            return
        name = reader.value()
        reader.expect(":")
        if name == key:
            yield from _array(reader)
            return
        reader.value()
        if reader.peek() == ",":
            reader.expect(",")


def _array(reader: _Chunks) -> Iterator[dict]:
    reader.expect("[")
    if reader.peek() == "]":
        return
    while True:
        yield reader.value()
        if reader.peek() == "]":
            return
        reader.expect(",")


class _Chunks:
    """A JSON token reader over a text or binary stream that refills its buffer as values need it."""

    _WS = " \t\r\n"

    def __init__(self, stream: IO, chunk_size: int, source: str):
        self.stream, self.size, self.source = stream, chunk_size, source
        self.buf, self.pos, self.eof = "", 0, False
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self.stream.read(self.size)
        if isinstance(data, bytes):
            data = data.decode("utf-8")
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                raise SlurmParseError(f"{self.source}: JSON ended early")

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise SlurmParseError(f"{self.source}: expected {char!r} at {self.buf[self.pos : self.pos + 40]!r}")
        self.pos += 1

    def value(self):
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise SlurmParseError(f"{self.source}: invalid JSON: {exc}") from None
            if end == len(self.buf) and not self.eof and self._more():
                continue  # a number may go on in the next chunk
            self.pos = end
            return value


def open_records(path: Path, *, tz: tzinfo | None = None, fields: Sequence[str] = FIELDS) -> Iterator[JobRecord]:
    """Jobs from a recorded sacct output file: JSON if it starts with ``{``, parsable2 otherwise."""
    with open(path, "rb") as raw:
        head = raw.read(64).lstrip()
    if head.startswith(b"{"):
        with open(path, "rb") as f:
            yield from parse_json(f, source=str(path))
        return
    with open(path, encoding="utf-8", newline="") as f:
        yield from parse_parsable2(f, tz=tz, fields=fields, source=str(path))


def sacct_argv(since: float, until: float, *, delim: str, fields: Sequence[str] = FIELDS) -> list[str]:
    """All users' job allocations that were running in [since, until), ``delim`` after every field
    (``parse_delimited``)."""
    return [
        "sacct",
        "-a",
        "-X",
        "-p",
        "--noheader",
        f"--delimiter={delim}",
        "-S",
        _local(since),
        "-E",
        _local(until),
        "-o",
        ",".join(fields),
    ]


def _local(t: float) -> str:
    # sacct reads -S/-E in its own (inherited, so our) local time zone.
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass
class SacctSource:
    """Live sacct through the Runner, one ``chunk`` seconds at a time."""

    runner: Runner
    chunk: float = DAY
    timeout: float = 600.0
    skipped: Counter = field(default_factory=Counter)  # records that did not parse, by command

    def records(self, since: float, until: float) -> Iterator[JobRecord]:
        env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
        lo = since
        while lo < until:
            hi = min(until, lo + self.chunk)
            delim = delimiter()
            res = self.runner(sacct_argv(lo, hi, delim=delim), timeout=self.timeout, env=env)
            yield from _owned(parse_delimited(res.stdout, delim, skipped=self.skipped), since, lo, hi)
            lo = hi


def _owned(records: Iterable[JobRecord], since: float, lo: float, hi: float) -> Iterator[JobRecord]:
    """The jobs a chunk [lo, hi) answers for: those whose first second in the window falls in it."""
    for rec in records:
        if rec.start is None:
            continue
        first = max(rec.start, since)
        if lo <= first < hi:
            yield rec


@dataclass
class FileSource:
    """A recorded sacct file; the window is applied downstream by clipping."""

    path: Path
    tz: tzinfo | None = None

    def records(self, since: float, until: float) -> Iterator[JobRecord]:
        return open_records(self.path, tz=self.tz)


class PyslurmSource:
    """Jobs from slurmdbd through pyslurm (``pyslurm.db.Jobs.load``), imported lazily.

    pyslurm must match the installed Slurm exactly, so it is optional; the
    sacct source is the default everywhere. pyslurm 24.11's ``db.Job`` does
    not expose a job's TRES (its ``tres_allocated`` is commented out in
    db/job.pyx), so the AllocTRES/ReqTRES of each job are joined in from one
    ``sacct -o JobID,AllocTRES,ReqTRES`` of the same window; everything else
    (which jobs, who, where, state, times) comes from pyslurm.
    """

    TRES_FIELDS = ("JobID", "AllocTRES", "ReqTRES")

    def __init__(self, runner: Runner | None = None, *, skipped: Counter | None = None):
        import pyslurm  # imported here: most hosts do not have it (callers check it imports: slurm.client)

        from ..proc import run

        self._pyslurm = pyslurm
        self.runner = runner or run
        self.skipped = Counter() if skipped is None else skipped

    def records(self, since: float, until: float) -> Iterator[JobRecord]:
        db = self._pyslurm.db
        jobs = db.Jobs.load(db.JobFilter(start_time=int(since), end_time=int(until)))
        tres = self._tres(since, until)
        yield from _owned(self._converted(jobs.values(), tres), since, since, until)

    def _converted(self, jobs, tres: dict[str, tuple[str, str]]) -> Iterator[JobRecord]:
        for job in jobs:
            try:
                rec = record_from_pyslurm(job, tres)
            except (TypeError, ValueError, AttributeError) as exc:
                skip(self.skipped, "pyslurm.db.Jobs", f"{type(exc).__name__}: {exc}"[:200])
                continue
            yield rec

    def _tres(self, since: float, until: float) -> dict[str, tuple[str, str]]:
        delim = delimiter()
        res = self.runner(sacct_argv(since, until, delim=delim, fields=self.TRES_FIELDS), timeout=600)
        return {f[0]: (f[1], f[2]) for f in delimited(res.stdout, delim, len(self.TRES_FIELDS), "sacct", self.skipped)}


def record_from_pyslurm(job, tres: dict[str, tuple[str, str]] | None = None) -> JobRecord:
    """A pyslurm.db.Job as a JobRecord; its TRES from ``tres`` (job id -> (AllocTRES, ReqTRES), from sacct)."""
    array = getattr(job, "array_id", None)
    task = getattr(job, "array_task_id", None)
    # every array task as sacct prints it, ARRAY_TASK, the task that keeps the array's own job id included.
    # pyslurm's u32_parse reads 0 as "not set", so task 0 comes back None: a started record of an array is a task
    if array and task is None and job.start_time:
        task = 0
    job_id = f"{array}_{task}" if array and task is not None else str(job.id)
    alloc, req = (tres or {}).get(job_id, ("", ""))
    return JobRecord(
        job_id=job_id,
        user=job.user_name or "",
        account=job.account or "",
        partition=job.partition or "",
        state=job.state or "",
        start=float(job.start_time) if job.start_time else None,
        end=float(job.end_time) if job.end_time else None,
        elapsed=int(job.elapsed_time or 0),
        alloc_tres=alloc,
        req_tres=req,
        qos=job.qos or "",
    )
