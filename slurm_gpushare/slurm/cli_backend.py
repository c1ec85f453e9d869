"""The CLI backend of the Slurm client: the commands through the Runner, ``--json`` where Slurm prints it.

See ``client`` for the interface and how a backend is chosen.
"""

from __future__ import annotations

import io
import json
from typing import Sequence

from ..errors import GpushareError
from ..proc import Runner, run
from . import commands
from .model import Job, Node, Partition, gres_from_tres, node_state, parse_gres_config, parse_gres_detail, parse_tres_counts

class SlurmClientError(GpushareError):
    exit_code = 1


class CliClient:
    """Slurm through its commands, ``--json`` where it prints it."""

    backend = "cli"

    def __init__(self, runner: Runner = run, *, timeout: float = 120.0, env: dict | None = None):
        self.runner, self.timeout, self.env = runner, timeout, env

    def _run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = None):
        kwargs = {"env": self.env} if self.env is not None else {}
        return self.runner(list(argv), timeout=timeout or self.timeout, check=check, **kwargs)

    def _json(self, argv: Sequence[str], key: str) -> list[dict]:
        text = self._run(argv).stdout
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SlurmClientError(f"`{' '.join(argv)}` did not print JSON: {exc}") from None
        items = doc.get(key)
        if not isinstance(items, list):
            raise SlurmClientError(f"`{' '.join(argv)}`: no {key!r} list in its JSON")
        return items

    # ---- reads -------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job slurmctld holds (pending, running, completing), all partitions."""
        return [job_from_json(j) for j in self._json(commands.SQUEUE_JSON, "jobs")]

    def jobs_on_node(self, node: str) -> list[Job]:
        return [job_from_json(j) for j in self._json(commands.jobs_on_node_json(node), "jobs")]

    def nodes(self) -> list[Node]:
        return [node_from_json(n) for n in self._json(commands.NODES_JSON, "nodes")]

    def node(self, name: str) -> Node:
        found = [node_from_json(n) for n in self._json(commands.node_json(name), "nodes")]
        match = [n for n in found if n.name == name]
        if not match:
            raise SlurmClientError(f"scontrol show node {name}: no such node")
        return match[0]

    def partitions(self) -> list[Partition]:
        return [partition_from_json(p) for p in self._json(commands.PARTITIONS_JSON, "partitions")]

    def job_ids_on_node(self, node: str) -> set[int]:
        """Job ids Slurm has on the node, in any state that holds it (``squeue -w NODE -h -o %A``)."""
        jobs = set()
        for word in self._run(commands.job_ids_on_node(node), timeout=30).stdout.split():
            if not word.isdigit():
                raise SlurmClientError(f"squeue -w {node}: unexpected job id {word!r}")
            jobs.add(int(word))
        return jobs

    def gpu_job_lines(self, node: str) -> list[tuple[str, str]]:
        """(job id, TRES per node) of the jobs on the node (``squeue -w NODE -h -o '%A %b'``)."""
        out = []
        for line in self._run(commands.gpu_jobs_on_node(node)).stdout.splitlines():
            job, _, tres = line.strip().partition(" ")
            out.append((job, tres.strip()))
        return out

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

    def usage_source(self):
        """The sacct job records (``JobSource``) of this backend."""
        from .sacct import SacctSource

        return SacctSource(self.runner)

    # ---- changes -----------------------------------------------------------------------------
    def drain(self, node: str, reason: str, *, check: bool = True) -> None:
        self._run(commands.drain(node, reason), check=check)

    def resume(self, node: str) -> None:
        self._run(commands.resume(node))

    def reconfigure(self) -> None:
        self._run(commands.RECONFIGURE)

    def sacctmgr_apply(self, plan: Sequence[Sequence[str]]):
        from . import sacctmgr

        return sacctmgr.apply(self.runner, plan)


def as_client(client_or_runner, **kw) -> CliClient:
    """A client as given, or a bare Runner wrapped in the CLI client (callers that predate the client)."""
    return client_or_runner if isinstance(client_or_runner, CliClient) else CliClient(client_or_runner, **kw)


# ---- JSON -> model (data_parser v0.0.42 on 24.11, v0.0.44 on 26.05) ------------------------------

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
    for node, text in zip(names, details):
        use = parse_gres_detail(text)
        if use:
            alloc[node] = use
    array_job = _num(j.get("array_job_id")) or None
    task = _num(j.get("array_task_id"))
    return Job(
        job_id=int(j["job_id"]), array_job_id=array_job, array_task_id=task if array_job else None,
        name=j.get("name") or "", user=j.get("user_name") or "", account=j.get("account") or "",
        partition=j.get("partition") or "", qos=j.get("qos") or "", state=state[0] if state else "",
        reason=j.get("state_reason") or "", nodes=j.get("nodes") or "",
        gres_request=parse_gres_config(j.get("tres_per_node")), gres_alloc=alloc,
        submit_time=_time(j.get("submit_time")),
    )


def _time(value) -> int | None:
    """A data_parser time ({"set", "number"} or a bare number) as epoch seconds; None when unset or 0."""
    number = _num(value)
    return int(number) if number else None


def _allocated_nodes(j: dict, n: int) -> list[str]:
    """Node names in job_resources order (gres_detail is one entry per allocated node, in that order)."""
    if not n:
        return []
    nodes = ((j.get("job_resources") or {}).get("nodes") or {})
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
        name=n.get("name", ""), state=node_state(n.get("state") or []), reason=n.get("reason") or "",
        gres=parse_gres_config(n.get("gres")), gres_alloc=gres_from_tres(parse_tres_counts(n.get("tres_used"))),
        features=_names(n.get("features")), active_features=_names(n.get("active_features")),
        weight=int(_num(n.get("weight")) or 0), partitions=_names(n.get("partitions")),
        cpus=int(_num(n.get("cpus")) or 0), alloc_cpus=int(_num(n.get("alloc_cpus")) or 0),
        real_memory=int(_num(n.get("real_memory")) or 0), alloc_memory=int(_num(n.get("alloc_memory")) or 0),
    )


def partition_from_json(p: dict) -> Partition:
    state = ((p.get("partition") or {}).get("state")) or []
    return Partition(
        name=p.get("name", ""), state=state[0] if state else "",
        priority_tier=int(_num((p.get("priority") or {}).get("tier")) or 0),
        total_nodes=int(_num((p.get("nodes") or {}).get("total")) or 0),
        total_cpus=int(_num((p.get("cpus") or {}).get("total")) or 0),
    )


