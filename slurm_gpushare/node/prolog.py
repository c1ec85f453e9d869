"""Prolog (root, once per job and node): check what the job got, set up MPS, write the journal.

``observe_prolog`` reads what planning needs (the job's GPUs through the
backend, the journals, which MPS daemons answer); ``plan_prolog`` is pure:
job + node layout + live state in, the journal and the actions out, or
``PrologRefused`` with every reason the node is not safe for the job;
``execute_prolog`` carries the actions out and rolls them back if one fails.

Per GRES index Slurm allocated (see ``gresindex`` for how the index maps to
device files, observed on the cluster):

- MIG (a MultipleFiles record): the GI/CI its capability files name must
  exist on that GPU (else the layout drifted from gres.conf) and be idle;
  the journal records its MIG UUID for CUDA_VISIBLE_DEVICES.
- exclusive, or the whole of an MPS/shard GPU: the GPU must be idle (no
  compute processes, no MPS daemon of a running job).
- shard: nothing to check; Slurm's index is right for the job.
- per-job MIG (a GPU whose instances are made per job): the device is
  planned with the profile the job's SLURM_JOB_EXTRA records, or, for a job
  without a record (it holds the GPU whole), the model's full profile;
  ``node.perjob`` places and makes the instance (or refuses the job, never
  the node) before the journal is written ready.
- MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set): an MPS control daemon for
  these GPUs, this user and this percentage (``mps`` module), started unless
  one answers already, with the pinned device memory limit the same share
  of each GPU's memory as the thread percentage.

The GPU's compute mode decides whether a daemon's server can start at all
(``plan_compute_mode``): PROHIBITED lets none; EXCLUSIVE_PROCESS one process,
so one MPS server (one daemon) per GPU at a time, refused when another
daemon already holds the GPU (Slurm let a second user on: the partition
lacks ExclusiveUser=YES). In EXCLUSIVE_PROCESS one user's jobs therefore
share one daemon per GPU set at 100 % whatever their percentages, and each
job's limits are its client-side CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (they only bind the same user's jobs: no
other user can be on the GPU). DEFAULT: one daemon per percentage, as above.

Re-running for a job is safe: the plan is computed afresh, a daemon that
answers is reused, the journal rewritten with the same content.
"""

from __future__ import annotations

import os
import re

from ..errors import GpushareError
from ..policy.share import Mode, Share
from ..records import field, record, replace
from .gresindex import GresRecord
from .jobenv import JobEnv
from .journal import Device, Journal, JournalStore, MpsDaemon
from .mps import check_paths, daemon_key
from .nodeconfig import NodeSpec
from .observed import NodeUnsafe, ObservedGpu, ObservedState, WriteJournal, observe_gpus

_GPU_FILE = re.compile(r"^/dev/nvidia([0-9]+)$")
_CAP_FILE = re.compile(r"^/dev/nvidia-caps/nvidia-cap([0-9]+)$")


class PrologRefused(NodeUnsafe):
    """The node cannot be made safe for this job."""


# ---- inputs ------------------------------------------------------------------------


@record
class NodeLayout:
    """What the node is meant to be: the policy's GPU shares (node spec), Slurm's gpu
    records (gres.conf order), the mig-minors table reversed (minor -> key), each GPU's model (catalogue name)."""

    node: str
    shares: dict[int, Share]
    records: tuple[GresRecord, ...]
    cap_minors: dict[int, tuple[int, int, int | None]]
    state_dir: str
    log_dir: str
    models: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: NodeSpec, records, minors: dict) -> NodeLayout:
        return cls(
            spec.node,
            {g.index: g.share for g in spec.gpus},
            tuple(records),
            {minor: key for key, minor in minors.items()},
            spec.state_dir,
            spec.log_dir,
            {g.index: g.model for g in spec.gpus},
        )


def gpus_of_records(records, indexes, minors_by_gpu: dict[int, int]) -> list[int]:
    """NVML indexes of the GPUs the allocated records name (unknown files are left to the planner)."""
    found = []
    for i in indexes:
        if i < len(records):
            for f in records[i].files:
                m = _GPU_FILE.match(f)
                if m and int(m[1]) in minors_by_gpu and minors_by_gpu[int(m[1])] not in found:
                    found.append(minors_by_gpu[int(m[1])])
    return found


# ---- actions -----------------------------------------------------------------------


@record
class StartMps:
    daemon: MpsDaemon

    def __str__(self) -> str:
        return f"start MPS daemon {self.daemon.key} (pipe {self.daemon.pipe_dir})"


@record
class StopMps:
    daemon: MpsDaemon

    def __str__(self) -> str:
        return f"stop MPS daemon {self.daemon.key}"


# ---- planning (pure) ----------------------------------------------------------------


def _resolve(record: GresRecord, node: NodeLayout, live: ObservedState, reasons: list[str]):
    """(GPU, MIG device or None) that a gres record's files name, or None with a reason."""
    gpu_minors = [int(m[1]) for m in map(_GPU_FILE.match, record.files) if m]
    caps = [int(m[1]) for m in map(_CAP_FILE.match, record.files) if m]
    if len(gpu_minors) != 1 or len(gpu_minors) + len(caps) != len(record.files) or len(caps) not in (0, 2):
        reasons.append(
            f"GRES index {record.index} ({record.source}): files {','.join(record.files) or '(none)'} are "
            "not /dev/nvidiaN, or /dev/nvidiaN plus a GI and a CI capability"
        )
        return None
    gpu = live.by_minor(gpu_minors[0])
    if gpu is None:
        reasons.append(
            f"GRES index {record.index}: /dev/nvidia{gpu_minors[0]} is no GPU NVML lists (minors "
            f"{', '.join(str(g.minor) for g in live.gpus.values()) or 'none'})"
        )
        return None
    if not caps:
        return gpu, None
    keys = [node.cap_minors.get(c) for c in caps]
    gi_key = next((k for k in keys if k is not None and k[2] is None), None)
    ci_key = next((k for k in keys if k is not None and k[2] is not None), None)
    if gi_key is None or ci_key is None or gi_key[:2] != ci_key[:2] or gi_key[0] != gpu.minor:
        reasons.append(
            f"GRES index {record.index}: nvidia-cap{caps[0]}, nvidia-cap{caps[1]} are not the GI and CI "
            f"access capabilities of one GPU instance on /dev/nvidia{gpu.minor} (mig-minors)"
        )
        return None
    mig = next((d for d in gpu.mig_devices if (d.gi_id, d.ci_id) == (gi_key[1], ci_key[2])), None)
    if mig is None:
        reasons.append(
            f"{gpu.label}: GRES index {record.index} is GPU instance {gi_key[1]} compute instance "
            f"{ci_key[2]}, which does not exist: the MIG layout drifted from gres.conf "
            "(`gpushare node relayout`)"
        )
        return None
    return gpu, mig


def _busy(what: str, procs, reasons: list[str]) -> None:
    if procs:
        reasons.append(f"{what} is busy before the job starts: processes {', '.join(str(p.pid) for p in procs)}")


def _device(job: JobEnv, index: int, node: NodeLayout, live: ObservedState, reasons: list[str]) -> Device | None:
    if index >= len(node.records):
        reasons.append(f"GRES index {index}: gres.conf declares only {len(node.records)} gpu record(s) for {node.node}")
        return None
    resolved = _resolve(node.records[index], node, live, reasons)
    if resolved is None:
        return None
    gpu, mig = resolved
    share = node.shares.get(gpu.index)
    if share is None:
        reasons.append(f"{gpu.label}: not in the policy for {node.node}")
        return None
    mode = share.mode.value
    if share.is_per_job_mig and mig is None:
        # a per-job slice, made for the job beside its neighbours (node.perjob), so their processes are no reason;
        # a job without a record holds the GPU whole and gets its full instance, made the same way
        from .perjob import planned

        device = Device(index, gpu.index, gpu.uuid, mode, minor=gpu.minor)
        return planned(device, job.mig_profile, node.models.get(gpu.index, ""))
    if (mig is not None) != share.is_mig:
        reasons.append(
            f"{gpu.label}: gres.conf declares it {'as MIG instances' if mig else 'whole'} but the policy "
            f"shares it as {mode}: regenerate gres.conf (`gpushare node gres-conf`)"
        )
        return None
    if mig is not None:
        _busy(
            f"MIG device {mig.uuid} ({gpu.label}, GI {mig.gi_id} CI {mig.ci_id})",
            [p for p in gpu.processes if (p.gi_id, p.ci_id) == (mig.gi_id, mig.ci_id)],
            reasons,
        )
        return Device(
            index, gpu.index, gpu.uuid, mode, mig.uuid, mig.gi_id, mig.ci_id, visible=mig.uuid, minor=gpu.minor
        )
    if share.mode is Mode.MPS and job.mps_percentage is not None:
        return Device(index, gpu.index, gpu.uuid, mode, visible=gpu.uuid)
    if share.mode is Mode.SHARD:
        return Device(index, gpu.index, gpu.uuid, mode)
    # exclusive, or a whole GPU of an MPS/shard GPU: nobody else may be on it
    _busy(gpu.label, gpu.processes, reasons)
    users = sorted(
        j.job_id
        for j in live.journals.values()
        if j.job_id != job.job_id and any(d.gpu_index == gpu.index for d in j.devices)
    )
    if users:
        reasons.append(f"{gpu.label}: allocated whole but jobs {', '.join(map(str, users))} still hold it")
    return Device(index, gpu.index, gpu.uuid, f"{mode}-whole" if share.shared_gres else mode)


def exclusive_process(live: ObservedState, indexes) -> bool:
    """Does any of these GPUs run in EXCLUSIVE_PROCESS (one MPS server at a time)?"""
    return any(live.gpus[i].compute_mode == "EXCLUSIVE_PROCESS" for i in indexes if i in live.gpus)


def daemon_percentage(live: ObservedState, indexes, percentage: int) -> int:
    """The daemon's default thread percentage: the job's, or 100 where one daemon per GPU must serve all of the
    user's jobs (EXCLUSIVE_PROCESS); the job's own share is then its client-side limit."""
    return 100 if exclusive_process(live, indexes) else percentage


def plan_compute_mode(
    job: JobEnv, key: str, indexes, node: NodeLayout, live: ObservedState, reasons: list[str]
) -> None:
    """Can the daemon ``key``'s server start on these GPUs? PROHIBITED: no server; EXCLUSIVE_PROCESS: not while
    another daemon (of a running job) holds the GPU. Unread modes (None) are not judged."""
    for i in indexes:
        gpu = live.gpus[i]
        mode = gpu.compute_mode
        if mode in ("PROHIBITED", "EXCLUSIVE_THREAD"):
            reasons.append(
                f"{gpu.label} on {node.node}: compute mode {mode} lets no MPS server start; set DEFAULT "
                f"or EXCLUSIVE_PROCESS as the policy's compute_mode says (nvidia-smi -i {i} -c DEFAULT)"
            )
        elif mode == "EXCLUSIVE_PROCESS":
            holders = sorted(
                {
                    (j.mps.key, j.mps.uid, j.job_id)
                    for j in live.journals.values()
                    if j.job_id != job.job_id
                    and j.mps is not None
                    and j.mps.key != key
                    and i in j.mps.gpu_indexes
                    and j.mps.key in live.mps_alive
                }
            )
            if holders:
                named = ", ".join(f"MPS daemon {k} (uid {u}, job {jid})" for k, u, jid in holders)
                reasons.append(
                    f"{gpu.label} on {node.node}: compute mode EXCLUSIVE_PROCESS allows one MPS server and "
                    f"{named} holds it, so the server for uid {job.uid} cannot start: keep the GPU to one "
                    "user at a time (policy compute_mode: exclusive_process renders ExclusiveUser=YES on "
                    f"the partitions of {node.node}) or set the GPU to DEFAULT (nvidia-smi -i {i} -c DEFAULT)"
                )


def _mps_daemon(job: JobEnv, devices: list[Device], node: NodeLayout, live: ObservedState, reasons) -> MpsDaemon | None:
    mps = [d for d in devices if d.is_mps]
    if not mps or job.mps_percentage is None:  # a GPU is planned as MPS only for a job with a percentage
        return None
    indexes = tuple(sorted({d.gpu_index for d in mps}))
    pct = daemon_percentage(live, indexes, job.mps_percentage)
    key = daemon_key(indexes, job.uid, pct)
    plan_compute_mode(job, key, indexes, node, live, reasons)
    daemon = MpsDaemon(
        key=key,
        gpu_indexes=indexes,
        gpu_uuids=tuple(live.gpus[i].uuid for i in indexes),
        uid=job.uid,
        gid=job.gid,
        percentage=pct,
        mem_limit_mib=client_mem_limits(node, live, indexes, pct),
        pipe_dir=f"{node.state_dir.rstrip('/')}/mps/{key}/pipe",
        log_dir=f"{node.log_dir.rstrip('/')}/gpushare-mps/{key}",
    )
    problem = check_paths(daemon)
    if problem:
        reasons.append(problem)
    return daemon


def client_mem_limits(node: NodeLayout, live: ObservedState, indexes, percentage: int) -> tuple[int, ...]:
    """Each GPU's pinned device memory limit (MiB) for a client at ``percentage``: that share of the GPU's memory,
    at most the policy's ``client_mem_limit_mib`` for the GPU where it gives one."""
    out = []
    for i in indexes:
        limit = live.gpus[i].memory_mib * percentage // 100
        cap = node.shares[i].client_mem_limit_mib if i in node.shares else 0
        out.append(min(limit, cap) if cap else limit)
    return tuple(out)


def mps_env(daemon: MpsDaemon, percentage: int | None = None, limits: tuple[int, ...] = ()) -> dict[str, str]:
    """What the job's tasks need to reach their daemon, in their own terms: the daemon's limits, or the job's own
    ``percentage`` and ``limits`` (``client_mem_limits``) where it shares a daemon at 100 % (EXCLUSIVE_PROCESS)."""
    pct = daemon.percentage if percentage is None else percentage
    limits = daemon.mem_limit_mib if percentage is None else limits
    return {
        "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct),
        # client side, CUDA_VISIBLE_DEVICES syntax with =limit (NVIDIA MPS docs, "Environment Variables"): the
        # daemon's GPU ordinals
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{i}={mib}MB" for i, mib in enumerate(limits)),
    }


def plan_prolog(job: JobEnv, node: NodeLayout, live: ObservedState) -> tuple[Journal, list]:
    """The journal this job gets and the actions that set it up; PrologRefused if unsafe."""
    reasons: list[str] = []
    if job.node != node.node:
        reasons.append(f"SLURMD_NODENAME is {job.node} but this node's spec is for {node.node}")
    devices = [d for d in (_device(job, i, node, live, reasons) for i in job.gpu_indexes) if d is not None]
    if job.mps_percentage is not None and not any(d.is_mps for d in devices) and not reasons:
        reasons.append(
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={job.mps_percentage} but none of GRES indexes "
            f"{','.join(map(str, job.gpu_indexes)) or '(none)'} is an MPS GPU in the policy"
        )
    daemon = _mps_daemon(job, devices, node, live, reasons)
    if reasons:
        raise PrologRefused(job.job_id, job.node, reasons)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if devices else {}
    pct = job.mps_percentage  # not None where there is a daemon
    if daemon is not None and pct is not None and daemon.percentage != pct:  # shared at 100 % (EXCLUSIVE_PROCESS)
        env.update(mps_env(daemon, pct, client_mem_limits(node, live, daemon.gpu_indexes, pct)))
    elif daemon is not None:
        env.update(mps_env(daemon))
    journal = Journal(job.job_id, job.uid, job.gid, job.node, "ready", tuple(devices), daemon, env, job.start_time)
    actions: list = [WriteJournal(journal.with_state("preparing"))]
    if daemon is not None and daemon.key not in live.mps_alive:
        actions.append(StartMps(daemon))
    previous = live.journals.get(job.job_id)
    if previous is not None and previous.mps is not None and (daemon is None or previous.mps.key != daemon.key):
        if not any(j.mps and j.mps.key == previous.mps.key for j in live.journals.values() if j.job_id != job.job_id):
            actions.append(StopMps(previous.mps))
    actions.append(WriteJournal(journal))
    return journal, actions


def with_env(journal: Journal, actions: list, extra: dict[str, str]) -> tuple[Journal, list]:
    """The plan with ``extra`` added to the journal's task environment (a job the memory limit refused:
    ``mpsmem.refusal_env``), in the journal and in every journal the actions write."""
    if not extra:
        return journal, actions
    env = {**journal.env, **extra}
    out = [WriteJournal(replace(a.journal, env=env)) if isinstance(a, WriteJournal) else a for a in actions]
    return replace(journal, env=env), out


NO_ROOM_CODE = "mps-dir-full"  # the task file's refusal code for a job whose MPS pipe directory found no room


def no_room(exc: BaseException, mps_dir: str) -> str | None:
    """Why starting the job's MPS daemon failed for want of room where the pipe directories live (``<state_dir>/mps``,
    a size-capped tmpfs another job's writes can fill: an ENOSPC or EDQUOT in the failure's chain, or no free
    block or inode there now), or None for any other failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (28, 122):  # ENOSPC, EDQUOT
            return f"{seen.filename or mps_dir}: {seen.strerror}"
        seen = seen.__cause__ or seen.__context__
    try:
        room = os.statvfs(mps_dir)
    except OSError:
        return None
    if room.f_bavail == 0 or (room.f_files and room.f_favail == 0):
        return f"{mps_dir}: no free {'blocks' if room.f_bavail == 0 else 'inodes'}"
    return None


def refused_journal(journal: Journal, code: str, why: str) -> Journal:
    """The journal of a job the prolog refuses without draining the node: no MPS daemon, and a task file whose
    ``REFUSE_ENV`` line makes every task fail with ``why`` in the job's output (``taskprolog``)."""
    from .taskprolog import REFUSE_ENV, refusal_text

    return replace(journal, state="ready", mps=None, env={REFUSE_ENV: refusal_text(code, why)})


# ---- execution -------------------------------------------------------------------------


def execute_prolog(actions, store: JournalStore, mps) -> None:
    """Carry out the plan; on a failure, undo what this run started and remove the journal."""
    started: list[MpsDaemon] = []
    journal = None
    try:
        for action in actions:
            match action:
                case WriteJournal(j):
                    journal = j
                    store.write(j)
                case StartMps(daemon):
                    mps.prepare_dirs(daemon)
                    started.append(daemon)
                    try:
                        mps.start(daemon)
                    except GpushareError:
                        if mps.alive(daemon):
                            raise
                        # the daemon died while it started (killed, crashed): what it left goes with its pipe
                        # dir (prepare_dirs kills it), and one fresh start; a second failure fails the prolog
                        mps.prepare_dirs(daemon)
                        mps.start(daemon)
                case StopMps(daemon):
                    mps.quit(daemon)
                case _:
                    raise TypeError(f"not a prolog action: {action!r}")
    except BaseException:
        _rollback(started, journal, store, mps)
        raise


def _rollback(started, journal, store: JournalStore, mps) -> None:
    for daemon in started:
        try:
            mps.quit(daemon)
        except GpushareError:
            return  # keep the journal: reconcile (or the epilog) must still stop it
    if journal is not None:
        store.remove(journal.job_id)


def observe_prolog(job: JobEnv, node: NodeLayout, backend, store: JournalStore, mps) -> ObservedState:
    """Read only what this job's plan needs: its GPUs, the journals, the MPS daemons they name."""
    infos = backend.gpus()
    by_minor = {g.minor: g.index for g in infos}
    indexes = gpus_of_records(node.records, job.gpu_indexes, by_minor)
    gpus = {i: g for i, g in observe_gpus(backend, indexes).items()}
    mps_gpus = (
        [i for i in indexes if node.shares.get(i, Share()).mode is Mode.MPS] if job.mps_percentage is not None else []
    )
    for i in mps_gpus:  # what lets a server start: only MPS prologs read it
        gpus[i] = replace(gpus[i], compute_mode=backend.compute_mode(i))
    for info in infos:  # the rest without MIG and processes: only minors and UUIDs are needed
        gpus.setdefault(info.index, ObservedGpu(info.index, info.uuid, info.minor, info.memory_mib, info.mig_current))
    journals = store.all()
    daemons = {j.mps.key: j.mps for j in journals.values() if j.mps}
    if job.mps_percentage is not None:
        key = daemon_key(
            tuple(sorted(mps_gpus)), job.uid, daemon_percentage(ObservedState(gpus), mps_gpus, job.mps_percentage)
        )
        daemons.setdefault(
            key,
            MpsDaemon(
                key,
                (),
                (),
                job.uid,
                job.gid,
                job.mps_percentage,
                (),
                f"{node.state_dir.rstrip('/')}/mps/{key}/pipe",
                "",
            ),
        )
    alive = frozenset(k for k, d in daemons.items() if mps.alive(d))
    return ObservedState(gpus, journals, alive)


def load_layout(spec: NodeSpec, backend) -> NodeLayout:
    """The node layout from the spec, this node's gres.conf and the mig-minors table."""
    from ..gpu.migminors import read_mig_minors
    from .gresindex import gpu_records

    records = gpu_records(os.path.join(spec.slurm_conf_dir, "gres.conf"), spec.node)
    needs_minors = any(len(r.files) > 1 for r in records)
    caps = frozenset(int(m[1]) for r in records for m in map(_CAP_FILE.match, r.files) if m)
    minors = read_mig_minors(backend.mig_minors_path, only=caps) if needs_minors else {}  # the table checked whole
    return NodeLayout.from_spec(spec, records, minors)
