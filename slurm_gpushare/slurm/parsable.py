"""Reading what Slurm's commands print with ``--parsable2`` (and ``--parsable``).

Slurm's print_fields writes ``|`` between fields; ``--parsable2`` ends a line
without a delimiter, ``--parsable`` with one. An unset number prints as an
empty field, an unknown time as ``Unknown`` (or ``None``), a TRES list as
``name=count`` pairs joined by ``,`` with memory in units (``mem=1G``).
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone, tzinfo

from ..errors import GpushareError

log = logging.getLogger("gpushare.slurm")


class SlurmParseError(GpushareError):
    """Slurm output that does not have the shape we asked for; names the source and line."""

    exit_code = 1


def rows(lines: Iterable[str], ncols: int, source: str = "output") -> Iterator[list[str]]:
    """Split each non-empty line into exactly ``ncols`` fields.

    Accepts ``--parsable`` too (one trailing ``|``), since the field count
    tells the two apart; any other count is an error naming the line, so a
    changed format never shifts columns silently.
    """
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line:
            continue
        fields = line.split("|")
        if len(fields) == ncols + 1 and fields[-1] == "":
            fields.pop()
        if len(fields) != ncols:
            raise SlurmParseError(f"{source} line {number}: {len(fields)} fields, expected {ncols}: {line[:120]!r}")
        yield fields


def sbatch_job_id(text: str) -> int | None:
    """The job id ``sbatch --parsable`` printed (``123``, or ``123;cluster`` on a federation); None for anything
    else."""
    word = text.strip().split(";")[0]
    return int(word) if word.isdigit() else None


def delimiter() -> str:
    """A field delimiter no job can put in its own text: ``|``, 16 random hex digits, ``|``; new for every command.

    Job names, comments, work directories, and (where AccountingStorageEnforce
    lacks ``associations``) accounts and QOS are text a user chooses, and may
    hold ``|`` and newlines. A reader that splits Slurm's text on those can be
    handed forged records. With a delimiter the user cannot know when the job
    was named (``squeue --Format 'F:<d>,...'``, ``sacct -p --delimiter=<d>``:
    the delimiter after every field, the last one included), a record ends
    only at ``<d>`` and a newline, and a field's own newlines stay inside it
    (``delimited``).
    """
    return f"|{secrets.token_hex(8)}|"


def delimited(text: str, delim: str, ncols: int, source: str, skipped: Counter | None = None) -> Iterator[list[str]]:
    """The records of ``text`` printed with ``delim`` after every field, each ended by ``delim`` and a newline.

    A record without exactly ``ncols`` fields (a command printed something
    else, or a record was cut) is skipped, logged and counted in
    ``skipped[source]``; the others are read. Lazily, one record at a time.
    """
    end, pos, size = delim + "\n", 0, len(text)
    while pos < size:
        cut = text.find(end, pos)
        record = text[pos:] if cut < 0 else text[pos:cut]
        pos = size if cut < 0 else cut + len(end)
        fields = record.split(delim)
        if len(fields) == ncols and cut >= 0:
            yield fields
        elif record.strip():
            skip(skipped, source, f"{len(fields)} fields, expected {ncols}: {record[:120]!r}")


def skip(skipped: Counter | None, source: str, why: str) -> None:
    """Count (in ``skipped[source]``) and log one record of ``source`` that was not read."""
    if skipped is not None:
        skipped[source] += 1
    log.warning("%s: skipped a record that does not parse (%s)", source, why)


_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}


def tres_value(text: str) -> float:
    """A TRES count: plain digits, or memory-style units relative to MiB (``1G`` is 1024)."""
    if text.isdigit():
        return int(text)
    if text and text[-1] in _UNITS:
        return float(text[:-1]) * _UNITS[text[-1]]
    return float(text)


def parse_tres(text: str) -> dict[str, float]:
    """``billing=3,cpu=2,gres/gpu:a100=1,mem=1G`` as ``{'billing': 3, ..., 'mem': 1024.0}``."""
    out: dict[str, float] = {}
    if not text:
        return out
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise SlurmParseError(f"TRES item {item!r} has no '=' in {text!r}")
        out[name] = tres_value(value)
    return out


def format_tres(tres: dict[str, float]) -> str:
    """The inverse of parse_tres for counts (sorted, integers without a decimal point)."""
    return ",".join(f"{k}={int(v) if float(v).is_integer() else v}" for k, v in sorted(tres.items()))


_NO_TIME = frozenset({"", "Unknown", "None", "N/A", "INVALID"})


def parse_time(text: str, tz: tzinfo | None = None) -> float | None:
    """A Slurm timestamp as POSIX seconds; None when Slurm has none.

    Digits are epoch seconds (what ``SLURM_TIME_FORMAT=%s`` prints, which the
    live queries use so no time zone is involved). ISO text is local time of
    the host that printed it: pass ``tz`` for a recorded file from elsewhere;
    without it the naive time is read in this process's zone, which is what
    sacct itself did when run here.
    """
    if text in _NO_TIME:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise SlurmParseError(f"{text!r} is not a Slurm time (YYYY-MM-DDTHH:MM:SS or epoch seconds)") from None
    if when.tzinfo is None and tz is not None:
        when = when.replace(tzinfo=tz)
    return when.timestamp()


def fast_time_parser(tz: tzinfo | None):
    """A parse_time for millions of rows: naive datetime arithmetic where the zone allows it.

    datetime.timestamp() on an aware value costs ~3 us; subtracting a naive
    epoch costs ~0.3 us, which is exact for UTC and fixed offsets. Zones with
    daylight saving (and the local zone) keep the exact, slower path.
    """
    if tz is None:
        return _local_time
    offset = tz.utcoffset(None) if isinstance(tz, timezone) else None
    if offset is None:
        return lambda text: parse_time(text, tz)
    epoch = datetime(1970, 1, 1) + offset
    one = timedelta(seconds=1)

    def parse(text: str) -> float | None:
        if text in _NO_TIME:
            return None
        if text.isdigit():
            return float(text)
        try:
            return (datetime.fromisoformat(text) - epoch) / one
        except ValueError:
            return parse_time(text, tz)

    return parse


def _local_time(text: str) -> float | None:
    if text in _NO_TIME:
        return None
    if text.isdigit():
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return parse_time(text)


_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(text: str) -> float:
    """Seconds in one of Slurm's time forms (slurm.conf, sacct Elapsed, PriorityDecayHalfLife).

    ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` as Slurm's
    time_str2secs reads them; ``UNLIMITED``/``INFINITE`` are infinite.
    """
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    m = _DURATION.match(text)
    if not m:
        raise SlurmParseError(f"{text!r} is not a Slurm time: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    days, a, b, c = m.groups()
    if days is not None:
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if c is not None:
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:
        return int(a) * 60 + int(b)
    return int(a) * 60


def parse_float(text: str) -> float | None:
    """A number Slurm printed with %f (``inf`` included); None for an empty (unset) field."""
    if text == "":
        return None
    return float(text)


def parse_int(text: str) -> int | None:
    return None if text == "" else int(text)


_PAIR = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|$)")


def parse_scontrol_oneliners(text: str) -> list[dict]:
    """`scontrol -o show job` lines into dicts (values may contain spaces, e.g. Reason=).

    Only for the test cluster's human-facing job records: product code reads
    jobs and nodes as JSON through ``client``.
    """
    return [dict(_PAIR.findall(line.strip())) for line in text.splitlines() if "=" in line]
