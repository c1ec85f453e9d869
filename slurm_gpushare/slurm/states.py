"""Slurm's node state names, and the one rule of which ones leave a node unable to start a job.

A node's state (``model.Node.state``) is its base state, then its flags:
``("IDLE", "DRAIN")``. Slurm 24.11 writes them the same way in
``scontrol show node --json`` / ``sinfo --json`` (the ``state`` list) and in
the text pyslurm reads (``node_state_string_complete``: ``IDLE+DRAIN``): the
names of ``node_states[]`` and ``node_state_flags[]`` in
``src/common/slurm_protocol_defs.c``; the maintenance flag is
``MAINTENANCE`` there. sinfo's short form (``node_state_string``: ``MAINT``,
``DRAINED``, ``DRAINING``, ``FAILING``, ``INVAL``) names the same flags
combined; those names are accepted too, so a state read from either form
gives the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable

# Flags set by a drain (``scontrol update state=drain``); DRAINED/DRAINING are sinfo's names for DRAIN
# without/with jobs still running.
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})

# Base states and flags under which a node starts no job: down, drained, failed, not responding, in a
# maintenance reservation, powered down or powering down, rebooting, not yet configured (FUTURE), unknown to
# slurmctld, or registered with a configuration that does not match slurm.conf (INVALID_REG; sinfo: INVAL).
UNAVAILABLE = DRAINED | frozenset(
    {
        "DOWN",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "FUTURE",
        "UNKNOWN",
        "INVALID",
        "INVALID_REG",
        "INVAL",
        "MAINTENANCE",
        "MAINT",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
    }
)


def unavailable(states: Iterable[str]) -> bool:
    """True when any of a node's states (base state and flags) means it can start no job now."""
    return any(s in UNAVAILABLE for s in states)


def drained(states: Iterable[str]) -> bool:
    """True when a node is drained or draining (Slurm starts no new job there until it is resumed)."""
    return any(s in DRAINED for s in states)
