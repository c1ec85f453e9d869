"""Epilog (root): undo exactly what the job's journal says the prolog did, then check the devices.

``plan_epilog(journal, live)`` is pure. Its actions, in order:

1. mark the journal ``ending`` (a crash from here on is finished by a rerun
   or by `gpushare node reconcile`);
2. kill the job's processes still on its devices: on its MIG devices and
   exclusive GPUs anything left is the job's or a stranger's; on shared
   (MPS, shard) GPUs only processes in the job's cgroup are the job's;
3. destroy the job's per-job MIG instances, compute then GPU instance
   (``perjob.DestroySlice``; skipped while a process of the job survived);
4. stop the job's MPS daemon if no other journal names it (the reference
   count is the journals themselves);
5. remove the journal.

A stranger's process on the job's MIG device or exclusive GPU, a process
that survives SIGKILL, or an MPS daemon that will not quit make the node
unsafe: the epilog then fails with one line (Slurm drains the node) and,
when an undo step itself failed, keeps the journal so a rerun can finish.
Without a journal there is nothing to undo: a second run is a no-op.
"""

from __future__ import annotations

import os
import re
import time

from ..errors import GpushareError
from ..records import record
from .journal import Journal, JournalStore, MpsDaemon
from .observed import NodeUnsafe, ObservedState, WriteJournal, observe_gpus
from .perjob import DestroySlice, destroy_slice, destroys

TYPE_CHECKING = False  # for type checkers only
if TYPE_CHECKING:
    import signal as _signal  # the same names, typed: the C module publishes no type information
else:
    import _signal  # the C module: signal's Python layer (its enums) costs each epilog ~3 M instructions

_JOB_CGROUP = re.compile(r"/job_([0-9]+)(/|$)")


class EpilogRefused(NodeUnsafe):
    """The node is not safe after the job; names each device and process."""


@record
class KillProcess:
    pid: int
    gpu_index: int
    where: str
    job_id: int | None = None  # the job whose cgroup held it when planned: killed only while it still does

    def __str__(self) -> str:
        return f"kill leftover process {self.pid} on {self.where}"


@record
class QuitMps:
    daemon: MpsDaemon

    def __str__(self) -> str:
        return f"stop MPS daemon {self.daemon.key} (last job using it)"


@record
class RemoveJournal:
    job_id: int

    def __str__(self) -> str:
        return f"remove journal of job {self.job_id}"


def _leftovers(journal: Journal, live: ObservedState, problems: list[str]) -> list[KillProcess]:
    kills: list[KillProcess] = []
    for dev in journal.devices:
        gpu = live.gpus.get(dev.gpu_index)
        if gpu is None:
            problems.append(f"GPU {dev.gpu_index} ({dev.gpu_uuid}) is no longer listed by NVML")
            continue
        if dev.is_mig or dev.per_job:
            procs = [p for p in gpu.processes if (p.gi_id, p.ci_id) == (dev.gi, dev.ci)]
            where = f"MIG device {dev.mig_uuid} on {gpu.label}"
        else:
            procs, where = list(gpu.processes), gpu.label
        shared = dev.is_shared
        for proc in procs:
            owner = live.proc_jobs.get(proc.pid)
            if owner == journal.job_id:
                kills.append(KillProcess(proc.pid, gpu.index, where, journal.job_id))
            elif not shared:
                who = "not on this node" if owner is None else ("of no job" if owner == 0 else f"of job {owner}")
                problems.append(f"{where} busy after the job: process {proc.pid} ({who})")
    return list(dict.fromkeys(kills))


def plan_epilog(journal: Journal | None, live: ObservedState) -> tuple[list, list[str]]:
    """(actions, problems). ``problems`` are reported after the undo, which goes ahead."""
    if journal is None:
        return [], []
    problems: list[str] = []
    actions: list = [WriteJournal(journal.with_state("ending"))]
    actions += _leftovers(journal, live, problems)
    actions += destroys(journal, live.journals)
    if journal.mps is not None:
        others = [
            j.job_id
            for j in live.journals.values()
            if j.job_id != journal.job_id and j.mps is not None and j.mps.key == journal.mps.key
        ]
        if not others:
            actions.append(QuitMps(journal.mps))
    actions.append(RemoveJournal(journal.job_id))
    return actions, problems


# ---- execution ---------------------------------------------------------------------------


class Killer:
    """Send SIGKILL and wait until NVML no longer lists the process. The pid was read when the epilog observed
    the node: it is killed only if it is still a process of the job (``kill_job_process``)."""

    def __init__(
        self, backend, wait: float = 10.0, kill=None, sleep=time.sleep, clock=time.monotonic, proc_root: str = "/proc"
    ):
        self.backend, self.wait, self._sleep, self._clock = backend, wait, sleep, clock
        self._kill, self.proc_root = kill, proc_root

    def __call__(self, action: KillProcess) -> str | None:
        if self._kill is not None:
            self._kill(action.pid)
        elif not kill_job_process(action.pid, action.job_id, self.proc_root):
            return None  # gone, or its pid is another process's now: nothing of the job's to kill
        deadline = self._clock() + self.wait
        while any(p.pid == action.pid for p in self.backend.processes(action.gpu_index)):
            if self._clock() > deadline:
                return f"process {action.pid} on {action.where} survived SIGKILL for {self.wait:g} s"
            self._sleep(0.2)
        return None


def kill_job_process(pid: int, job_id: int | None, proc_root: str = "/proc") -> bool:
    """SIGKILL ``pid`` if it is still in job ``job_id``'s cgroup (None: any process), checked after a pidfd pins
    it, so a pid reused meanwhile by another process is never signalled. Was a signal sent?"""
    from .procscan import signal_checked

    return signal_checked(
        pid, lambda: job_id is None or process_jobs([pid], proc_root).get(pid) == job_id, _signal.SIGKILL
    )


def execute_epilog(
    journal: Journal, actions, problems: list[str], store: JournalStore, mps, killer, destroy=None
) -> None:
    """Carry out the plan; raise EpilogRefused naming everything that is still wrong. ``destroy(device)``: destroys
    a per-job MIG device's instances, why not or None (default: ``perjob.destroy_slice`` on the killer's backend)."""
    failed: list[str] = []
    if destroy is None:
        state_dir = os.path.dirname(store.dirname)
        destroy = lambda device: destroy_slice(killer.backend, device, state_dir)  # noqa: E731
    for action in actions:
        match action:
            case WriteJournal(j):
                store.write(j)
            case KillProcess():
                why = killer(action)
                if why:
                    failed.append(why)
            case DestroySlice(device):
                why = destroy(device) if not failed else None  # not under a process that survived SIGKILL
                if why:
                    failed.append(why)
            case QuitMps(daemon):
                try:
                    mps.quit(daemon)
                except GpushareError as exc:
                    failed.append(str(exc))
            case RemoveJournal(job_id):
                if not failed:
                    store.remove(job_id)
            case _:
                raise TypeError(f"not an epilog action: {action!r}")
    if failed or problems:
        raise EpilogRefused(journal.job_id, journal.node, failed + problems)


def process_jobs(pids, proc_root: str = "/proc") -> dict[int, int | None]:
    """pid -> Slurm job id from its cgroup path (``.../job_<id>/...``), 0 outside any job, None if gone."""
    found: dict[int, int | None] = {}
    for pid in pids:
        try:
            with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            found[pid] = None
            continue
        m = _JOB_CGROUP.search(text)
        found[pid] = int(m[1]) if m else 0
    return found


def observe_epilog(journal: Journal, backend, store: JournalStore, proc_root: str = "/proc") -> ObservedState:
    gpus = observe_gpus(backend, sorted({d.gpu_index for d in journal.devices}))
    pids = {p.pid for g in gpus.values() for p in g.processes}
    return ObservedState(gpus, store.all(), frozenset(), process_jobs(sorted(pids), proc_root))
