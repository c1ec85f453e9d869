"""The tenant plan: sacctmgr argv lists from the policy against the current state; applying it converges."""

from __future__ import annotations

import io

import pytest

from slurm_gpushare.accounting.tenants import Current, desired_qos, plan, tres_changes, unmanaged
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.slurm import sacctmgr
from tests.conftest import ROOT, minimal_policy
from tests.unit.test_slurm_fakes import DATA, FakeSlurm

LAB = load_file(ROOT / "etc" / "small-lab.yaml")
I = ["sacctmgr", "-i"]


def recorded_current() -> Current:
    assocs = sacctmgr.parse_assocs(io.StringIO((DATA / "sacctmgr-assoc-small-lab.parsable2").read_text()))
    qos = sacctmgr.parse_qos(io.StringIO((DATA / "sacctmgr-qos-small-lab.parsable2").read_text()))
    return Current.from_rows(assocs, qos)


def read_back(fake: FakeSlurm) -> Current:
    return Current.from_rows(sacctmgr.show_assocs(fake, fake.cluster), sacctmgr.show_qos(fake))


def test_plan_repairs_the_half_configured_state():
    assert plan(LAB, recorded_current()) == [
        [*I, "modify", "account", "where", "name=physics", "cluster=lab", "set", "GrpTRES=gres/gpu=2"],
        [*I, "add", "user", "bob", "account=physics", "cluster=lab"],
        [*I, "modify", "account", "where", "name=biology", "cluster=lab", "set", "fairshare=40"],
        [*I, "add", "account", "biology-imaging", "cluster=lab", "parent=biology", "fairshare=1", "description=biology-imaging"],
        [*I, "add", "user", "dave", "account=biology-imaging", "cluster=lab"],
        [*I, "add", "qos", "scavenger"],
        [*I, "modify", "qos", "where", "name=batch", "set", "preempt=scavenger"],
        [*I, "modify", "qos", "where", "name=scavenger", "set", "priority=1", "preemptmode=requeue", "usagefactor=0.1"],
    ]


def test_unmanaged_things_are_listed_not_touched():
    assert unmanaged(LAB, recorded_current()) == ["account old-project"]
    assert not any("old-project" in " ".join(argv) for argv in plan(LAB, recorded_current()))


def empty_cluster(name: str) -> FakeSlurm:
    return FakeSlurm(assocs=[["root", "", "", "1", ""], ["root", "root", "", "1", ""]],
                     qos={"normal": ["0", "cluster", "1.000000", ""]}, cluster=name)


@pytest.mark.parametrize("policy", ["small-lab.yaml", "mixed-production.yaml", "mps-inference.yaml"])
def test_applying_the_plan_converges(policy):
    site = load_file(ROOT / "etc" / policy)
    fake = empty_cluster(site.cluster.name)
    commands = plan(site, read_back(fake))
    assert commands
    sacctmgr.apply(fake, commands)
    assert plan(site, read_back(fake)) == []


def test_applying_over_the_recorded_state_converges():
    fake = FakeSlurm.recorded()
    sacctmgr.apply(fake, plan(LAB, read_back(fake)))
    assert plan(LAB, read_back(fake)) == []
    assert fake._account("physics")[4] == "gres/gpu=2"


def test_commands_are_argument_lists_for_sacctmgr_only():
    raw = minimal_policy()
    raw["tenants"] = [{"name": "a", "shares": 1, "description": "Team A; rm -rf / 'quoted' \"x\"", "users": ["u1"]}]
    site = build_site(raw, "t")
    commands = plan(site, Current({"root": sacctmgr.AssocRow("root", None, None, 1)}, frozenset(), {}))
    assert all(isinstance(a, str) for argv in commands for a in argv)
    assert all(argv[:2] == I for argv in commands)
    assert [*I, "add", "account", "a", "cluster=t", "parent=root", "fairshare=1",
            "description=Team A; rm -rf / 'quoted' \"x\""] in commands


def test_fairshare_parent_parent_change_and_quota_removal():
    raw = minimal_policy()
    raw["tenants"] = [{"name": "a", "shares": 2}, {"name": "b", "shares": "parent", "parent": "a"}]
    site = build_site(raw, "t")
    current = Current({"root": sacctmgr.AssocRow("root", None, None, 1),
                       "a": sacctmgr.AssocRow("a", None, "root", 2, {"gres/gpu": 8, "cpu": 100}),
                       "b": sacctmgr.AssocRow("b", None, "root", 5, {})}, frozenset(), {})
    where = [*I, "modify", "account", "where"]
    assert plan(site, current, cluster="c")[:3] == [
        [*where, "name=a", "cluster=c", "set", "GrpTRES=gres/gpu=-1"],  # cpu=100 is not ours: left alone
        [*where, "name=b", "cluster=c", "set", "parent=a"],
        [*where, "name=b", "cluster=c", "set", "fairshare=parent"],
    ]


def test_tres_changes():
    assert tres_changes({"gres/gpu": 2}, {"gres/gpu": 2}) == ""
    assert tres_changes({"gres/gpu": 0, "gres/shard": 8}, {"gres/mps": 5}) == "gres/gpu=0,gres/mps=-1,gres/shard=8"


def test_qos_preempt_lower_preemptable_tiers():
    site = load_file(ROOT / "etc" / "mixed-production.yaml")
    q = {s.name: s for s in desired_qos(site)}
    assert q["reserved"].preempt == {"training", "notebook"}
    assert q["inference"].preempt == {"training", "notebook"}
    assert q["training"].preempt == {"notebook"} and q["training"].preempt_mode == "requeue"
    assert q["notebook"].preempt == frozenset() and q["notebook"].preempt_mode == "cancel"


def test_off_reads_back_as_cluster_and_is_not_replanned():
    current = recorded_current()
    assert not any("name=batch" in argv and any(a.startswith("preemptmode") for a in argv)
                   for argv in plan(LAB, current))
