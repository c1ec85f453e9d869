"""The pyslurm backend of the Slurm client: reads through libslurm, changes through the CLI.

Imported only once ``client.pyslurm_problem`` has seen ``import pyslurm``
succeed in a child process: in a process without a reachable slurm.conf,
``import pyslurm`` stops the interpreter (a C-level fatal in slurm_init).

Reads: jobs (``pyslurm.Jobs``; but a job's per-node GRES and GPU indexes: pyslurm 24.11
does not unpack a job's resource layout, so ``gres_alloc`` stays empty; seen on 24.11.5), nodes
(``pyslurm.Nodes``), partitions, associations (``pyslurm.db.Associations``), sacct records
(``pyslurm.db.Jobs``, ``sacct.PyslurmSource``) and reservations (``pyslurm.reservation``: in 24.11
the only reservation API is that deprecated class, over slurm_load_reservations). pyslurm 24.11 has no
sshare and its QOS lacks priority and preemption, so those, the QOS access
lists, a job's end and root's jobs by name (sacct and squeue, as ``recent_jobs``) and every change
(drain, resume, reconfigure, sacctmgr, creating, extending and deleting a reservation, sbatch) go through the
CLI backend this class extends: one place that changes Slurm.
"""

from __future__ import annotations

from .cli_backend import CliClient
from .model import GresUse, Job, Node, Partition, Reservation, expand_indexes, gres_from_tres, node_state
from .sacctmgr import AssocRow

FS_USE_PARENT = 0x7FFFFFFF  # SLURMDB_FS_USE_PARENT: FairShare=parent
# Base states squeue leaves out by default (src/squeue/opts.c: no --states: not finished, or COMPLETING).
FINISHED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)


class PyslurmClient(CliClient):
    backend = "pyslurm"

    def __init__(self, runner=None, **kw):
        import pyslurm  # the caller has checked it imports (client.pyslurm_problem)

        from ..proc import run

        super().__init__(runner or run, **kw)
        self.pyslurm = pyslurm

    def jobs(self) -> list[Job]:
        """The jobs squeue shows: slurm_load_jobs also returns finished ones until MinJobAge purges them."""
        jobs = [j for j in self.pyslurm.Jobs.load().values() if j.state not in FINISHED]
        return self._each(job_from_pyslurm, jobs, "pyslurm.Jobs")

    # job_summaries(): inherited, squeue --Format as the CLI reads it. pyslurm 24.11 gives no job's per-node
    # allocation (get_resource_layout_per_node() is empty on Slurm 24.11.5), which is what summaries are for,
    # and the CLI's summaries are as fast (0.40 s against pyslurm's 0.36 s for 9,990 jobs, bench/exporter.py).

    def nodes(self) -> list[Node]:
        return self._each(node_from_pyslurm, list(self.pyslurm.Nodes.load().values()), "pyslurm.Nodes")

    def node(self, name: str) -> Node:
        return node_from_pyslurm(self.pyslurm.Node.load(name))

    def partitions(self) -> list[Partition]:
        return self._each(partition_from_pyslurm, list(self.pyslurm.Partitions.load().values()), "pyslurm.Partitions")

    def reservations(self) -> list[Reservation]:
        """slurmctld's reservations through ``pyslurm.reservation().get()`` (name -> its fields)."""
        found = self.pyslurm.reservation().get()
        return self._each(reservation_from_pyslurm, list(found.items()), "pyslurm.reservation")

    def associations(self, cluster: str | None = None):
        db = self.pyslurm.db
        rows = []
        for a in db.Associations.load().values():
            if cluster and a.cluster != cluster:
                continue
            rows.append(assoc_from_pyslurm(a))
        return rows

    def usage_source(self):
        from .sacct import PyslurmSource

        return PyslurmSource(self.runner, skipped=self.skipped)


def _gres_key(key: str) -> str:
    return key[5:] if key.startswith("gres/") else key


def _requested(gres: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in (gres or {}).items():
        count = value["count"] if isinstance(value, dict) else value
        k = _gres_key(key)
        out[k] = out.get(k, 0) + int(count)
    return out


def _detail(gres: dict) -> dict[str, GresUse]:
    out = {}
    for key, value in (gres or {}).items():
        if isinstance(value, dict):
            out[_gres_key(key)] = GresUse(int(value["count"]), expand_indexes(str(value["indexes"])))
        else:
            out[_gres_key(key)] = GresUse(int(value), None)
    return out


def job_from_pyslurm(j) -> Job:
    layout = j.get_resource_layout_per_node() if j.allocated_nodes else {}
    alloc = {node: use for node, info in layout.items() if (use := _detail(info.get("gres")))}
    array_job = j.array_id or None
    return Job(
        job_id=int(j.id),
        array_job_id=array_job,
        array_task_id=j.array_task_id if array_job else None,
        name=j.name or "",
        user=j.user_name or "",
        account=j.account or "",
        partition=j.partition or "",
        qos=j.qos or "",
        state=j.state or "",
        reason=j.state_reason or "",
        nodes=j.allocated_nodes or "",
        gres_request=_requested(j.gres_per_node),
        gres_alloc=alloc,
        submit_time=int(j.submit_time) if j.submit_time else None,  # pyslurm: epoch seconds, None when unset
        end_time=int(j.end_time) if getattr(j, "end_time", None) else None,
        priority=int(j.priority) if getattr(j, "priority", None) is not None else None,
    )


def node_from_pyslurm(n) -> Node:
    tres = {k: float(v) for k, v in (n.allocated_tres or {}).items() if _is_number(v)}
    return Node(
        name=n.name,
        state=node_state(n.state or ""),
        reason=n.reason or "",
        reason_user=n.reason_user or "",
        gres=_requested(n.configured_gres),
        gres_alloc=gres_from_tres(tres),
        features=tuple(sorted(n.available_features or [])),
        active_features=tuple(sorted(n.active_features or [])),
        weight=int(n.weight or 0),
        partitions=tuple(sorted(n.partitions or [])),
        cpus=int(n.total_cpus or 0),
        alloc_cpus=int(n.allocated_cpus or 0),
        real_memory=int(n.real_memory or 0),
        alloc_memory=int(n.allocated_memory or 0),
    )


def partition_from_pyslurm(p) -> Partition:
    return Partition(
        name=p.name,
        state=p.state or "",
        priority_tier=int(p.priority_tier or 0),
        total_nodes=int(p.total_nodes or 0),
        total_cpus=int(p.total_cpus or 0),
    )


def reservation_from_pyslurm(item: tuple[str, dict]) -> Reservation:
    """One entry of pyslurm 24.11's ``reservation().get()``: its name and a dict of node_list, start_time and
    end_time (epoch seconds, 0 when unset), flags (Slurm's text, 'MAINT,IGNORE_JOBS,SPEC_NODES') and users (a
    list)."""
    name, r = item
    flags = (r.get("flags") or "").split(",")
    return Reservation(
        name=name,
        nodes=r.get("node_list") or "",
        start=int(r["start_time"]) if r.get("start_time") else None,
        end=int(r["end_time"]) if r.get("end_time") else None,
        flags=tuple(sorted(f for f in flags if f)),
        users=",".join(r.get("users") or []),
    )


def assoc_from_pyslurm(a) -> AssocRow:
    shares = a.shares
    fairshare: int | str | None
    if shares is None:
        fairshare = None
    elif shares == FS_USE_PARENT:
        fairshare = "parent"
    else:
        fairshare = int(shares)
    gres = (getattr(a.group_tres, "gres", None) or {}) if a.group_tres is not None else {}
    grp = {f"gres/{k}": int(v) for k, v in gres.items()}
    return AssocRow(a.account or "", a.user or None, a.parent_account or None, fairshare, grp)


def _is_number(v) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True
