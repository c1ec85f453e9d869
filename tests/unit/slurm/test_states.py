"""The one rule of which Slurm node states start no job (slurm/states.py), against Slurm's own names."""

from __future__ import annotations

import pytest

from slurm_gpushare.slurm import states
from slurm_gpushare.slurm.model import node_state

# The names Slurm 24.11 writes in a node's JSON "state" list and in node_state_string_complete (pyslurm):
# node_states[] and node_state_flags[] of src/common/slurm_protocol_defs.c.
SLURM_BASE = ("DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN")
SLURM_FLAGS = (
    "CLOUD",
    "COMPLETING",
    "DRAIN",
    "DYNAMIC_FUTURE",
    "DYNAMIC_NORM",
    "INVALID_REG",
    "FAIL",
    "MAINTENANCE",
    "POWER_DOWN",
    "POWER_UP",
    "PERFCTRS",
    "POWERED_DOWN",
    "REBOOT_REQUESTED",
    "REBOOT_ISSUED",
    "RESERVED",
    "RESUME",
    "NOT_RESPONDING",
    "PLANNED",
    "POWERING_UP",
    "POWERING_DOWN",
)
# sinfo's combined short names (node_state_string) that name one of the flags above
SINFO_SHORT = {
    "MAINT": "MAINTENANCE",
    "DRAINED": "DRAIN",
    "DRAINING": "DRAIN",
    "FAILING": "FAIL",
    "INVAL": "INVALID_REG",
}

STARTS_JOBS = {
    "IDLE",
    "ALLOCATED",
    "MIXED",
    "ERROR",
    "CLOUD",
    "COMPLETING",
    "DYNAMIC_FUTURE",
    "DYNAMIC_NORM",
    "POWER_UP",
    "PERFCTRS",
    "RESERVED",
    "RESUME",
    "PLANNED",
    "POWERING_UP",
}


def test_every_name_of_the_rule_is_a_slurm_name():
    known = set(SLURM_BASE) | set(SLURM_FLAGS) | set(SINFO_SHORT) | {"INVALID"}
    assert sorted(states.UNAVAILABLE - known) == []


@pytest.mark.parametrize("name", sorted(set(SLURM_BASE) | set(SLURM_FLAGS)))
def test_each_slurm_state_is_classified(name):
    assert states.unavailable([name]) is (name not in STARTS_JOBS), name


@pytest.mark.parametrize("short, full", sorted(SINFO_SHORT.items()))
def test_sinfo_short_names_answer_as_the_flag_they_name(short, full):
    assert states.unavailable([short]) is states.unavailable([full]) is True


@pytest.mark.parametrize(
    "text, want",
    [
        ("IDLE", False),
        ("MIXED", False),
        ("IDLE+DRAIN", True),
        ("MIXED+DRAIN", True),
        ("IDLE+MAINTENANCE", True),
        ("IDLE+POWERED_DOWN", True),
        ("IDLE+REBOOT_REQUESTED", True),
        ("IDLE*", False),
        ("DOWN*", True),
        ("IDLE+INVALID_REG", True),
        ("ALLOCATED+COMPLETING", False),
        ("", False),
    ],
)
def test_a_node_state_as_backends_read_it(text, want):
    """pyslurm's text ('IDLE+DRAIN', '*' for not responding) and the JSON list give the same answer."""
    assert states.unavailable(node_state(text)) is want
    assert states.unavailable(node_state(text.replace("*", "").split("+"))) is want


def test_drained_is_the_drain_flag_under_any_of_its_names():
    assert states.drained(("IDLE", "DRAIN")) and states.drained(["DRAINED"]) and states.drained(["DRAINING"])
    assert not states.drained(("MIXED", "MAINTENANCE")) and not states.drained(())
    assert states.DRAINED <= states.UNAVAILABLE
