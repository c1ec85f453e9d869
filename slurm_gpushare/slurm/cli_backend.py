"""The CLI backend of the Slurm client: the commands through the Runner, ``--json`` where Slurm prints it.

See ``client`` for the interface and how a backend is chosen.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence

from ..errors import GpushareError
from ..proc import Runner, run
from . import commands
from .model import (
    GresUse,
    Job,
    JobEnd,
    Node,
    Partition,
    Reservation,
    gres_from_tres,
    node_state,
    parse_gres_config,
    parse_gres_detail,
    parse_tres_counts,
)
from .parsable import delimited, delimiter, parse_time, rows, sbatch_job_id, skip

# What scontrol prints when slurmctld refuses a reservation (Slurm 24.11 src/common/slurm_errno.c)
DUPLICATE = "Duplicate reservation name"  # ESLURM_RESERVATION_NAME_DUP: a create of a name that exists
INVALID = "Requested reservation is invalid"  # ESLURM_RESERVATION_INVALID: a delete of a name that does not exist


class SlurmClientError(GpushareError):
    exit_code = 1


class ReservationError(SlurmClientError):
    """slurmctld refused to create, change or delete a reservation (its answer in the message)."""


class ReservationExists(ReservationError):
    """A reservation of that name exists: slurmctld creates a named reservation atomically, and a second create of
    the name fails (24.11 src/slurmctld/reservation.c ``create_resv``: ESLURM_RESERVATION_NAME_DUP)."""


class CliClient:
    """Slurm through its commands, ``--json`` where it prints it.

    A job's name, comment, extra, work directory (and, without enforced associations, its account and QOS)
    are text its user chose: every read here is ``--json``, or a command whose text fields are followed by a
    delimiter no user can know (``parsable.delimiter``), or one whose fields hold no user's text. A record
    that does not parse is skipped, logged and counted in ``skipped`` (by command), never fatal to the rest.
    """

    backend = "cli"

    def __init__(self, runner: Runner = run, *, timeout: float = 120.0, env: dict | None = None):
        self.runner, self.timeout, self.env = runner, timeout, env
        self.skipped: Counter[str] = Counter()

    def _run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None, input: str | None = None):
        kwargs: dict = {"env": self.env} if self.env is not None else {}
        if input is not None:
            kwargs["input"] = input
        return self.runner(list(argv), timeout=timeout or self.timeout, check=check, **kwargs)

    def _epoch_env(self) -> dict[str, str]:
        return epoch_env(self.env)

    def _json(self, argv: Sequence[str], key: str) -> list[dict]:
        text = self._run(argv).stdout
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SlurmClientError(f"`{' '.join(argv)}` did not print JSON: {exc}") from None
        items = doc.get(key) if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise SlurmClientError(f"`{' '.join(argv)}`: no {key!r} list in its JSON")
        return items

    def _each(self, convert: Callable, items: list, source: str) -> list:
        """``convert`` of every item; one that does not convert is skipped and counted in ``skipped[source]``."""
        out = []
        for item in items:
            try:
                out.append(convert(item))
            except (KeyError, TypeError, ValueError, AttributeError, GpushareError) as exc:
                skip(self.skipped, source, f"{type(exc).__name__}: {exc}"[:200])
        return out

    # ---- reads -------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job slurmctld holds (pending, running, completing), all partitions."""
        return self._each(job_from_json, self._json(commands.SQUEUE_JSON, "jobs"), "squeue --json")

    def job_summaries(self) -> list[Job]:
        """Every job as ``jobs()`` reads it, but from ``squeue --Format`` (commands.job_summaries): a running
        job's GRES per node are counts without device indexes (``GresUse.indexes`` None), and no name (``""``).
        Jobs on several nodes are read again with ``--json`` (squeue prints only their total). For pollers: 30
        times faster."""
        delim = delimiter()
        text = self.runner(
            commands.job_summaries(delim), timeout=self.timeout, check=True, env=self._epoch_env()
        ).stdout
        source = "squeue --Format"
        jobs: list[Job] = []
        multi: list[Job] = []
        for fields in delimited(text, delim, len(commands.JOB_SUMMARY_FIELDS), source, self.skipped):
            try:
                job, nodes = job_from_summary(fields)
            except SlurmClientError as exc:
                skip(self.skipped, source, str(exc))
                continue
            (multi if nodes > 1 else jobs).append(job)
        if multi:
            ids = [j.job_id for j in multi]
            again = {
                j.job_id: j
                for j in self._each(job_from_json, self._json(commands.jobs_json(ids), "jobs"), "squeue --json")
            }
            jobs += [again.get(j.job_id, j) for j in multi]  # one that ended meanwhile keeps its summary
        return jobs

    def jobs_on_node(self, node: str) -> list[Job]:
        return self._each(job_from_json, self._json(commands.jobs_on_node_json(node), "jobs"), "squeue --json")

    def nodes(self) -> list[Node]:
        return self._each(node_from_json, self._json(commands.NODES_JSON, "nodes"), "scontrol show node --json")

    def node(self, name: str) -> Node:
        found = self._each(node_from_json, self._json(commands.node_json(name), "nodes"), "scontrol show node --json")
        match = [n for n in found if n.name == name]
        if not match:
            raise SlurmClientError(f"scontrol show node {name}: no such node")
        return match[0]

    def partitions(self) -> list[Partition]:
        return self._each(
            partition_from_json, self._json(commands.PARTITIONS_JSON, "partitions"), "scontrol show partition --json"
        )

    def job_ids_on_node(self, node: str) -> set[int]:
        """Job ids Slurm has on the node, in any state that holds it (``squeue -w NODE -h -o %A``)."""
        jobs = set()
        for word in self._run(commands.job_ids_on_node(node), timeout=30).stdout.split():
            if not word.isdigit():
                raise SlurmClientError(f"squeue -w {node}: unexpected job id {word!r}")
            jobs.add(int(word))
        return jobs

    def gpu_job_lines(self, node: str) -> list[tuple[str, str]]:
        """(job id, TRES per node) of the jobs on the node (``squeue -w NODE -h --Format JobID,tres-per-node``,
        a delimiter no job knows after each field)."""
        delim = delimiter()
        text = self._run(commands.gpu_jobs_on_node(node, delim)).stdout
        return [
            (job.strip(), tres.strip())
            for job, tres in delimited(text, delim, len(commands.GPU_JOB_FIELDS), f"squeue -w {node}", self.skipped)
        ]

    def associations(self, cluster: str | None = None):
        from . import sacctmgr

        return sacctmgr.parse_assocs(io.StringIO(self._run(sacctmgr.assoc_argv(cluster)).stdout))

    def qos(self):
        from . import sacctmgr

        return sacctmgr.parse_qos(io.StringIO(self._run(sacctmgr.qos_argv()).stdout))

    def qos_access(self, cluster: str) -> dict[tuple[str, str | None], frozenset[str]]:
        from . import sacctmgr

        return sacctmgr.parse_access(io.StringIO(self._run(sacctmgr.access_argv(cluster)).stdout))

    def sshare(self, *, as_json: bool = False):
        from . import sshare

        return sshare.query(self.runner, as_json=as_json)

    def recent_jobs(self, since: float, until: float):
        """The jobs that ran in [since, until) and had ended by ``until``, with their nodes and GRES
        (``history.FinishedJob``): the live planner's history. sacct on every backend (pyslurm's db.Job has
        no TRES in 24.11)."""
        from .history import recent_jobs

        return recent_jobs(self.runner, since, until, timeout=self.timeout, env=self.env)

    def usage_source(self):
        """The sacct job records (``JobSource``) of this backend."""
        from .sacct import SacctSource

        return SacctSource(self.runner, skipped=self.skipped)

    def reservations(self) -> list[Reservation]:
        """Every reservation slurmctld holds (``scontrol show reservation --json``)."""
        return self._each(
            reservation_from_json,
            self._json(commands.RESERVATIONS_JSON, "reservations"),
            "scontrol show reservation --json",
        )

    def job_end(self, job_id: int) -> JobEnd | None:
        """The job as accounting has it (``sacct -j``, times in epoch seconds); None: slurmdbd has no record of
        it yet."""
        argv = commands.sacct_jobs(commands.JOB_END_FIELDS, int(job_id))
        text = self.runner(argv, timeout=self.timeout, check=True, env=self._epoch_env()).stdout
        for job, state, exit_code, end, nodes in rows(text.splitlines(), len(commands.JOB_END_FIELDS), "sacct -j"):
            if job == str(job_id):
                when = parse_time(end)
                return JobEnd(int(job_id), state.split()[0] if state else "", exit_code, _whole(when), nodes)
        return None

    def root_jobs_named(self, name: str, since: float) -> list[int]:
        """Ids of root's jobs named ``name`` submitted at or after ``since`` (epoch s), from slurmctld (squeue: a
        job just submitted, before slurmdbd has it) and from accounting (sacct: a job already gone from
        slurmctld's memory, MinJobAge after its end). Only root's: any user may name a job so, none may submit
        one as root."""
        env = self._epoch_env()
        queued = self.runner(commands.root_jobs_named(name), timeout=self.timeout, check=True, env=env).stdout
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        argv = commands.root_jobs_named_since(name, start)
        accounted = self.runner(argv, timeout=self.timeout, check=True, env=env).stdout
        found: set[int] = set()
        for source, text in (("squeue", queued), ("sacct", accounted)):
            lines = (line.strip() for line in text.splitlines())
            for job, _state, submit in rows(lines, 3, f"{source} of the jobs named {name} (job id|state|submit)"):
                if not job.isdigit():
                    raise SlurmClientError(f"{source} of the jobs named {name}: {job!r} is not a job id")
                if submit.isdigit() and int(submit) >= since:
                    found.add(int(job))
        return sorted(found)

    # ---- changes -----------------------------------------------------------------------------
    def create_reservation(self, name: str, node: str, minutes: int) -> None:
        """Root's reservation ``name`` of ``node`` from now for ``minutes``, flags MAINT and IGNORE_JOBS
        (``commands.create_reservation``). ReservationExists when the name is taken; ReservationError when
        slurmctld refuses it otherwise."""
        res = self._run(commands.create_reservation(name, node, minutes), check=False)
        if res.returncode == 0:
            return
        text = _answer(res)
        if DUPLICATE.lower() in text.lower():
            raise ReservationExists(f"reservation {name} exists")
        raise ReservationError(f"cannot create reservation {name}: {text}")

    def delete_reservation(self, name: str) -> bool:
        """Delete the reservation; False when it was not there (ended, or deleted by someone else)."""
        res = self._run(commands.delete_reservation(name), check=False)
        if res.returncode == 0:
            return True
        text = _answer(res)
        if INVALID.lower() in text.lower():
            return False
        raise ReservationError(f"cannot delete reservation {name}: {text}")

    def extend_reservation(self, name: str, minutes: int) -> None:
        """Make the reservation end ``minutes`` from now (``EndTime=now+<minutes>minutes``)."""
        self._run(commands.update_reservation_end(name, minutes))

    def submit_batch(self, options: Sequence[str], script: str) -> int:
        """``sbatch --parsable <options>`` with ``script`` on its standard input; the job id."""
        res = self._run(commands.sbatch(list(options)), input=script)
        job = sbatch_job_id(res.stdout)
        if job is None:
            raise SlurmClientError(f"sbatch printed {res.stdout.strip()!r}, not a job id")
        return job

    def drain(self, node: str, reason: str, *, check: bool = True) -> None:
        self._run(commands.drain(node, reason), check=check)

    def set_weight(self, node: str, weight: int) -> None:
        """``scontrol update nodename=<node> weight=<n>``: live, no drain, until the next reconfigure."""
        self._run(commands.set_weight(node, weight))

    def resume(self, node: str) -> None:
        self._run(commands.resume(node))

    def requeue(self, job_id: int) -> None:
        self._run(commands.requeue(job_id))

    def batch_jobs_started(self, node: str) -> dict[int, int]:
        """{job id: start time (epoch s)} of the running batch jobs whose batch script this node runs. A job
        without a batch script (salloc, srun: batch flag 0) is left out, whatever its batch host says."""
        out = self.runner(
            commands.running_batch_jobs_on_node(node), timeout=self.timeout, check=True, env=self._epoch_env()
        ).stdout
        jobs = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            words = [w.strip() for w in line.split("|")]
            if len(words) != 4 or not words[0].isdigit() or not words[1].isdigit() or words[3] not in ("0", "1"):
                raise SlurmClientError(
                    f"squeue -w {node} -t RUNNING: unexpected line {line!r} (want: job id, "
                    "start time in epoch seconds, batch host, batch flag 0 or 1, '|' after each)"
                )
            if words[3] == "1" and words[2] == node:
                jobs[int(words[0])] = int(words[1])
        return jobs

    def hook_programs(self) -> dict[str, list[str]]:
        """slurmctld's Prolog and Epilog programs as ``scontrol show config`` prints them: ``Prolog[0] = ...``,
        one line per program (24.11), or ``Prolog = ...``; an empty list when unset ("(null)")."""
        found: dict[str, list[str]] = {"Prolog": [], "Epilog": []}
        for line in self._run(commands.show_config()).stdout.splitlines():
            key, sep, value = line.partition("=")
            name = re.sub(r"\[\d+\]$", "", key.strip())
            if sep and name in found and value.strip() not in ("", "(null)"):
                found[name].append(value.strip())
        return found

    def reconfigure(self) -> None:
        self._run(commands.RECONFIGURE)

    def sacctmgr_apply(self, plan: Sequence[Sequence[str]]):
        from . import sacctmgr

        return sacctmgr.apply(self.runner, plan)


def _answer(res) -> str:
    """What a refusing command printed (its exit status when it printed nothing)."""
    return (res.stderr + res.stdout).strip() or f"exit {res.returncode}"


def _whole(seconds: float | None) -> int | None:
    return int(seconds) if seconds is not None else None


# ---- JSON -> model (data_parser v0.0.42 on 24.11, v0.0.44 on 26.05) ------------------------------


def epoch_env(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (None: this process's environment) with SLURM_TIME_FORMAT=%s: Slurm's commands print times as
    epoch seconds."""
    import os

    return {**(env if env is not None else os.environ), "SLURM_TIME_FORMAT": "%s"}


def _num(value):
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        return value.get("number")
    return value


def job_from_json(j: dict) -> Job:
    state = j.get("job_state") or []
    if isinstance(state, str):
        state = [state]
    details = j.get("gres_detail") or []
    names = _allocated_nodes(j, len(details))
    alloc = {}
    for node, text in zip(names, details, strict=False):
        use = parse_gres_detail(text)
        if use:
            alloc[node] = use
    array_job = _num(j.get("array_job_id")) or None
    task = _num(j.get("array_task_id"))
    return Job(
        job_id=int(j["job_id"]),
        array_job_id=array_job,
        array_task_id=task if array_job else None,
        name=j.get("name") or "",
        user=j.get("user_name") or "",
        account=j.get("account") or "",
        partition=j.get("partition") or "",
        qos=j.get("qos") or "",
        state=state[0] if state else "",
        reason=j.get("state_reason") or "",
        nodes=j.get("nodes") or "",
        gres_request=parse_gres_config(j.get("tres_per_node")),
        gres_alloc=alloc,
        submit_time=_time(j.get("submit_time")),
        end_time=_time(j.get("end_time")),
        priority=_priority(j.get("priority")),
    )


def _priority(value) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None


def _time(value) -> int | None:
    """A data_parser time ({"set", "number"} or a bare number) as epoch seconds; None when unset or 0."""
    number = _num(value)
    return int(number) if number else None


def job_from_summary(f: Sequence[str]) -> tuple[Job, int]:
    """The fields of one record of commands.job_summaries as a Job (no name), and the number of nodes its
    allocation spans."""
    n = len(commands.JOB_SUMMARY_FIELDS)
    if len(f) != n or not f[0].isdigit():
        raise SlurmClientError(
            f"squeue --Format: unexpected record {list(f)!r:.200} (want {n} fields: "
            f"{', '.join(commands.JOB_SUMMARY_FIELDS)}; a job id first)"
        )
    job_id, array_job, task, state, reason, user, account, partition, qos, per_node, submit, nodes, alloc = f
    # squeue prints some reasons with a description ('ReqNodeNotAvail, UnavailableNodes:lab-excl01'); --json
    # has the reason alone, and a label must stay bounded
    reason = reason.split(",", 1)[0]
    tres = parse_tres_counts(alloc)
    count = dict(item.partition("=")[::2] for item in alloc.split(",") if "=" in item).get("node", "1") or "1"
    if not count.isdigit():
        raise SlurmClientError(f"squeue --Format: job {job_id}: node count {count!r} in tres-alloc is not a number")
    n_nodes = int(count)
    use = {}
    if state != "PENDING" and nodes and n_nodes == 1:
        # typed entries where Slurm gives them ('gres/gpu:l40s=1' beside 'gres/gpu=1'), the bare name otherwise
        # (shard, mps): the keys gres_detail uses
        gres = gres_from_tres(tres)
        typed = {k.split(":", 1)[0] for k in gres if ":" in k}
        use = {k: GresUse(int(v), None) for k, v in gres.items() if ":" in k or k not in typed}
        use = {k: u for k, u in use.items() if u.count}
    is_array = task not in ("N/A", "")
    return Job(
        job_id=int(job_id),
        array_job_id=int(array_job) if is_array and array_job.isdigit() else None,
        array_task_id=int(task) if is_array and task.isdigit() else None,
        name="",
        user=user,
        account=account,
        partition=partition,
        qos=qos,
        state=state,
        reason=reason,
        nodes=nodes,
        gres_request=parse_gres_config(None if per_node in ("N/A", "") else per_node),
        gres_alloc={nodes: use} if use else {},
        submit_time=int(submit) if submit.isdigit() else None,
    ), n_nodes


def _allocated_nodes(j: dict, n: int) -> list[str]:
    """Node names in job_resources order (gres_detail is one entry per allocated node, in that order)."""
    if not n:
        return []
    nodes = (j.get("job_resources") or {}).get("nodes") or {}
    alloc = nodes.get("allocation") if isinstance(nodes, dict) else None
    if alloc:
        return [a.get("name", "") for a in alloc]
    if isinstance(nodes, list):  # older data_parser: job_resources.nodes is the list itself
        return [a.get("nodename") or a.get("name", "") for a in nodes]
    return [j.get("nodes") or ""] if n == 1 else []


def _names(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    return tuple(sorted(v for v in (value or []) if v))


def node_from_json(n: dict) -> Node:
    return Node(
        name=n.get("name", ""),
        state=node_state(n.get("state") or []),
        reason=n.get("reason") or "",
        reason_user=n.get("reason_set_by_user") or "",
        gres=parse_gres_config(n.get("gres")),
        gres_alloc=gres_from_tres(parse_tres_counts(n.get("tres_used"))),
        features=_names(n.get("features")),
        active_features=_names(n.get("active_features")),
        weight=int(_num(n.get("weight")) or 0),
        partitions=_names(n.get("partitions")),
        cpus=int(_num(n.get("cpus")) or 0),
        alloc_cpus=int(_num(n.get("alloc_cpus")) or 0),
        real_memory=int(_num(n.get("real_memory")) or 0),
        alloc_memory=int(_num(n.get("alloc_memory")) or 0),
    )


def partition_from_json(p: dict) -> Partition:
    state = ((p.get("partition") or {}).get("state")) or []
    return Partition(
        name=p.get("name", ""),
        state=state[0] if state else "",
        priority_tier=int(_num((p.get("priority") or {}).get("tier")) or 0),
        total_nodes=int(_num((p.get("nodes") or {}).get("total")) or 0),
        total_cpus=int(_num((p.get("cpus") or {}).get("total")) or 0),
    )


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
