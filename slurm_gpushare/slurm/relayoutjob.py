"""The live planner's lock on a node (a reservation) and its root relayout job, over the one ``SlurmClient``.

The lock on a node is a Slurm reservation ``gpushare-relayout-<node>``
(``SlurmClient.create_reservation``: ``scontrol create reservation ...
Flags=MAINT,IGNORE_JOBS``): slurmctld creates a named reservation
atomically, and a second create of the same name fails with "Duplicate
reservation name" (Slurm 24.11 src/slurmctld/reservation.c ``create_resv``:
``ESLURM_RESERVATION_NAME_DUP``), which the client raises as
``ReservationExists`` and ``create_lock`` as ``LockHeld``. The reservation
keeps new jobs of everyone but root off the node while its GPU jobs end,
shows in ``scontrol show res``, and ends by itself after its duration (a
planner that died leaves nothing behind for long). MAINT lets it overlap
any other reservation (``_resv_overlap`` skips MAINT), IGNORE_JOBS lets it
start on a node whose jobs still run.

The relayout itself runs on the node as a root batch job in that reservation
(``submit_relayout``): its script is fixed text (``relayout_script``), every
word of it checked (node name, absolute paths), and the job gets no
environment from the planner (``--export=NIL``: SLURM_* only, and unlike NONE
no login environment built on the node either; the script sets its own PATH).
A job still running when its reservation ends is killed (after slurm.conf's
ResvOverRun), so the reservation's duration covers the wait for GPU jobs
and the relayout job's time limit.

This module names the reservation and the job, checks every word that goes
into them and writes the job's script; the client runs the commands and
parses what they print. Nothing here decides anything.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from .cli_backend import ReservationError, ReservationExists

if TYPE_CHECKING:
    from .interface import SlurmClient
    from .model import Reservation

PREFIX = "gpushare-relayout-"
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SAFE_PATH_WORD = re.compile(r"^/[A-Za-z0-9_./+-]+$")
SCRIPT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RELAYOUT_QOS = "normal"


class LockHeld(ReservationExists):
    """The node's gpushare-relayout reservation exists: another planner (or an earlier run) holds the node."""


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE_NAME.match(node):
        raise ReservationError(
            f"node name {node!r}: expected letters, digits, '.', '_' or '-' "
            "(a Slurm NodeName, up to 63 characters, not starting with a sign)"
        )
    return node


def check_path(path: str, what: str, percent: bool = False) -> str:
    """An absolute path of plain characters (``percent``: sbatch's %j and %x patterns allowed too)."""
    text = str(path)
    plain = text.replace("%j", "").replace("%x", "") if percent else text
    if not SAFE_PATH_WORD.match(plain) or "/../" in text + "/" or "/./" in text + "/":
        raise ReservationError(
            f"{what} {text!r}: expected an absolute path of letters, digits and _./+- "
            "(no '..', no spaces or shell characters)"
        )
    return text


def lock_name(node: str) -> str:
    return PREFIX + check_node(node)


def lock_node(reservation: Reservation) -> str:
    """The node a gpushare-relayout reservation locks (from its name; "" for any other reservation)."""
    name = reservation.name
    return name[len(PREFIX) :] if name.startswith(PREFIX) else ""


def minutes(seconds: float) -> int:
    """Whole minutes covering ``seconds`` (at least 1): Slurm's reservation Duration and job --time unit."""
    return max(1, math.ceil(seconds / 60))


def relayout_script(policy: str, node: str, node_config: str | None = None) -> str:
    """The batch script of the root relayout job: fixed text, its words checked, no input from any job."""
    argv = ["gpushare", "node", "relayout", "--policy", check_path(policy, "live policy"), "--node", check_node(node)]
    if node_config is not None:
        argv += ["--node-config", check_path(node_config, "node config")]
    return (
        "#!/bin/sh\n"
        "# gpushare live planner: change this node's MIG layout to the live policy's (gpushare node relayout)\n"
        f"PATH={SCRIPT_PATH}\nexport PATH\n"
        f"exec {' '.join(argv)}\n"
    )


def relayout_options(
    node: str, *, log: str, time_limit_s: float, partition: str | None = None, qos: str = RELAYOUT_QOS
) -> list[str]:
    """sbatch's options for the relayout job: in the node's lock, named for it, no environment. ``qos``: named,
    so job_submit.lua does not give the job its tier's QOS, which root's association need not have ("Invalid
    qos specification", seen on the test cluster); 'normal' is the QOS slurmdbd creates with every cluster."""
    name = lock_name(node)
    options = [
        f"--reservation={name}",
        f"--nodelist={node}",
        f"--job-name={name}",
        f"--output={check_path(log, 'relayout log', percent=True)}",
        "--export=NIL",
        f"--time={minutes(time_limit_s)}",
        "--nodes=1",
        "--ntasks=1",
        f"--qos={check_node(qos)}",
    ]
    if partition is not None:
        options.append(f"--partition={check_node(partition)}")
    return options


# ---- the lock and the job, through the client ---------------------------------------------------------------


def create_lock(client: SlurmClient, node: str, duration_s: float) -> str:
    """Create ``gpushare-relayout-<node>`` on the node from now for ``duration_s`` (rounded up to minutes); its
    name. LockHeld when it exists already."""
    name = lock_name(node)
    try:
        client.create_reservation(name, node, minutes(duration_s))
    except ReservationExists:
        raise LockHeld(f"node {node}: reservation {name} exists: another planner holds the node") from None
    except ReservationError as exc:
        raise ReservationError(f"node {node}: {exc}") from None
    return name


def locks(client: SlurmClient) -> list[Reservation]:
    """The gpushare-relayout-* reservations slurmctld has now."""
    return [r for r in client.reservations() if r.name.startswith(PREFIX)]


def delete_lock(client: SlurmClient, node: str) -> bool:
    """Delete the node's lock; False when it was not there (expired, or deleted by another planner)."""
    try:
        return client.delete_reservation(lock_name(node))
    except ReservationError as exc:
        raise ReservationError(f"node {node}: {exc}") from None


def extend_lock(client: SlurmClient, node: str, from_now_s: float) -> None:
    """Make the lock last at least ``from_now_s`` more seconds (EndTime=now+N minutes)."""
    client.extend_reservation(lock_name(node), minutes(from_now_s))


def submit_relayout(
    client: SlurmClient,
    node: str,
    policy: str,
    *,
    log: str,
    time_limit_s: float,
    partition: str | None = None,
    node_config: str | None = None,
    qos: str = RELAYOUT_QOS,
) -> int:
    """Submit the root relayout job into the node's lock; its job id."""
    options = relayout_options(node, log=log, time_limit_s=time_limit_s, partition=partition, qos=qos)
    return client.submit_batch(options, relayout_script(policy, node, node_config))


def relayout_jobs(client: SlurmClient, node: str, since: float) -> list[int]:
    """Ids of root's jobs named ``gpushare-relayout-<node>`` submitted at or after ``since`` (epoch s): how a run
    finds the job an earlier run submitted but did not live to record."""
    return client.root_jobs_named(lock_name(node), since)


__all__ = [
    "LockHeld",
    "PREFIX",
    "ReservationError",
    "check_node",
    "check_path",
    "create_lock",
    "delete_lock",
    "extend_lock",
    "lock_name",
    "lock_node",
    "locks",
    "minutes",
    "relayout_jobs",
    "relayout_options",
    "relayout_script",
    "submit_relayout",
]
