"""Tests of the fake Slurm commands themselves (the fake: slurm_fakes.py)."""

from __future__ import annotations

import pytest

from slurm_gpushare.proc import CommandError
from tests.unit.slurm_fakes import FakeSlurm, UnknownCommand


def test_fake_refuses_unknown_commands_and_options():
    fake = FakeSlurm.recorded()
    with pytest.raises(UnknownCommand):
        fake(["scontrol", "show", "jobs"])
    with pytest.raises(UnknownCommand):
        fake(["sacctmgr", "add", "qos", "x"])  # no -i: would wait for y/N
    with pytest.raises(UnknownCommand):
        fake(["sacctmgr", "-i", "modify", "qos", "where", "name=batch", "set", "maxwall=1"])


def test_fake_sacctmgr_keeps_state_and_fails_like_sacctmgr():
    fake = FakeSlurm.recorded()
    fake(["sacctmgr", "-i", "add", "qos", "scavenger"])
    fake(["sacctmgr", "-i", "modify", "qos", "where", "name=scavenger", "set", "preemptmode=off", "usagefactor=0.1"])
    assert fake.qos["scavenger"] == ["0", "cluster", "0.100000", ""]
    with pytest.raises(CommandError, match="Nothing new added"):
        fake(["sacctmgr", "-i", "add", "qos", "scavenger"])
    with pytest.raises(CommandError, match="No such account"):
        fake(["sacctmgr", "-i", "add", "user", "x", "account=nope", "cluster=lab"])
    fake(
        [
            "sacctmgr",
            "-i",
            "modify",
            "account",
            "where",
            "name=physics",
            "cluster=lab",
            "set",
            "GrpTRES=gres/gpu=-1,gres/shard=3",
        ]
    )
    assert fake._account("physics")[4] == "gres/shard=3"


def test_fake_sacctmgr_qos_access_is_inherited_and_added_to():
    fake = FakeSlurm.recorded()
    fake(["sacctmgr", "-i", "add", "qos", "scavenger"])
    show = ["sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", "cluster=lab", "format=account,user,qos"]
    assert "physics|alice|normal\n" in fake(show).stdout
    fake(["sacctmgr", "-i", "modify", "account", "where", "name=physics", "cluster=lab", "set", "qos+=batch,scavenger"])
    assert (
        "physics|alice|batch,normal,scavenger\n" in fake(show).stdout and "biology|carol|normal\n" in fake(show).stdout
    )
    fake(
        [
            "sacctmgr",
            "-i",
            "modify",
            "user",
            "where",
            "name=carol",
            "account=biology",
            "cluster=lab",
            "set",
            "qos=batch",
        ]
    )
    assert "biology|carol|batch\n" in fake(show).stdout
    with pytest.raises(CommandError, match="Unknown QOS"):
        fake(["sacctmgr", "-i", "modify", "account", "where", "name=physics", "cluster=lab", "set", "qos+=nope"])
