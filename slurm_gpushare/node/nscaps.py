"""A per-job MIG job's own /dev/nvidia-caps, in its mount namespace (``isolation: namespace``).

Slurm's device cgroup lets through every device file gres.conf does not list,
and a per-job GPU is listed whole (``File=/dev/nvidiaN``), so a job could open
its neighbours' GPU- and compute-instance capability files, and nvidia-modprobe
(setuid) resets their modes: file permissions are no boundary. Slurm's
job_container/tmpfs (namespace/tmpfs from 25.11) gives each job a mount
namespace and runs ``CloneNSScript`` (``gpushare-ns-caps``) as root after the
Prolog, with ``SLURM_NS`` naming that namespace. Inside it the hook mounts a
tmpfs on /dev/nvidia-caps, makes only the job's own capability nodes (their
minors from the mig-minors table, the instances from the job's journal), and
remounts it read-only, so the job cannot see, open or make another node there.
A job with no isolated per-job device keeps the node's /dev/nvidia-caps.

Observe (the journal, the table, the major), plan (pure: ``plan_caps``,
``commands``), execute (``execute``): every command through ``proc`` with an
argument list (``nsenter --mount=<SLURM_NS> -- mount|mknod ...``); a failure
after the tmpfs is mounted unmounts it before the error is raised, so no
half-built directory is left; the hook then fails the job, never the node.
"""

from __future__ import annotations

import os
import re
import stat

from ..errors import GpushareError
from ..records import record

TYPE_CHECKING = False  # typing costs the hook milliseconds at start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..gpu.migminors import MinorKey
    from ..policy.share import Share
    from .journal import Journal

CAPS_DIR = "/dev/nvidia-caps"
CAP_MODE = "0444"  # the driver's own mode for GI and CI access capabilities (DeviceFileMode 292)
# nosuid, noexec: nothing but device nodes belongs here; no nodev, or the nodes would not open. 64 KiB is room
# for a few hundred nodes (a tmpfs takes no memory until written).
TMPFS_OPTIONS = "mode=0755,nosuid,noexec,size=64k"
TMPFS_SOURCE = "gpushare-caps"  # the mount's source name, which /proc/self/mountinfo shows
NS_ENV = "SLURM_NS"
_NS_PATH = re.compile(r"^(/[A-Za-z0-9_.+%@:-]+)+$")


class NsCapsError(GpushareError):
    """The job's private /dev/nvidia-caps could not be made; the message names the job and why."""

    exit_code = 1


@record
class CapNode:
    """One capability file the job gets: its minor and what it grants (for messages)."""

    minor: int
    what: str

    @property
    def path(self) -> str:
        return f"{CAPS_DIR}/nvidia-cap{self.minor}"


def ns_file(environ: Mapping[str, str]) -> str:
    """The job's mount namespace file Slurm names in SLURM_NS, checked: an absolute path of plain names, no
    ``..``, not a symbolic link (nsenter then refuses anything that is not a mount namespace)."""
    value = environ.get(NS_ENV, "")
    if not value:
        raise NsCapsError(f"{NS_ENV} is not set: this runs as job_container.conf's CloneNSScript")
    if not _NS_PATH.match(value) or "/../" in value + "/" or "/./" in value + "/":
        raise NsCapsError(f"{NS_ENV}={value[:80]!r} is not an absolute path of plain names")
    try:
        info = os.lstat(value)
    except OSError as exc:
        raise NsCapsError(f"{NS_ENV}={value}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode):
        raise NsCapsError(f"{NS_ENV}={value} is a {'link' if stat.S_ISLNK(info.st_mode) else 'directory'}")
    return value


def needs_isolation(journal: Journal, shares: Mapping[int, Share]) -> bool:
    """Whether the job holds a per-job MIG device on a GPU whose share isolates its jobs."""
    return any(d.per_job and d.gpu_index in shares and shares[d.gpu_index].isolated for d in journal.devices)


def plan_caps(job_id: int, journal: Journal, table: Mapping[MinorKey, int]) -> list[CapNode]:
    """The capability files of every MIG instance the job's journal holds (per-job or fixed): each instance's GI
    and CI access capabilities, by the mig-minors ``table``. A per-job device not made (refused: its task
    prolog fails the job with the reason) has none."""
    nodes: list[CapNode] = []
    for dev in journal.devices:
        if dev.gi is None or dev.ci is None:
            continue
        what = f"GPU {dev.gpu_index} GI {dev.gi}"
        if dev.minor is None:
            raise NsCapsError(
                f"job {job_id}: the journal does not record GPU {dev.gpu_index}'s device minor for {what} CI "
                f"{dev.ci} (written by an older prolog): its capability files are unknown"
            )
        for key, name in (((dev.minor, dev.gi, None), what), ((dev.minor, dev.gi, dev.ci), f"{what} CI {dev.ci}")):
            minor = table.get(key)
            if minor is None:
                raise NsCapsError(
                    f"job {job_id}: the mig-minors table has no capability for {name} (/dev/nvidia{key[0]})"
                )
            if all(n.minor != minor for n in nodes):
                nodes.append(CapNode(minor, name))
    return nodes


def commands(ns: str, nodes: list[CapNode], major: int) -> list[tuple[str, ...]]:
    """The commands that build the job's /dev/nvidia-caps, in order (each run inside its namespace)."""
    enter = ("nsenter", f"--mount={ns}", "--")
    out = [
        (*enter, "mkdir", "-p", "-m", "0755", CAPS_DIR),  # absent on a node no MIG job ran on yet (the node's view)
        (*enter, "mount", "-t", "tmpfs", "-o", TMPFS_OPTIONS, TMPFS_SOURCE, CAPS_DIR),
    ]
    out += [(*enter, "mknod", "-m", CAP_MODE, n.path, "c", str(major), str(n.minor)) for n in nodes]
    out.append((*enter, "mount", "-o", "remount,ro," + TMPFS_OPTIONS, CAPS_DIR))
    return out


def unmount(ns: str) -> tuple[str, ...]:
    return ("nsenter", f"--mount={ns}", "--", "umount", CAPS_DIR)


def execute(job_id: int, ns: str, nodes: list[CapNode], major: int, runner) -> None:
    """Run ``commands``; on a failure once the tmpfs is mounted, unmount it, then raise NsCapsError."""
    from .procscan import SEARCH_PATH

    env = {"PATH": SEARCH_PATH}
    mounted = False
    for argv in commands(ns, nodes, major):
        try:
            runner(argv, timeout=10, env=env)
        except GpushareError as exc:
            left = ""
            if mounted:
                try:
                    runner(unmount(ns), timeout=10, env=env)
                except GpushareError as undo:
                    left = f"; and its half-built {CAPS_DIR} could not be unmounted: {undo}"
            raise NsCapsError(f"job {job_id}: its private {CAPS_DIR}: {exc}{left}") from None
        mounted = mounted or argv[3] == "mount"
