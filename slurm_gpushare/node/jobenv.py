"""The job as a root hook sees it: Slurm's environment, read and validated (the one place that reads it).

slurmd builds the Prolog/Epilog environment (Slurm's Prolog and Epilog Guide,
https://slurm.schedmd.com/prolog_epilog.html, lists what it sets, 24.11).
Only the variables below are read; each is checked against the one form
Slurm writes and rejected otherwise, with the variable named and the form
that would have been accepted. Job-controlled strings (job name, comment,
work dir, ...) are never read at all, but for SLURM_JOB_EXTRA, which per-job
MIG's submission filter sets (``gpushare-mig=<profile>``) and which is read
only as that record: its profile when the value is exactly a record, else
nothing of it (``mig_profile``), SLURM_JOB_RESTART_COUNT, read leniently
(``restarts``: a value that is no number only stops a requeue), and
SLURM_JOB_START_TIME, read leniently too (``start_time``: a value that is no
number only stops telling two runs of one job apart). The one exception is the task prolog
(as the user, on every task start), which reads SLURM_JOB_ID and the GPU
index lists itself without importing ``re`` (node/taskprolog.py: its budget
is the interpreter's start-up).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import GpushareError
from ..policy.share import RECORD_PREFIX
from ..records import record

_ID = re.compile(r"^[1-9][0-9]{0,9}$")
_UINT = re.compile(r"^(0|[1-9][0-9]{0,9})$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CONF = re.compile(r"^/[A-Za-z0-9_./-]+$")
_INDEXES = re.compile(r"^(0|[1-9][0-9]{0,3})(,(0|[1-9][0-9]{0,3}))*$")
_RECORD = re.compile(re.escape(RECORD_PREFIX) + r"([0-9]g\.[0-9]{1,4}gb(\+me)?)")  # fullmatch: a catalogue name
MAX_ID = 2**32 - 2  # Slurm's NO_VAL is 2^32 - 2; uids are below 2^32 - 1


class HookInputError(GpushareError):
    """Slurm's environment is not what a hook can trust; names the variable."""

    exit_code = 1


@record
class JobEnv:
    job_id: int
    uid: int
    gid: int
    node: str
    gpu_indexes: tuple[int, ...] = ()
    mps_percentage: int | None = None
    # per-job MIG (SLURM_JOB_EXTRA): None without one, the profile of a ``gpushare-mig=<profile>`` record, or ""
    # for any other value (never kept: the prolog refuses such a job on a per-job GPU)
    mig_profile: str | None = None
    # SLURM_JOB_RESTART_COUNT (Slurm's requeues of the job; unset: 0), None where it is not a whole number: only
    # per-job MIG's requeue of a refused job reads it (node.perjob.refusal_code), and None never requeues
    restarts: int | None = 0
    # SLURM_JOB_START_TIME (Slurm's start of this run of the job, from its credential; unset or not a number:
    # None): the journal records it, so an earlier run's epilog knows a later run's journal (Journal.later_than)
    start_time: int | None = None


def _get(env: Mapping[str, str], name: str, pattern: re.Pattern, form: str) -> str:
    value = env.get(name)
    if value is None or value == "":
        raise HookInputError(f"{name} is not set: this runs as a Slurm Prolog/Epilog ({form})")
    if not pattern.match(value):
        raise HookInputError(f"{name}={value[:40]!r} is not {form}")
    return value


def parse_id(env: Mapping[str, str], name: str) -> int:
    value = int(_get(env, name, _UINT if name != "SLURM_JOB_ID" else _ID, "a decimal id"))
    if value > MAX_ID:
        raise HookInputError(f"{name}={value} is out of range (at most {MAX_ID})")
    return value


def parse_indexes(value: str, name: str) -> tuple[int, ...]:
    if not _INDEXES.match(value):
        raise HookInputError(f"{name}={value[:40]!r} is not a comma-separated list of GRES indexes, e.g. 0,2")
    indexes = tuple(int(v) for v in value.split(","))
    if len(set(indexes)) != len(indexes):
        raise HookInputError(f"{name}={value!r} lists an index twice")
    return indexes


def job_from_env(env: Mapping[str, str]) -> JobEnv:
    """The job's identity and GPUs. ``SLURM_JOB_GPUS`` first: it is the index list in
    every mode; CUDA_VISIBLE_DEVICES (the same numbers in the prolog) only if absent."""
    job_id = parse_id(env, "SLURM_JOB_ID")
    uid = parse_id(env, "SLURM_JOB_UID")
    gid = parse_id(env, "SLURM_JOB_GID") if env.get("SLURM_JOB_GID") else uid
    node = node_name(env)
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    name = "SLURM_JOB_GPUS" if env.get("SLURM_JOB_GPUS") else "CUDA_VISIBLE_DEVICES"
    indexes = parse_indexes(gpus, name) if gpus else ()
    pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    percentage = None
    if pct:
        if not _UINT.match(pct) or not 1 <= int(pct) <= 100:
            raise HookInputError(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct[:20]!r} is not a whole percentage 1-100")
        percentage = int(pct)
    restarts = env.get("SLURM_JOB_RESTART_COUNT") or "0"
    return JobEnv(
        job_id,
        uid,
        gid,
        node,
        indexes,
        percentage,
        mig_record(env.get("SLURM_JOB_EXTRA")),
        int(restarts) if _UINT.match(restarts) else None,
        start_time(env),
    )


def start_time(env: Mapping[str, str]) -> int | None:
    """SLURM_JOB_START_TIME (24.11 sets it in the Prolog and Epilog environment from the job's credential) as a
    whole number of seconds, None where it is unset or anything else: it only tells two runs of one job apart."""
    value = env.get("SLURM_JOB_START_TIME") or ""
    return int(value) if _UINT.match(value) else None


def mig_record(extra: str | None) -> str | None:
    """The profile SLURM_JOB_EXTRA records (``gpushare-mig=<profile>``); None when it is unset or empty, "" when
    it is anything else (nothing of it is kept)."""
    if not extra:
        return None
    m = _RECORD.fullmatch(extra)
    return m[1] if m else ""


def node_name(env: Mapping[str, str]) -> str:
    """SLURMD_NODENAME, the node the hook runs for; HookInputError when missing or not a node name."""
    return _get(env, "SLURMD_NODENAME", _NODE, "a node name (letters, digits, '_', '.', '-')")


def node_name_or_none(env: Mapping[str, str]) -> str | None:
    """SLURMD_NODENAME when it is a node name, else None (for a failing hook that still wants to drain)."""
    value = env.get("SLURMD_NODENAME", "")
    return value if _NODE.match(value) else None


def slurm_conf(env: Mapping[str, str]) -> str | None:
    """SLURM_CONF when it is a plain absolute path (passed on to scontrol), else None."""
    value = env.get("SLURM_CONF", "")
    return value if _CONF.match(value) else None


def job_id_from_env(env: Mapping[str, str]) -> int:
    """The epilog needs only the id: everything else comes from the journal."""
    return parse_id(env, "SLURM_JOB_ID")
