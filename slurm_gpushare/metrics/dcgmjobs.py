"""dcgm-exporter's HPC job mapping directory: which Slurm jobs run on which GPU of this node.

What dcgm-exporter reads (NVIDIA/dcgm-exporter at d5e5f51, May 2026; read, not copied):

- The directory: flag ``--hpc-job-mapping-dir``, environment variable
  ``DCGM_HPC_JOB_MAPPING_DIR`` (pkg/cmd/app.go, ``CLIHPCJobMappingDir``); no
  default: empty means off (internal/pkg/transformation/transformer.go adds the
  ``hpcMapper`` only when it is set). A missing directory is logged and ignored.
- It re-reads the directory on every scrape (transformation/hpc.go,
  ``hpcMapper.Process``): every regular file whose name matches
  ``^\\d+(\\.\\d+)?$`` (``validGPUFile``); others (``.lock``, ``.0.tmp``...) are skipped.
- File name: the GPU's id as dcgm-exporter's ``gpu`` label says it (``Metric.GPU``
  from ``DeviceInfo.GPU``, DCGM's GPU id: collector/base_collector.go; we write
  NVML's index, assuming DCGM numbers GPUs in NVML's order, as it does by
  default), or for a MIG instance
  ``<gpu>.<gpu instance id>`` (``GPU_I_ID``, NVML's GPU instance id): a metric
  with a MIG profile is looked up under ``gpu.gi`` only, a whole-GPU metric under
  ``gpu`` (hpc.go, ``jobMapKey``). No compute-instance id: one file per GPU instance.
  The exposition labels a MIG instance's metrics ``gpu``, ``GPU_I_ID``,
  ``GPU_I_PROFILE`` and ``hostname`` (internal/pkg/rendermetrics/render_metrics.go).
- Content: job ids, one per line (``bufio.Scanner`` lines taken as they are: a
  blank line would become an empty job id). Several lines: each metric of that
  device is repeated once per job with an ``hpc_job`` label (README.md, "How to
  include HPC jobs in metric labels"; const.go ``hpcJobAttribute``).
- MIG: supported only since release 4.5.3-4.8.2 (commit 2623f7a, "Add MIG device
  support for hpc labels", #602, April 2026). Before it, file names had to be
  plain integers (``strconv.Atoi``): ``gpu.gi`` files are ignored and MIG
  metrics were looked up under the parent GPU's file, so older exporters cannot
  tell a node's MIG instances' jobs apart.

What gpushare writes: for each device a job holds, its job id in ``<gpu index>``
(whole GPU, shard, MPS: several job ids when jobs share the GPU) or
``<gpu index>.<GI id>`` (a MIG instance), never in the parent GPU's file for a MIG
instance (an old exporter would otherwise label every instance with every job).
The prolog adds, the epilog removes, `gpushare node reconcile` rewrites the
directory from the journals of the jobs Slurm still runs here. Each file is
written atomically (temporary ``.<name>.XXXX`` then rename) under an flock of
``<dir>/.lock``; a file left with no job is removed. Where dcgm-exporter cannot
name MIG instances, the textfile metric ``gpushare_node_job_gpu_info`` (``textfile``)
carries the same mapping with the MIG UUID and the GI/CI ids, for a join.

Standard library and ``atomic`` only: the hooks import this on every job.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..atomic import atomic_write, flocked

LOCK_NAME = ".lock"
_FILE = re.compile(r"^[0-9]+(\.[0-9]+)?$")  # what dcgm-exporter reads (validGPUFile)
_JOB = re.compile(r"^[1-9][0-9]*$")


def file_name(device) -> str:
    """``<gpu index>`` or ``<gpu index>.<GI id>`` for a journal device (``node.journal.Device``-like)."""
    if device.mig_uuid is not None and device.gi is not None:
        return f"{device.gpu_index}.{device.gi}"
    return str(device.gpu_index)


def wanted(journals) -> dict[str, set[int]]:
    """file name -> job ids, from journals (``node.journal.Journal``-like: job_id, devices)."""
    files: dict[str, set[int]] = {}
    for journal in journals:
        for device in journal.devices:
            files.setdefault(file_name(device), set()).add(int(journal.job_id))
    return files


def read_dir(directory) -> dict[str, set[int]]:
    """What the directory says now: file name -> job ids (lines that are not job ids are dropped)."""
    found: dict[str, set[int]] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        if not _FILE.match(name):
            continue
        text = _read_regular(os.path.join(directory, name))
        if text is None:
            continue
        found[name] = {int(line.strip()) for line in text.splitlines() if _JOB.match(line.strip())}
    return found


def _read_regular(path: str) -> str | None:
    """A regular file's text, opened without following a link or blocking on a FIFO; None for anything else."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # gone, a directory, a link (ELOOP)
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fh.read(1 << 20).decode("utf-8", "replace")


def _locked(directory: Path):
    from .textfile import open_dir

    os.close(open_dir(directory))  # no link on its path, root's, only root may write in it (else UnsafeDir)
    return flocked(directory / LOCK_NAME)


def _write(directory: Path, name: str, jobs: set[int]) -> None:
    path = directory / name
    if jobs:
        atomic_write(path, "".join(f"{j}\n" for j in sorted(jobs)), 0o644)
    else:
        path.unlink(missing_ok=True)


def _apply(directory: Path, before: dict[str, set[int]], after: dict[str, set[int]]) -> list[str]:
    changed = sorted(n for n in set(before) | set(after) if before.get(n, set()) != after.get(n, set()))
    for name in changed:
        _write(directory, name, after.get(name, set()))
    return changed


def add_job(directory, journal) -> list[str]:
    """Add the job's id to the file of each device it holds (idempotent); returns the files changed."""
    directory = Path(directory)
    with _locked(directory):
        before = read_dir(directory)
        after = {n: set(j) for n, j in before.items()}
        for name, jobs in wanted([journal]).items():
            after.setdefault(name, set()).update(jobs)
        return _apply(directory, before, after)


def remove_job(directory, job_id: int) -> list[str]:
    """Remove the job's id from every file (idempotent: a second call changes nothing)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    with _locked(directory):
        before = read_dir(directory)
        after = {n: j - {int(job_id)} for n, j in before.items()}
        return _apply(directory, before, after)


def repair(directory, journals, running: set[int], dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Make the directory list exactly the running jobs' devices from their journals.

    Returns (lines saying what was removed, lines saying what was added); with
    ``dry_run`` the lines only."""
    directory = Path(directory)
    if dry_run and not directory.is_dir():
        return [], [
            f"dcgm job mapping {directory / n}: added job(s) {', '.join(map(str, sorted(j)))}"
            for n, j in sorted(wanted([j for j in journals if int(j.job_id) in running]).items())
        ]
    with _locked(directory):
        before = read_dir(directory)
        after = wanted([j for j in journals if int(j.job_id) in running])
        removed = [
            f"dcgm job mapping {directory / n}: removed job(s) {', '.join(map(str, sorted(j - after.get(n, set()))))}"
            for n, j in sorted(before.items())
            if j - after.get(n, set())
        ]
        added = [
            f"dcgm job mapping {directory / n}: added job(s) {', '.join(map(str, sorted(j - before.get(n, set()))))}"
            for n, j in sorted(after.items())
            if j - before.get(n, set())
        ]
        if not dry_run:
            _apply(directory, before, after)
    return removed, added
