"""Recent finished jobs, per node, for the live planner: one ``sacct`` of a short window.

The accounting readers of ``sacct.py`` stream a month of jobs without the
nodes they ran on (usage is billed per account, not per node); the live
planner needs the opposite: a few hours, with the node of every job, so it
can tell which GRES types a node has been serving lately. One query:

    sacct -a -X -P --noheader -S <since> -E <until> -o JobID,State,Start,End,NodeList,AllocTRES

run with ``SLURM_TIME_FORMAT=%s`` (epoch seconds, no time zone involved).
``-S``/``-E`` without ``--state`` select every allocation that ran in the
window (sacct(1), "-S": "Select jobs in any state after the specified
time"); the jobs still running, or that never started, are dropped here:
only jobs with a start and an end at or before ``until`` are *finished*.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hostlist import expand_hostlist

from .model import gres_from_tres
from .parsable import SlurmParseError, parse_time, parse_tres, rows

HISTORY_FIELDS = ("JobID", "State", "Start", "End", "NodeList", "AllocTRES")
NOT_FINISHED = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED")


@dataclass(frozen=True)
class FinishedJob:
    """One job allocation that ran and ended: where (every node of it), what GRES it held, when."""

    job_id: str
    state: str  # the first word: "CANCELLED by 0" -> "CANCELLED"
    start: float
    end: float
    nodes: tuple[str, ...]
    gres: dict[str, int]  # AllocTRES' gres/ entries: {"gpu:a100_40g_1g.5gb": 1, "gpu": 1}


def history_argv(since: float, until: float) -> list[str]:
    """Every allocation that ran in [since, until), epoch seconds for -S/-E (sacct reads them with %s too)."""
    return [
        "sacct",
        "-a",
        "-X",
        "-P",
        "--noheader",
        "-S",
        _stamp(since),
        "-E",
        _stamp(until),
        "-o",
        ",".join(HISTORY_FIELDS),
    ]


def _stamp(t: float) -> str:
    # sacct's -S/-E take local time; with SLURM_TIME_FORMAT=%s they print epoch seconds, but they do not read
    # them: give the local time of this host (sacct runs here, in its zone)
    from datetime import datetime

    return datetime.fromtimestamp(int(t)).strftime("%Y-%m-%dT%H:%M:%S")


def parse_history(lines: Iterable[str], until: float, source: str = "sacct") -> Iterator[FinishedJob]:
    """The finished jobs of ``history_argv`` output (``--parsable2``, no header), in the order given."""
    for number, f in enumerate(rows(lines, len(HISTORY_FIELDS), source), 1):  # number: of the non-empty lines
        job_id, state, start, end, nodelist, alloc = f
        state = state.split()[0] if state.strip() else ""
        if state in NOT_FINISHED or "." in job_id:
            continue
        t0, t1 = parse_time(start), parse_time(end)
        if t0 is None or t1 is None or t1 > until or nodelist in ("", "None assigned", "(null)"):
            continue
        try:
            nodes = tuple(expand_hostlist(nodelist))
        except Exception as exc:  # hostlist.BadHostlist: name the job, not the library
            raise SlurmParseError(f"{source} line {number}: job {job_id}: NodeList {nodelist!r}: {exc}") from None
        yield FinishedJob(job_id, state, t0, t1, nodes, gres_from_tres(parse_tres(alloc)))


def recent_jobs(
    runner, since: float, until: float, *, timeout: float = 120.0, env: dict | None = None
) -> list[FinishedJob]:
    """The jobs that ran in [since, until) and had ended by ``until``, through ``runner`` (``env``: the
    environment to run sacct in, default this process's; SLURM_TIME_FORMAT=%s is set on top)."""
    env = {**(os.environ if env is None else env), "SLURM_TIME_FORMAT": "%s"}
    res = runner(history_argv(since, until), timeout=timeout, env=env)
    return list(parse_history(res.stdout.splitlines(), until))
