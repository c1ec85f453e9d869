"""An MPS job's share of GPU memory as a kernel-enforced limit on the job's cgroup, where the driver offers it.

NVIDIA MPS applies its limits (active thread percentage, pinned device memory) to each client process,
not to a job: a job that starts more processes holds its share once per process
(docs/users/mps-isolation.md). NVIDIA's MPS v3 memory partitioning (driver r615+, CUDA 13.4, cgroup v2
at /sys/fs/cgroup, non-MIG GPUs) adds per-cgroup limits that the kernel enforces, set by root with
``nvmlDeviceSetMemoryLimits_v1`` on a cgroup path. Where the backend reports the function
(``memory_limits_supported``), the prolog sets on each of the job's MPS GPUs a soft and a hard limit
of the job's share of that GPU's memory (``memory_mib * percentage // 100``) on the job's cgroup, so
the share holds however many processes the job starts. Where it is absent, nothing is attempted.

The job's cgroup is where Slurm's cgroup/v2 plugin puts it (``JOB_CGROUP`` under the mount). Root
acts on it only after ``lstat``: a directory, not a link, owned by root, on a cgroup v2 mount. When
it is missing (the prolog ran before slurmstepd made it) or unsafe, no limit is set and the prolog
says so on stderr (slurmd's log); the per-process limits still apply. The limit goes with the cgroup:
Slurm removes the job's cgroup when the job ends, and removing a cgroup clears its limits
(NVIDIA's nvmlSetMemoryLimits_v1_t), so the epilog has nothing to undo.

``plan_memory_limits`` is pure; ``apply_memory_limits`` observes, plans and sets.
"""

from __future__ import annotations

import os

from ..atomic import entry_problem
from ..records import record

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_OWNER = 0  # slurmstepd (root) makes the job's cgroup; a test tree belongs to whoever runs the tests
JOB_CGROUP = "system.slice/slurmstepd.scope/job_{job_id}"  # Slurm cgroup/v2 (cgroup_v2.shtml)


@record
class SetMemoryLimit:
    gpu_index: int
    cgroup: str
    mib: int

    def __str__(self) -> str:
        return f"limit cgroup {self.cgroup} to {self.mib} MiB of GPU {self.gpu_index}"


def job_cgroup(job_id: int, root: str = CGROUP_ROOT) -> str:
    return f"{root.rstrip('/')}/{JOB_CGROUP.format(job_id=int(job_id))}"


def cgroup_problem(path: str, root: str = CGROUP_ROOT, owner: int | None = None) -> str | None:
    """Why root must not set a limit on ``path`` (None: it may): cgroup v2 mounted at ``root``, and the path a
    real directory owned by root, never followed through a link."""
    if not os.path.isfile(f"{root.rstrip('/')}/cgroup.controllers"):
        return f"no cgroup v2 mounted at {root} (no cgroup.controllers)"
    owner = CGROUP_OWNER if owner is None else owner
    return entry_problem(path, "directory", owner, "the job's cgroup")


def plan_memory_limits(job_id: int, mps_gpus, percentage: int | None, memory_mib: dict[int, int], supported: bool,
                       cgroup: str, problem: str | None) -> tuple[list[SetMemoryLimit], str | None]:
    """The limits to set (one per MPS GPU of the job) and a note for the log, from what was observed."""
    if not mps_gpus or percentage is None or not supported:
        return [], None
    if problem is not None:
        return [], (f"job {job_id}: GPU memory limit not set: {problem}; the job's processes are held only by "
                    "MPS's per-process limits")
    return [SetMemoryLimit(i, cgroup, memory_mib[i] * percentage // 100) for i in mps_gpus], None


def apply_memory_limits(job, journal, live, backend, root: str | None = None) -> str | None:
    """Set the MPS job's memory share on its cgroup where the driver can (see the module docstring).

    Returns a note for the log when it could but did not; a failed NVML call raises GpuError (the
    prolog fails: the job would otherwise run without the limit the node offers)."""
    gpus = journal.mps.gpu_indexes if journal.mps is not None else ()
    if not gpus or job.mps_percentage is None:
        return None
    root = CGROUP_ROOT if root is None else root
    supported = backend.memory_limits_supported() and not any(live.gpus[i].mig_current for i in gpus)
    cgroup = job_cgroup(job.job_id, root)
    problem = cgroup_problem(cgroup, root) if supported else None
    memory = {i: live.gpus[i].memory_mib for i in gpus}
    actions, note = plan_memory_limits(job.job_id, gpus, job.mps_percentage, memory, supported, cgroup, problem)
    for a in actions:
        backend.set_memory_limit(a.gpu_index, a.cgroup, a.mib)
    return note
