"""An MPS job's share of GPU memory as a kernel-enforced limit on the job's cgroup, where the driver offers it.

NVIDIA MPS applies its limits (active thread percentage, pinned device memory) to each client process,
not to a job: a job that starts more processes holds its share once per process
(docs/users/mps-isolation.md). NVIDIA's MPS v3 memory partitioning (driver r615+, CUDA 13.4, cgroup v2
at /sys/fs/cgroup, non-MIG GPUs) adds per-cgroup limits that the kernel enforces, set by root with
``nvmlDeviceSetMemoryLimits_v1`` on a cgroup path. Where the node offers them (``offered``: the backend
reports the function, the GPUs are out of MIG mode, cgroup v2 is mounted and Slurm's cgroup/v2 plugin
keeps its jobs under ``STEPD_SCOPE``), the prolog sets on each of the job's MPS GPUs a soft and a hard
limit of the job's share of that GPU's memory (``memory_mib * percentage // 100``) on the job's cgroup,
so the share holds however many processes the job starts. Where the driver lacks the function or a GPU
is in MIG mode nothing is attempted; where cgroup v2 or Slurm's scope is absent, one line says why.

Where the job's cgroup is, and when. With the rendered ``PrologFlags=Alloc,Contain`` the prolog runs at
allocation, outside of any cgroup (Slurm's Prolog and Epilog Guide), and Slurm makes the job's cgroup
only after it: slurmd's prolog RPC runs the Prolog and then spawns the extern step (``Contain``), whose
slurmstepd creates ``job_<id>`` (Slurm 23.11 to 26.05, slurmd ``_rpc_prolog``; cgroup/v2
``cgroup_p_step_create``). Waiting for it in the prolog would wait for a step that starts only once the
prolog has returned. So the prolog makes the job's cgroup itself, as that plugin makes it (``mkdir``
mode 0755 by root, under the scope the plugin made when slurmd started), and sets the limit on it; the
extern step's slurmstepd then takes the directory as it finds it (its ``mkdir`` accepts EEXIST, the same
code 23.11 to 26.05) and puts every process of the job below it. Not ``PrologFlags=RunInJob`` (24.05
and later; the product supports 23.11): the whole prolog would then run inside the extern step's
cgroup, and the MPS control daemon it starts, shared by the user's jobs, would be killed with the extern
step at the end of the job that started it. Not the task prolog: it runs as the job's user and the limit
is root's to set.

Root acts on the scope and on the job's cgroup only after ``lstat``: directories, not links, owned by
root; the job's directory is made through a descriptor of the scope. Where the node offers the limit
and it cannot be set (the scope or the job's cgroup is not a root-owned directory, it cannot be made,
NVML refuses), the job is refused, not run with per-process limits only and not by draining the node:
the prolog puts ``REFUSE_ENV`` with the reason in the job's task file and every task of the job fails
in the task prolog with a message in the job's output (``taskprolog``). The limit goes with the
cgroup: Slurm removes the job's cgroup when the job ends, and removing a cgroup clears its limits
(NVIDIA's nvmlSetMemoryLimits_v1_t), so the epilog has nothing to undo; a cgroup this prolog made is
removed again when the prolog fails after making it (``remove_made``).

``plan_memory_limits`` is pure; ``apply_memory_limits`` observes, plans and sets.
"""

from __future__ import annotations

import errno
import os
import stat

from ..atomic import entry_problem
from ..errors import GpushareError
from ..records import record
from .taskprolog import REFUSE_ENV

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_OWNER = 0  # slurmd (root) makes the scope and the job's cgroup; a test tree belongs to whoever runs the tests
STEPD_SCOPE = "system.slice/slurmstepd.scope"  # Slurm cgroup/v2 (cgroup_v2.shtml): the jobs' cgroups go below it
JOB_CGROUP = STEPD_SCOPE + "/job_{job_id}"
_VALUE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_=,./:-")

__all__ = ["REFUSE_ENV", "MemoryLimits", "SetMemoryLimit", "apply_memory_limits", "plan_memory_limits"]


@record
class SetMemoryLimit:
    gpu_index: int
    cgroup: str
    mib: int

    def __str__(self) -> str:
        return f"limit cgroup {self.cgroup} to {self.mib} MiB of GPU {self.gpu_index}"


@record
class MemoryLimits:
    """What the prolog does about an MPS job's memory share on its cgroup: the limits to set, or why none is set
    (``note``: the node does not offer them; ``refusal``: it does but they cannot be set, and the job is refused,
    with ``code`` the reason in the task file's terms); ``made``: the job's cgroup, when this run made it."""

    actions: tuple = ()
    note: str | None = None
    refusal: str | None = None
    code: str | None = None
    made: str | None = None


NOTHING = MemoryLimits()


def job_cgroup(job_id: int, root: str = CGROUP_ROOT) -> str:
    return f"{root.rstrip('/')}/{JOB_CGROUP.format(job_id=int(job_id))}"


def cgroup_problem(path: str, root: str = CGROUP_ROOT, owner: int | None = None) -> str | None:
    """Why root must not set a limit on ``path`` (None: it may): cgroup v2 mounted at ``root``, and the path a
    real directory owned by root, never followed through a link."""
    if not os.path.isfile(f"{root.rstrip('/')}/cgroup.controllers"):
        return f"no cgroup v2 mounted at {root} (no cgroup.controllers)"
    owner = CGROUP_OWNER if owner is None else owner
    return entry_problem(path, "directory", owner, "the job's cgroup")


def offered(root: str = CGROUP_ROOT) -> str | None:
    """Why this node puts no job in a cgroup v2 of Slurm's (None: it does): no cgroup v2 mounted at ``root``, or
    no scope of Slurm's cgroup/v2 plugin under it (Slurm runs without that plugin, or lays its cgroups out
    elsewhere)."""
    root = root.rstrip("/")
    if not os.path.isfile(f"{root}/cgroup.controllers"):
        return f"no cgroup v2 mounted at {root} (no cgroup.controllers)"
    if not os.path.lexists(f"{root}/{STEPD_SCOPE}"):
        return f"no Slurm cgroup/v2 scope {root}/{STEPD_SCOPE} (Slurm puts no job in a cgroup v2 here)"
    return None


def make_job_cgroup(job_id: int, root: str = CGROUP_ROOT, owner: int | None = None) -> tuple[str, bool, str | None]:
    """(the job's cgroup, whether this call made it, why root must not use it or None).

    The scope is opened without following a link and must be a directory of ``owner`` (root); the job's directory
    is made in it through that descriptor (mode 0755, as Slurm's cgroup/v2 plugin makes it), or taken as it is
    when it exists (a rerun of the prolog), then checked with lstat: a directory of ``owner``, not a link."""
    owner = CGROUP_OWNER if owner is None else owner
    path = job_cgroup(job_id, root)
    scope, name = path.rsplit("/", 1)
    problem = entry_problem(scope, "directory", owner, "Slurm's cgroup scope")
    if problem is not None:
        return path, False, problem
    try:
        fd = os.open(scope, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return path, False, f"Slurm's cgroup scope {scope} cannot be opened: {exc.strerror}"
    made = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
            return path, False, f"Slurm's cgroup scope {scope} changed while it was checked"
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
            made = True
            os.chmod(name, 0o755, dir_fd=fd)  # as Slurm makes it (its umask clears only group and other write)
        except FileExistsError:
            pass
        except OSError as exc:
            return (
                path,
                False,
                f"the job's cgroup {path} cannot be made: {exc.strerror or errno.errorcode.get(exc.errno or 0)}",
            )
    finally:
        os.close(fd)
    return path, made, entry_problem(path, "directory", owner, "the job's cgroup")


def remove_made(limits: MemoryLimits) -> str | None:
    """Remove the job's cgroup this prolog made (the prolog failed after making it); a note when it stays."""
    if limits.made is None:
        return None
    try:
        os.rmdir(limits.made)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"the job's cgroup {limits.made} made by this prolog stays: {exc.strerror}"
    return None


def refusal_value(code: str, cgroup: str) -> str:
    """The task file's ``REFUSE_ENV`` value: ``<code>:<cgroup>``, in the characters a task file line allows."""
    return "".join(c if c in _VALUE_SAFE else "_" for c in f"{code}:{cgroup}")


def _refused(job_id: int, code: str, cgroup: str, problem: str, made: str | None = None) -> MemoryLimits:
    return MemoryLimits(
        refusal=(
            f"job {job_id}: GPU memory limit not set: {problem}; the job is refused (its tasks fail "
            "in the task prolog) rather than run with MPS's per-process limits only"
        ),
        code=refusal_value(code, cgroup),
        made=made,
    )


def plan_memory_limits(
    job_id: int,
    mps_gpus,
    percentage: int | None,
    memory_mib: dict[int, int],
    supported: bool,
    cgroup: str,
    problem: str | None,
    absent: str | None = None,
    made: bool = False,
) -> MemoryLimits:
    """The limits to set (one per MPS GPU of the job), or why none, from what was observed: ``supported`` (the
    driver has the function, the GPUs are out of MIG mode), ``absent`` (why the node puts no job in a cgroup v2 of
    Slurm's, ``offered``), ``problem`` (why the job's cgroup cannot be used, ``make_job_cgroup``)."""
    if not mps_gpus or percentage is None or not supported:
        return NOTHING
    if absent is not None:
        return MemoryLimits(
            note=(
                f"job {job_id}: GPU memory limit not set: {absent}; the job's processes are held "
                "only by MPS's per-process limits"
            )
        )
    if problem is not None:
        return _refused(job_id, "cgroup-unusable", cgroup, problem, cgroup if made else None)
    actions = tuple(SetMemoryLimit(i, cgroup, memory_mib[i] * percentage // 100) for i in mps_gpus)
    return MemoryLimits(actions=actions, made=cgroup if made else None)


def apply_memory_limits(job, journal, live, backend, root: str | None = None) -> MemoryLimits:
    """Set the MPS job's memory share on its cgroup where the node offers it (see the module docstring).

    A refused NVML call refuses the job (``MemoryLimits.refusal``); reading the driver version is the backend's
    and fails the prolog as any NVML read does."""
    gpus = journal.mps.gpu_indexes if journal.mps is not None else ()
    if not gpus or job.mps_percentage is None:
        return NOTHING
    root = CGROUP_ROOT if root is None else root
    supported = backend.memory_limits_supported() and not any(live.gpus[i].mig_current for i in gpus)
    absent = offered(root) if supported else None
    cgroup, made, problem = job_cgroup(job.job_id, root), False, None
    if supported and absent is None:
        cgroup, made, problem = make_job_cgroup(job.job_id, root)
    memory = {i: live.gpus[i].memory_mib for i in gpus}
    plan = plan_memory_limits(job.job_id, gpus, job.mps_percentage, memory, supported, cgroup, problem, absent, made)
    try:
        for a in plan.actions:
            backend.set_memory_limit(a.gpu_index, a.cgroup, a.mib)
    except GpushareError as exc:
        return _refused(job.job_id, "nvml-refused", cgroup, str(exc), plan.made)
    return plan


def refusal_env(limits: MemoryLimits) -> dict[str, str]:
    """What the job's task file carries for a refused job (nothing otherwise)."""
    return {} if limits.code is None else {REFUSE_ENV: limits.code}
