"""Argument lists of every Slurm command the product runs, in one place (no imports: the hooks use it).

Nothing outside ``slurm_gpushare/slurm/`` writes a Slurm command name as
an argv head; tests/unit/slurm/test_client.py checks that over the source tree.
"""

from __future__ import annotations

SQUEUE_JSON = ("squeue", "--all", "--json")
NODES_JSON = ("scontrol", "show", "node", "--json")
PARTITIONS_JSON = ("scontrol", "show", "partition", "--json")
RECONFIGURE = ("scontrol", "reconfigure")
VERSION = ("scontrol", "--version")


# The jobs without their per-GPU indexes, for readers that poll (the exporter): squeue --Format with a delimiter
# no job can know after each field (parsable.delimiter; no width: nothing cut). About 30 times faster than --json
# for 10,000 jobs (0.27 s against 10 s in the grown test cluster, Slurm 24.11.5). Not the job's name, comment or
# work directory: no poller needs them, and they are a user's text. Run with SLURM_TIME_FORMAT=%s so SubmitTime is
# epoch seconds.
JOB_SUMMARY_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "UserName",
    "Account",
    "Partition",
    "QOS",
    "tres-per-node",
    "SubmitTime",
    "NodeList",
    "tres-alloc",
)


def job_summaries(delim: str) -> list[str]:
    """squeue --Format of JOB_SUMMARY_FIELDS, ``delim`` after each (a suffix: no ',' in it, not a digit first)."""
    return ["squeue", "--all", "--noheader", "--Format", ",".join(f"{f}:{delim}" for f in JOB_SUMMARY_FIELDS)]


def jobs_json(job_ids) -> list[str]:
    return ["squeue", "--all", "--json", "--jobs", ",".join(str(j) for j in job_ids)]


def node_json(node: str) -> list[str]:
    return ["scontrol", "show", "node", node, "--json"]


def jobs_on_node_json(node: str) -> list[str]:
    return ["squeue", "--all", "-w", node, "--json"]


def job_ids_on_node(node: str) -> list[str]:
    """Only the ids (``-o %A``): the node runtime's question, on a crashed node, as cheap as Slurm answers it."""
    return ["squeue", "-w", node, "-h", "-o", "%A"]


def running_batch_jobs_on_node(node: str) -> list[str]:
    """Running jobs on the node: id, start time, batch host and batch flag, '|' after each (run with
    SLURM_TIME_FORMAT=%s). The batch host of a job with no batch script (salloc, srun) is its submit host,
    so only the batch flag tells a batch job."""
    return ["squeue", "-w", node, "-h", "-t", "RUNNING", "--Format", "JobID:|,StartTime:|,BatchHost:|,BatchFlag:"]


def show_config() -> list[str]:
    return ["scontrol", "show", "config"]


def requeue(job_id: int) -> list[str]:
    return ["scontrol", "requeue", str(int(job_id))]


GPU_JOB_FIELDS = ("JobID", "tres-per-node")


def gpu_jobs_on_node(node: str, delim: str) -> list[str]:
    """Id and GRES per node of the jobs on the node, ``delim`` after each field (parsable.delimiter)."""
    return ["squeue", "-w", node, "-h", "--Format", ",".join(f"{f}:{delim}" for f in GPU_JOB_FIELDS)]


def drain(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]


def set_weight(node: str, weight: int) -> list[str]:
    """A node's scheduling weight on the running controller (no drain; slurm.conf's comes back at a reconfigure)."""
    return ["scontrol", "update", f"nodename={node}", f"weight={int(weight)}"]


def resume(node: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=resume"]


def scontrol(*args: str) -> list[str]:
    return ["scontrol", *args]


def sbatch(options: list[str]) -> list[str]:
    return ["sbatch", "--parsable", *options]


def srun(options: list[str], argv: list[str]) -> list[str]:
    return ["srun", *options, *argv]


JOB_END_FIELDS = ("JobID", "State", "ExitCode", "End", "NodeList")  # CliClient.job_end (SLURM_TIME_FORMAT=%s)


def sacct_jobs(fields: tuple[str, ...], job_id: int | None = None, extra: list[str] | None = None) -> list[str]:
    argv = ["sacct", "-a", "-X", "-P", "-n", "-o", ",".join(fields)]
    return argv + (["-j", str(job_id)] if job_id is not None else []) + list(extra or [])


def node_health_shell(node_expr: str) -> str:
    """The compose healthcheck of a test node (a shell line run by docker in the container)."""
    return f"scontrol -o show node {node_expr} | grep -qE 'State=(IDLE|MIXED|ALLOCATED|COMPLETING)'"


# ---- reservations, batch jobs and their ends (the client's, for the live planner's lock and relayout job) -------

RESERVATIONS_JSON = ("scontrol", "show", "reservation", "--json")


def create_reservation(name: str, node: str, minutes: int) -> list[str]:
    return [
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={name}",
        f"Nodes={node}",
        "StartTime=now",
        f"Duration={int(minutes)}",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    ]


def delete_reservation(name: str) -> list[str]:
    return ["scontrol", "delete", f"ReservationName={name}"]


def update_reservation_end(name: str, minutes: int) -> list[str]:
    return ["scontrol", "update", f"ReservationName={name}", f"EndTime=now+{int(minutes)}minutes"]


def root_jobs_named(name: str) -> list[str]:
    """root's jobs of this name slurmctld still holds, in any state (run with SLURM_TIME_FORMAT=%s: %V, the submit
    time, in epoch seconds)."""
    return ["squeue", "--all", "-h", "-t", "all", "-u", "root", f"--name={name}", "-o", "%i|%T|%V"]


def root_jobs_named_since(name: str, start: str) -> list[str]:
    """root's jobs of this name in accounting from ``start`` on (``YYYY-MM-DDTHH:MM:SS``, local time; run with
    SLURM_TIME_FORMAT=%s: Submit in epoch seconds)."""
    return ["sacct", "-X", "-P", "-n", "-u", "root", f"--name={name}", "-S", start, "-o", "JobID,State,Submit"]
