"""The tenant plan: sacctmgr argv lists from the policy against the current state; applying it converges."""

from __future__ import annotations

import io

import pytest

from slurm_gpushare.accounting.tenants import (
    Current,
    desired_qos,
    parse_access,
    plan,
    read_current,
    tres_changes,
    unmanaged,
)
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.slurm import sacctmgr
from slurm_gpushare.slurm.cli_backend import CliClient
from tests.conftest import ROOT, minimal_policy
from tests.unit.slurm_fakes import DATA, FakeSlurm

LAB = load_file(ROOT / "etc" / "small-lab.yaml")
SACCTMGR = ["sacctmgr", "-i"]


def recorded_current() -> Current:
    assocs = sacctmgr.parse_assocs(io.StringIO((DATA / "sacctmgr-assoc-small-lab.parsable2").read_text()))
    qos = sacctmgr.parse_qos(io.StringIO((DATA / "sacctmgr-qos-small-lab.parsable2").read_text()))
    return Current.from_rows(assocs, qos)


def read_back(fake: FakeSlurm) -> Current:
    return read_current(CliClient(fake), fake.cluster)


def test_plan_repairs_the_half_configured_state():
    assert plan(LAB, recorded_current()) == [
        # QOS first, then per account: the account, its QOS access, its new users (which copy the access).
        [*SACCTMGR, "add", "qos", "scavenger"],
        [*SACCTMGR, "modify", "qos", "where", "name=batch", "set", "preempt=scavenger"],
        [
            *SACCTMGR,
            "modify",
            "qos",
            "where",
            "name=scavenger",
            "set",
            "priority=1",
            "preemptmode=requeue",
            "usagefactor=0.1",
        ],
        [*SACCTMGR, "modify", "account", "where", "name=physics", "cluster=lab", "set", "GrpTRES=gres/gpu=2"],
        [*SACCTMGR, "add", "user", "bob", "account=physics", "cluster=lab"],
        [*SACCTMGR, "modify", "account", "where", "name=biology", "cluster=lab", "set", "fairshare=40"],
        [
            *SACCTMGR,
            "add",
            "account",
            "biology-imaging",
            "cluster=lab",
            "parent=biology",
            "fairshare=1",
            "description=biology-imaging",
        ],
        [*SACCTMGR, "add", "user", "dave", "account=biology-imaging", "cluster=lab"],
    ]


def test_unmanaged_things_are_listed_not_touched():
    assert unmanaged(LAB, recorded_current()) == ["account old-project"]
    assert not any("old-project" in " ".join(argv) for argv in plan(LAB, recorded_current()))


def empty_cluster(name: str) -> FakeSlurm:
    return FakeSlurm(
        assocs=[["root", "", "", "1", ""], ["root", "root", "", "1", ""]],
        qos={"normal": ["0", "cluster", "1.000000", ""]},
        cluster=name,
    )


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
    assert all(argv[:2] == SACCTMGR for argv in commands)
    assert [
        *SACCTMGR,
        "add",
        "account",
        "a",
        "cluster=t",
        "parent=root",
        "fairshare=1",
        "description=Team A; rm -rf / 'quoted' \"x\"",
    ] in commands


def test_fairshare_parent_parent_change_and_quota_removal():
    raw = minimal_policy()
    raw["tenants"] = [{"name": "a", "shares": 2}, {"name": "b", "shares": "parent", "parent": "a"}]
    site = build_site(raw, "t")
    current = Current(
        {
            "root": sacctmgr.AssocRow("root", None, None, 1),
            "a": sacctmgr.AssocRow("a", None, "root", 2, {"gres/gpu": 8, "cpu": 100}),
            "b": sacctmgr.AssocRow("b", None, "root", 5, {}),
        },
        frozenset(),
        {},
    )
    where = [*SACCTMGR, "modify", "account", "where"]
    assert [c for c in plan(site, current, cluster="c") if c[:5] == where][:3] == [
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
    assert not any(
        "name=batch" in argv and any(a.startswith("preemptmode") for a in argv) for argv in plan(LAB, current)
    )


def managed(site):
    return [(t.name, None) for t in site.policy.tenants] + [(t.name, u) for t in site.policy.tenants for u in t.users]


@pytest.mark.parametrize("policy", ["small-lab.yaml", "mixed-production.yaml", "mps-inference.yaml"])
def test_every_managed_association_gets_every_tier_qos(policy):
    site = load_file(ROOT / "etc" / policy)
    fake = empty_cluster(site.cluster.name)
    sacctmgr.apply(fake, plan(site, read_back(fake)))
    tiers = {t.name for t in site.tiers}
    for account, user in managed(site):
        assert fake.effective_qos(account, user or "") == tiers | {"normal"}, (account, user)
    assert fake.effective_qos("root") == {"normal"}  # root (and what the policy does not manage) is left alone


def test_qos_access_plan_on_the_recorded_state():
    fake = FakeSlurm.recorded()
    fake.assoc_qos[("physics", "alice")] = frozenset({"normal"})  # set on the user: it does not inherit the account's
    commands = [argv for argv in plan(LAB, read_back(fake)) if any(a.startswith("qos+=") for a in argv)]
    assert commands == [
        [*SACCTMGR, "modify", "account", "where", "name=physics", "cluster=lab", "set", "qos+=batch,scavenger"],
        [
            *SACCTMGR,
            "modify",
            "user",
            "where",
            "name=alice",
            "account=physics",
            "cluster=lab",
            "set",
            "qos+=batch,scavenger",
        ],
        [*SACCTMGR, "modify", "account", "where", "name=biology", "cluster=lab", "set", "qos+=batch,scavenger"],
        [
            *SACCTMGR,
            "modify",
            "user",
            "where",
            "name=carol",
            "account=biology",
            "cluster=lab",
            "set",
            "qos+=batch,scavenger",
        ],
        # biology-imaging is new: it inherits biology's; new users (bob, dave) inherit their account's
    ]
    full = plan(LAB, read_back(fake))
    last_qos = max(i for i, argv in enumerate(full) if argv[2:4] == ["add", "qos"])
    assert all(full.index(c) > last_qos for c in commands)  # after the QOS exist
    users = [i for i, argv in enumerate(full) if argv[2:4] == ["add", "user"]]
    assert full.index(commands[0]) < users[0]  # before physics' new user bob, who copies the account's QOS
    sacctmgr.apply(fake, plan(LAB, read_back(fake)))
    assert plan(LAB, read_back(fake)) == []
    assert fake.effective_qos("biology-imaging", "dave") == {"batch", "normal", "scavenger"}


def test_other_qos_an_association_has_are_kept_and_no_access_read_plans_none():
    fake = FakeSlurm.recorded()
    fake(["sacctmgr", "-i", "add", "qos", "extra"])
    fake.assoc_qos[("physics", "")] = frozenset({"extra", "normal"})
    sacctmgr.apply(fake, plan(LAB, read_back(fake)))
    assert fake.effective_qos("physics", "bob") == {"batch", "extra", "normal", "scavenger"}
    assert not any(a.startswith("qos+=") for argv in plan(LAB, recorded_current()) for a in argv)


def test_parse_access():
    assert parse_access(["root||normal\n", "physics|alice|batch,normal,scavenger\n", "x|y|\n"]) == {
        ("root", None): {"normal"},
        ("physics", "alice"): {"batch", "normal", "scavenger"},
        ("x", "y"): frozenset(),
    }
