"""`gpushare node reconcile`: repair what crashed hooks left, against what Slurm says runs here.

After a killed slurmd, a node reboot or an epilog that died half-way, a
node can hold journals of jobs that no longer run, MPS daemons no journal
names, MPS servers that outlived their daemon, and half-written journal
files. ``plan_reconcile`` compares them
with the jobs Slurm runs on the node (``squeue -w NODE``, through the
Slurm client) and plans, per orphan, exactly what the epilog would have done
(``epilog.plan_epilog``), plus stopping daemons that no journal names and killing the MPS processes
(servers whose daemon is gone, with its pipe dir) of keys no journal names. A
journal of a job Slurm still runs is never touched. MIG drift is reported,
not repaired (that is `gpushare node relayout`'s job: it needs a drain).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GpushareError
from .epilog import plan_epilog, process_jobs
from .journal import Device, Journal, JournalStore, MpsDaemon
from .observed import ObservedState, observe_gpus

TYPE_CHECKING = False  # typing costs the node hooks start-up time: for type checkers only
if TYPE_CHECKING:
    from ..slurm.interface import SlurmClient

_KEY = re.compile(r"^g[0-9]+(_[0-9]+)*-u[0-9]+-p[0-9]+$")


class ReconcileError(GpushareError):
    exit_code = 1


@dataclass(frozen=True)
class StopOrphanDaemon:
    daemon: MpsDaemon

    def __str__(self) -> str:
        return f"stop MPS daemon {self.daemon.key}: no journal names it"


@dataclass(frozen=True)
class KillOrphanMps:
    pid: int
    pipe_dir: str

    def __str__(self) -> str:
        return f"kill MPS process {self.pid} (pipe {self.pipe_dir}): no journal names its daemon"


@dataclass(frozen=True)
class DestroyUnjournaled:
    device: Device  # a per-job GPU's instance: its GPU, GI id and start (node.perjob.unjournaled)

    def __str__(self) -> str:
        d = self.device
        return f"destroy GI {d.gi} at memory slice {d.start} of GPU {d.gpu_index}: a per-job instance no journal names"


@dataclass(frozen=True)
class RemoveStray:
    path: str

    def __str__(self) -> str:
        return f"remove half-written file {self.path}"


@dataclass
class ReconcilePlan:
    orphans: dict[int, list] = field(default_factory=dict)  # job id -> epilog actions
    problems: dict[int, list[str]] = field(default_factory=dict)
    daemons: list[StopOrphanDaemon] = field(default_factory=list)
    processes: list[KillOrphanMps] = field(default_factory=list)
    strays: list[RemoveStray] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # unreadable journals set aside by this run (journal.SetAside)
    doubts: list[str] = field(default_factory=list)  # JournalStore.doubts: reported as not repaired (the node drains)
    instances: list[DestroyUnjournaled] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # reported, never a drain (an unjournaled instance in use)

    def lines(self, node: str) -> list[str]:
        out = [f"node {node}: job {j} runs, journal kept" for j in self.kept]
        out += [f"node {node}: {line}" for line in self.set_aside]
        for job, actions in self.orphans.items():
            out.append(f"node {node}: job {job} is not running here: " + "; ".join(str(a) for a in actions))
        out += [f"node {node}: {a}" for a in (*self.daemons, *self.processes, *self.instances, *self.strays)]
        out += [f"node {node}: MIG layout: {d}" for d in self.drift]
        return out


def running_jobs(client: SlurmClient, node: str) -> set[int]:
    """Job ids Slurm has on the node, in any state that holds it, through the Slurm client."""
    from ..slurm.cli_backend import SlurmClientError

    try:
        return client.job_ids_on_node(node)
    except SlurmClientError as exc:
        raise ReconcileError(str(exc)) from None


def daemon_dirs(state_dir: str) -> dict[str, str]:
    """key -> pipe dir of every MPS daemon directory under the state dir."""
    root = Path(state_dir) / "mps"
    try:
        return {p.name: str(p / "pipe") for p in sorted(root.iterdir()) if _KEY.match(p.name)}
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ReconcileError(f"cannot list the MPS daemon directories in {root}: {exc.strerror}") from None


def mps_processes_under(state_dir: str, proc: str = "/proc") -> dict[int, str]:
    """pid -> pipe dir of the MPS processes (procscan.mps_records) whose pipe dir is one of this state dir's
    keys. The memory of a process is read only when it is root's, a key's user's (its servers), or the real
    nvidia-cuda-mps-server (a server whose key dir is gone), in a child with a deadline."""
    return {pid: r["pipe"] for pid, r in _mps_under(state_dir, proc).items()}


def _mps_under(state_dir: str, proc: str = "/proc") -> dict[int, dict]:
    from .procscan import key_uid, mps_records, of_its_key

    root = Path(state_dir) / "mps"
    users = {key_uid(pipe) for pipe in daemon_dirs(state_dir).values()} - {None}
    return {
        pid: r
        for pid, r in mps_records(proc, users)[0].items()
        if Path(r["pipe"]).parent.parent == root and _KEY.match(Path(r["pipe"]).parent.name) and of_its_key(r)
    }


def plan_reconcile(
    journals: dict[int, Journal],
    running: set[int],
    live: ObservedState,
    dirs: dict[str, str],
    strays: list[Path],
    processes: dict[int, str] | None = None,
) -> ReconcilePlan:
    """Pure: journals vs running jobs, daemon directories and MPS processes (pid -> pipe dir,
    ``mps_processes_under``) vs journals."""
    plan = ReconcilePlan(strays=[RemoveStray(str(p)) for p in strays])
    remaining = {j: jr for j, jr in journals.items() if j in running}
    plan.kept = sorted(remaining)
    for job_id in sorted(set(journals) - running):
        # each orphan as if the journals of the jobs cleaned before it were gone
        view = ObservedState(live.gpus, {**remaining, job_id: journals[job_id]}, live.mps_alive, live.proc_jobs)
        actions, problems = plan_epilog(journals[job_id], view)
        plan.orphans[job_id] = actions
        if problems:
            plan.problems[job_id] = problems
    named = {jr.mps.key for jr in journals.values() if jr.mps is not None}
    for key, pipe in dirs.items():
        if key not in named:
            plan.daemons.append(StopOrphanDaemon(MpsDaemon(key, (), (), 0, 0, 0, (), pipe, "")))
    # a server can outlive its daemon and its pipe dir (a daemon killed as it forked one): the hooks never look
    # at a key again once its last job ended, so what runs under a key no journal names is killed here
    plan.processes = [
        KillOrphanMps(pid, pipe)
        for pid, pipe in sorted((processes or {}).items())
        if Path(pipe).parent.name not in named
    ]
    return plan


def plan_for_node(
    journals: dict[int, Journal],
    running: set[int],
    backend,
    state_dir: str,
    store: JournalStore,
    proc_root: str = "/proc",
    per_job: tuple[int, ...] = (),
) -> ReconcilePlan:
    """Observe this node (GPUs the journals name, daemon dirs, MPS processes, half-written files, the instances of
    its ``per_job`` MIG GPUs) and plan. While a journal set aside leaves a running job's GPUs in doubt
    (``JournalStore.doubts``), no daemon, MPS process or per-job instance is taken for an orphan (it may be that
    job's) and that job's task file stays."""
    doubts = store.doubts(running)
    keep = {store.task_path(q.job_id) for q in doubts}
    plan = plan_reconcile(
        journals,
        running,
        observe_reconcile(journals, backend, proc_root),
        {} if doubts else daemon_dirs(state_dir),
        [p for p in store.stray_temporaries() if p not in keep],
        {} if doubts else mps_processes_under(state_dir, proc_root),
    )
    plan.set_aside = [str(q) for q in store.quarantined]
    plan.doubts = [q.doubt() for q in doubts]
    if not doubts:
        plan_instances(plan, journals, backend, per_job)
    return plan


def plan_instances(plan: ReconcilePlan, journals: dict[int, Journal], backend, per_job: tuple[int, ...]) -> None:
    """The per-job GPUs' instances no journal names (every journal: the orphans' own are destroyed as theirs)."""
    from .perjob import unjournaled

    for index in per_job:
        found, notes = unjournaled(
            journals, index, backend.gpu(index).uuid, backend.gpu_instances(index), backend.processes(index)
        )
        plan.instances += [DestroyUnjournaled(d) for d in found]
        plan.notes += notes


def execute_reconcile(plan: ReconcilePlan, store: JournalStore, mps, killer, journals: dict[int, Journal]) -> list[str]:
    """Carry out the plan; returns what could not be repaired (one line each)."""
    from .epilog import EpilogRefused, execute_epilog

    failed: list[str] = list(plan.doubts)
    for job_id, actions in plan.orphans.items():
        try:
            execute_epilog(journals[job_id], actions, plan.problems.get(job_id, []), store, mps, killer)
        except EpilogRefused as exc:
            failed.append(str(exc))
    for action in plan.daemons:
        try:
            mps.quit(action.daemon)
        except GpushareError as exc:
            failed.append(str(exc))
        except OSError as exc:
            failed.append(f"MPS daemon {action.daemon.key}: {exc}")
    if plan.processes:
        from .procscan import key_uid, kill_scanned, mps_records, of_its_key, still_there

        wanted = {(a.pid, a.pipe_dir) for a in plan.processes}
        users = {key_uid(pipe) for _pid, pipe in wanted} - {None}
        # scanned again at the kill, and each signalled through a pidfd only while it is the process that scan
        # recorded (start time, executable): no reused pid is killed
        left = kill_scanned(
            lambda: [
                r for r in mps_records(users=users)[0].values() if (r["pid"], r["pipe"]) in wanted and of_its_key(r)
            ]
        )
        failed += [f"MPS process {r['pid']} survived SIGKILL" for r in left if still_there(r)]
    if plan.instances:
        import os

        from .perjob import destroy_unjournaled

        state_dir = os.path.dirname(store.dirname)
        failed += [
            w for a in plan.instances if (w := destroy_unjournaled(killer.backend, a.device, state_dir, plan.notes))
        ]
    for stray in plan.strays:
        try:
            Path(stray.path).unlink(missing_ok=True)
        except OSError as exc:
            failed.append(f"half-written file {stray.path} not removed: {exc.strerror}")
    return failed


def observe_reconcile(journals: dict[int, Journal], backend, proc_root: str = "/proc") -> ObservedState:
    """The GPUs the journals name, with processes and their jobs."""
    indexes = sorted({d.gpu_index for j in journals.values() for d in j.devices})
    gpus = observe_gpus(backend, indexes) if indexes else {}
    pids = sorted({p.pid for g in gpus.values() for p in g.processes})
    return ObservedState(gpus, journals, frozenset(), process_jobs(pids, proc_root))
