"""sacctmgr show assoc / show qos parsing and the guarded apply."""

from __future__ import annotations

import io

import pytest

from slurm_gpushare.errors import GpushareError
from slurm_gpushare.slurm import sacctmgr
from tests.unit.slurm_fakes import DATA, FakeSlurm


def test_assocs_from_recorded_output():
    rows = sacctmgr.parse_assocs(io.StringIO((DATA / "sacctmgr-assoc-small-lab.parsable2").read_text()))
    accounts = {r.account: r for r in rows if r.user is None}
    assert accounts["physics"].parent == "root" and accounts["physics"].fairshare == 60
    assert accounts["physics"].grp_tres == {"gres/gpu": 4}
    assert accounts["biology"].fairshare == "parent"
    assert accounts["root"].parent is None
    assert ("physics", "alice") in {(r.account, r.user) for r in rows if r.user}


def test_qos_from_recorded_output():
    rows = {
        q.name: q
        for q in sacctmgr.parse_qos(io.StringIO("normal|0|cluster|1.000000|\nhi|30|REQUEUE|0.500000|lo,mid\n"))
    }
    assert rows["normal"].preempt_mode == "cluster" and rows["normal"].preempt == frozenset()
    assert rows["hi"].preempt_mode == "requeue" and rows["hi"].usage_factor == 0.5
    assert rows["hi"].preempt == {"lo", "mid"}


def test_show_commands_and_apply_through_the_runner():
    fake = FakeSlurm.recorded()
    assert {r.account for r in sacctmgr.show_assocs(fake, "lab")} >= {"physics", "biology", "old-project"}
    assert {q.name for q in sacctmgr.show_qos(fake)} == {"normal", "batch"}
    sacctmgr.apply(fake, [["sacctmgr", "-i", "add", "qos", "scavenger"]])
    assert "scavenger" in fake.qos


def test_apply_refuses_anything_but_sacctmgr_immediate():
    fake = FakeSlurm.recorded()
    for argv in (["sh", "-c", "true"], ["sacctmgr", "add", "qos", "x"]):
        with pytest.raises(GpushareError, match="refusing"):
            sacctmgr.apply(fake, [argv])
    assert fake.calls == []
