"""Slurm operations of the live planner's apply path: the relayout lock (a reservation), the root job.

The lock on a node is a Slurm reservation ``gpushare-relayout-<node>``
(``scontrol create reservation ... Flags=MAINT,IGNORE_JOBS``): slurmctld
creates a named reservation atomically, and a second create of the same
name fails with "Duplicate reservation name" (Slurm 24.11
src/slurmctld/reservation.c ``create_resv``: ``ESLURM_RESERVATION_NAME_DUP``;
scontrol prints "Error creating the reservation: Duplicate reservation
name"), which ``create_lock`` turns into ``LockHeld``. The reservation keeps
new jobs of everyone but root off the node while its GPU jobs end, shows in
``scontrol show res``, and ends by itself after its duration (a planner that
died leaves nothing behind for long). MAINT lets it overlap any other
reservation (``_resv_overlap`` skips MAINT), IGNORE_JOBS lets it start on a
node whose jobs still run.

The relayout itself runs on the node as a root batch job in that reservation
(``submit_relayout``): its script is fixed text (``relayout_script``), every
word of it checked (node name, absolute paths), and the job gets no
environment from the planner (``--export=NIL``: SLURM_* only, and unlike NONE
no login environment built on the node either; the script sets its own PATH).
A job still running when its reservation ends is killed (after slurm.conf's
ResvOverRun), so the reservation's duration covers the wait for GPU jobs
and the relayout job's time limit.

Every command is an argument list run through the Runner; nothing here
decides anything.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from ..errors import GpushareError
from ..proc import CommandError, Runner, run
from . import commands
from .cli_backend import _num, epoch_env

PREFIX = "gpushare-relayout-"
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SAFE_PATH_WORD = re.compile(r"^/[A-Za-z0-9_./+-]+$")
SCRIPT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RELAYOUT_QOS = "normal"
DUPLICATE = "Duplicate reservation name"  # slurm_errno.c ESLURM_RESERVATION_NAME_DUP (24.11)
INVALID = "Requested reservation is invalid"  # ESLURM_RESERVATION_INVALID: delete of a name that does not exist
# sacct states of a job that has ended (sacct's base state, the first word)
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


class ReservationError(GpushareError):
    exit_code = 1


class LockHeld(ReservationError):
    """The node's gpushare-relayout reservation exists: another planner (or an earlier run) holds the node."""


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: str
    start: int | None
    end: int | None
    flags: tuple[str, ...]
    users: str

    @property
    def node(self) -> str:
        """The node a gpushare-relayout reservation locks (from its name)."""
        return self.name[len(PREFIX) :] if self.name.startswith(PREFIX) else ""


@dataclass(frozen=True)
class JobEnd:
    """A job as sacct last recorded it: ``state`` PENDING/RUNNING/... or an ended state; exit code 'N:S'."""

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


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE_NAME.match(node):
        raise ReservationError(
            f"node name {node!r}: expected letters, digits, '.', '_' or '-' "
            "(a Slurm NodeName, up to 63 characters, not starting with a sign)"
        )
    return node


def check_path(path: str, what: str, percent: bool = False) -> str:
    """An absolute path of plain characters (``percent``: sbatch's %j and %x patterns allowed too)."""
    text = str(path)
    plain = text.replace("%j", "").replace("%x", "") if percent else text
    if not SAFE_PATH_WORD.match(plain) or "/../" in text + "/" or "/./" in text + "/":
        raise ReservationError(
            f"{what} {text!r}: expected an absolute path of letters, digits and _./+- "
            "(no '..', no spaces or shell characters)"
        )
    return text


def lock_name(node: str) -> str:
    return PREFIX + check_node(node)


def minutes(seconds: float) -> int:
    """Whole minutes covering ``seconds`` (at least 1): Slurm's reservation Duration and job --time unit."""
    return max(1, math.ceil(seconds / 60))


def relayout_script(policy: str, node: str, node_config: str | None = None) -> str:
    """The batch script of the root relayout job: fixed text, its words checked, no input from any job."""
    argv = ["gpushare", "node", "relayout", "--policy", check_path(policy, "live policy"), "--node", check_node(node)]
    if node_config is not None:
        argv += ["--node-config", check_path(node_config, "node config")]
    return (
        "#!/bin/sh\n"
        "# gpushare live planner: change this node's MIG layout to the live policy's (gpushare node relayout)\n"
        f"PATH={SCRIPT_PATH}\nexport PATH\n"
        f"exec {' '.join(argv)}\n"
    )


class Reservations:
    """The live planner's Slurm operations (run as root, or as a Slurm operator)."""

    def __init__(self, runner: Runner = run, *, timeout: float = 60.0, env: dict | None = None):
        self.runner, self.timeout, self.env = runner, timeout, env

    def _run(self, argv, *, check: bool = True, input: str | None = None):
        kwargs = {"env": self.env} if self.env is not None else {}
        return self.runner(list(argv), timeout=self.timeout, check=check, input=input, **kwargs)

    # ---- the lock -----------------------------------------------------------------------------
    def create_lock(self, node: str, duration_s: float) -> str:
        """Create ``gpushare-relayout-<node>`` on the node from now for ``duration_s`` (rounded up to minutes);
        its name. LockHeld when it exists already."""
        name = lock_name(node)
        res = self._run(commands.create_reservation(name, node, minutes(duration_s)), check=False)
        if res.returncode == 0:
            return name
        text = (res.stderr + res.stdout).strip()
        if DUPLICATE.lower() in text.lower():
            raise LockHeld(f"node {node}: reservation {name} exists: another planner holds the node")
        raise ReservationError(f"node {node}: cannot create reservation {name}: {text or f'exit {res.returncode}'}")

    def locks(self) -> list[Reservation]:
        """The gpushare-relayout-* reservations slurmctld has now."""
        return [r for r in self.reservations() if r.name.startswith(PREFIX)]

    def reservations(self) -> list[Reservation]:
        text = self._run(commands.RESERVATIONS_JSON).stdout
        try:
            items = json.loads(text).get("reservations")
        except (ValueError, AttributeError):
            items = None
        if not isinstance(items, list):
            raise ReservationError("`scontrol show reservation --json` printed no 'reservations' list")
        return [reservation_from_json(r) for r in items]

    def delete_lock(self, node: str) -> bool:
        """Delete the node's lock; False when it was not there (expired, or deleted by another planner)."""
        name = lock_name(node)
        res = self._run(commands.delete_reservation(name), check=False)
        if res.returncode == 0:
            return True
        text = (res.stderr + res.stdout).strip()
        if INVALID.lower() in text.lower():
            return False
        raise ReservationError(f"node {node}: cannot delete reservation {name}: {text or f'exit {res.returncode}'}")

    def extend_lock(self, node: str, from_now_s: float) -> None:
        """Make the lock last at least ``from_now_s`` more seconds (EndTime=now+N minutes)."""
        self._run(commands.update_reservation_end(lock_name(node), minutes(from_now_s)))

    # ---- the relayout job ---------------------------------------------------------------------
    def submit_relayout(
        self,
        node: str,
        policy: str,
        *,
        log: str,
        time_limit_s: float,
        partition: str | None = None,
        node_config: str | None = None,
        qos: str = RELAYOUT_QOS,
    ) -> int:
        """Submit the root relayout job into the node's lock; its job id. ``qos``: named, so job_submit.lua does not
        give the job its tier's QOS, which root's association need not have ("Invalid qos specification", seen
        on the test cluster); 'normal' is the QOS slurmdbd creates with every cluster."""
        name = lock_name(node)
        options = [
            f"--reservation={name}",
            f"--nodelist={node}",
            f"--job-name={name}",
            f"--output={check_path(log, 'relayout log', percent=True)}",
            "--export=NIL",
            f"--time={minutes(time_limit_s)}",
            "--nodes=1",
            "--ntasks=1",
            f"--qos={check_node(qos)}",
        ]
        if partition is not None:
            options.append(f"--partition={check_node(partition)}")
        res = self._run(commands.sbatch(options), input=relayout_script(policy, node, node_config))
        word = res.stdout.strip().split(";")[0]
        if not word.isdigit():
            raise ReservationError(f"sbatch for the relayout of {node} printed {res.stdout.strip()!r}, not a job id")
        return int(word)

    def relayout_jobs(self, node: str, since: float) -> list[int]:
        """Ids of root's jobs named ``gpushare-relayout-<node>`` submitted at or after ``since`` (epoch s), from
        slurmctld (squeue: a job just submitted, before slurmdbd has it) and from accounting (sacct: a job already
        gone from slurmctld's memory, MinJobAge after its end). How a run finds the job an earlier run submitted
        but did not live to record. Only root's: any user may name a job so, none may submit one as root."""
        import time

        name, env = lock_name(node), epoch_env(self.env)
        found: set[int] = set()
        queued = self.runner(commands.root_jobs_named(name), timeout=self.timeout, check=True, env=env).stdout
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        accounted = self.runner(
            commands.root_jobs_named_since(name, start), timeout=self.timeout, check=True, env=env
        ).stdout
        for source, text in (("squeue", queued), ("sacct", accounted)):
            for line in text.splitlines():
                words = line.strip().split("|")
                if not line.strip():
                    continue
                if len(words) != 3 or not words[0].isdigit():
                    raise ReservationError(
                        f"{source} of the jobs named {name}: unexpected line {line!r} (want job id|state|submit time)"
                    )
                if words[2].isdigit() and int(words[2]) >= since:
                    found.add(int(words[0]))
        return sorted(found)

    def job_end(self, job_id: int) -> JobEnd | None:
        """The job as sacct has it (None: slurmdbd has no record of it yet)."""
        fields = ("JobID", "State", "ExitCode", "End", "NodeList")
        env = epoch_env(self.env)
        res = self.runner(commands.sacct_jobs(fields, int(job_id)), timeout=self.timeout, check=True, env=env)
        for line in res.stdout.splitlines():
            words = line.split("|")
            if len(words) != len(fields) or words[0] != str(job_id):
                continue
            end = int(words[3]) if words[3].isdigit() else None
            return JobEnd(int(job_id), words[1].split()[0] if words[1] else "", words[2], end, words[4])
        return None


def reservation_from_json(r: dict) -> Reservation:
    flags = r.get("flags") or []
    if isinstance(flags, str):
        flags = flags.split(",")
    start, end = _num(r.get("start_time")), _num(r.get("end_time"))
    return Reservation(
        name=r.get("name") or "",
        nodes=r.get("node_list") or "",
        start=int(start) if start else None,
        end=int(end) if end else None,
        flags=tuple(sorted(str(f) for f in flags)),
        users=r.get("users") or "",
    )


__all__ = [
    "CommandError",
    "JobEnd",
    "LockHeld",
    "PREFIX",
    "Reservation",
    "ReservationError",
    "Reservations",
    "check_node",
    "check_path",
    "lock_name",
    "relayout_script",
]
