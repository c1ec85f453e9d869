"""The merged slurm.conf and gres.conf keep every site feature (siteconf/merge.py, siteconf/gres.py; pure)."""

from __future__ import annotations

import pytest
from hostlist import expand_hostlist

from slurm_gpushare.policy import load_file
from slurm_gpushare.render import render_all
from slurm_gpushare.siteconf import conf
from slurm_gpushare.siteconf.gres import plan_gres_conf
from slurm_gpushare.siteconf.gres import unmerge as gres_unmerge
from slurm_gpushare.siteconf.merge import COMMENTED, Options, plan_slurm_conf, unmerge
from tests.conftest import ROOT
from tests.unit.siteconf.conftest import SITE

POLICY_NODES = frozenset(expand_hostlist("h100-[01-08]"))
SITE_CONF = (SITE / "slurm.conf").read_text()


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_all(load_file(ROOT / "etc" / "mixed-production.yaml"))


def merge(rendered, site=SITE_CONF, **kw):
    opts = Options(POLICY_NODES, site_health=kw.pop("site_health", "/usr/sbin/nhc"), **kw)
    return plan_slurm_conf(site, rendered["slurm-gpushare.conf"], opts)


def effective(merged) -> dict[str, list[str]]:
    """What Slurm reads: slurm.conf up to the Include, the include, then the rest; every value of every key."""
    head, _, tail = merged.slurm_conf.partition("Include slurm-gpushare.conf\n")
    out: dict[str, list[str]] = {}
    for text in (head, merged.fragment, tail):
        for line in conf.parse(text):
            if line.record is None:
                for p in line.pairs:
                    out.setdefault(p.name, []).append(p.value)
    return out


def partition(merged, name: str) -> conf.Line:
    lines = [ln for ln in conf.parse(merged.fragment) if ln.record == "partitionname" and ln.pairs[0].value == name]
    assert len(lines) == 1
    return lines[0]


def test_every_site_key_survives_or_is_merged(rendered):
    m = merge(rendered)
    assert m.refusals == []
    keys = effective(m)
    assert keys["prologflags"] == ["X11,Serial,Alloc,Contain"]
    assert keys["accountingstoragetres"][0].startswith("gres/gpu,license/matlab,")
    assert keys["grestypes"] == ["gpu,shard"]
    assert keys["jobsubmitplugins"] == ["lua"]
    assert keys["licenses"] == ["matlab:20"] and keys["clustername"] == ["prod"]
    # every key is set once: Slurm logs an error for a key set twice
    assert all(len(v) == 1 for k, v in keys.items() if k not in ("prolog", "epilog")), keys


def test_site_prolog_runs_before_ours_and_its_epilog_after(rendered):
    keys = effective(merge(rendered))
    assert keys["prolog"] == ["/etc/slurm/prolog.d/*", "/usr/local/sbin/gpushare-prolog"]
    assert keys["epilog"] == ["/usr/local/sbin/gpushare-epilog", "/etc/slurm/epilog.d/site-epilog.sh"]


def test_health_program_chained_through_the_policy(rendered):
    m = merge(rendered)
    assert effective(m)["healthcheckprogram"] == ["/usr/local/sbin/gpushare-node-health"]
    assert f"{COMMENTED}HealthCheckProgram=/usr/sbin/nhc" in m.slurm_conf.splitlines()


def test_a_site_health_program_is_not_taken_over_silently(rendered):
    m = merge(rendered, site_health=None)
    assert len(m.refusals) == 1 and "cluster.health.site_program: /usr/sbin/nhc" in m.refusals[0]
    assert not merge(rendered, site_health=None, take_over=frozenset({"healthcheckprogram"})).refusals


def test_partition_keeps_the_site_options(rendered):
    training = partition(merge(rendered), "training")
    for key, value in [
        ("AllowGroups", "ml,research"),
        ("QOS", "training"),
        ("OverSubscribe", "NO"),
        ("DefMemPerGPU", "200000"),
        ("DefCpuPerGPU", "8"),
        ("MaxNodes", "4"),
        ("PriorityTier", "10"),
    ]:
        assert training.get(key) == value, key
    assert training.get("DefMemPerCPU") is None  # Slurm takes one memory default: the site's
    assert training.pairs[-1].key == "State"


def test_site_partitions_and_nodes_outside_the_policy_untouched(rendered):
    m = merge(rendered)
    lines = m.slurm_conf.splitlines()
    assert "PartitionName=legacy Nodes=gpu-old[01-02] MaxTime=1-00:00:00 Hidden=YES State=UP" in lines
    assert "NodeName=cpu[01-04] CPUs=64 RealMemory=256000" in lines
    assert "NodeName=gpu-old[01-02] CPUs=112 RealMemory=2000000 Gres=gpu:8" in lines  # split off the policy's
    assert f"{COMMENTED}NodeName=h100-[01-08],gpu-old[01-02] CPUs=112 RealMemory=2000000 Gres=gpu:8" in lines


def test_site_default_partition_kept_unless_taken_over(rendered):
    assert effective(merge(rendered))  # parses
    assert partition(merge(rendered), "training").get("Default") == "NO"
    taken = merge(rendered, take_over=frozenset({"default"}))
    assert partition(taken, "training").get("Default") == "YES"


def test_refuses_to_take_over_an_owned_key_the_site_set(rendered):
    site = SITE_CONF.replace("PreemptType=preempt/partition_prio", "PreemptType=preempt/qos")
    m = merge(rendered, site=site)
    assert len(m.refusals) == 1
    assert m.refusals[0].startswith("PreemptType=preempt/qos is the site's (slurm.conf line 21)")
    assert "--take-over PreemptType" in m.refusals[0]
    assert merge(rendered, site=site, take_over=frozenset({"preempttype"})).refusals == []


def test_refuses_a_partition_option_the_policy_sets_otherwise(rendered):
    site = SITE_CONF.replace(
        "PartitionName=training Nodes=h100-[01-08] MaxTime=3-00:00:00",
        "PartitionName=training Nodes=h100-[01-08] MaxTime=1-00:00:00",
    )
    m = merge(rendered, site=site)
    assert len(m.refusals) == 1 and "MaxTime=1-00:00:00 (the policy's: 3-00:00:00)" in m.refusals[0]
    assert not merge(rendered, site=site, take_over=frozenset({"partitionname=training"})).refusals


def test_union_conflicts_and_fatal_flag_combinations_refused(rendered):
    site = SITE_CONF.replace("PrologFlags=X11,Serial", "PrologFlags=NoHold")
    assert any("NoHold" in r for r in merge(rendered, site=site).refusals)
    site = SITE_CONF.replace("PreemptMode=REQUEUE", "PreemptMode=REQUEUE\nSchedulerParameters=bf_interval=60,defer")
    m = merge(rendered, site=site)
    assert len(m.refusals) == 1 and "bf_interval=60 (the product's: bf_interval=10)" in m.refusals[0]
    kept = merge(rendered, site=site, take_over=frozenset({"schedulerparameters"}))
    assert effective(kept)["schedulerparameters"] == [
        "bf_interval=10,defer,bf_continue,bf_min_age_reserve=300,nohold_on_prolog_fail"
    ]


def test_unmerge_gives_the_site_file_back_and_a_second_merge_is_the_same(rendered):
    m = merge(rendered)
    assert unmerge(m.slurm_conf) == SITE_CONF
    again = merge(rendered, site=m.slurm_conf)
    assert (again.slurm_conf, again.fragment) == (m.slurm_conf, m.fragment)


def test_every_change_names_key_old_new_and_why(rendered):
    m = merge(rendered)
    text = [str(c) for c in m.changes]
    assert (
        "union PrologFlags: X11,Serial -> X11,Serial,Alloc,Contain: flags combine; "
        "Alloc/Contain are what the product's prolog needs" in text
    )
    assert all(c.why for c in m.changes)


def test_gres_conf_keeps_the_nodes_outside_the_policy(rendered):
    site_nodes = frozenset(expand_hostlist("cpu[01-04],h100-[01-08],gpu-old[01-02]"))
    site = (SITE / "gres.conf").read_text()
    text, changes = plan_gres_conf(site, rendered["gres.conf"], POLICY_NODES, site_nodes)
    assert text.startswith(rendered["gres.conf"])
    lines = text.splitlines()
    assert "NodeName=gpu-old[01-02] Name=gpu Type=v100 File=/dev/nvidia[0-7]" in lines
    assert "NodeName=cpu[01-04],gpu-old[01-02] AutoDetect=nvml" in lines  # the site's global AutoDetect, per node
    assert "AutoDetect=off" in lines  # the product's global one, for its nodes
    assert gres_unmerge(text) == site
    assert plan_gres_conf(text, rendered["gres.conf"], POLICY_NODES, site_nodes)[0] == text


def test_gres_conf_lines_of_policy_nodes_are_dropped_and_mixed_ones_split(rendered):
    site = "NodeName=h100-[01-08],gpu-old01 Name=gpu File=/dev/nvidia[0-7]\nName=gpu File=/dev/nvidia0\n"
    nodes = frozenset(expand_hostlist("h100-[01-08],gpu-old01"))
    text, _ = plan_gres_conf(site, rendered["gres.conf"], POLICY_NODES, nodes)
    kept = text[len(rendered["gres.conf"]) :].splitlines()
    assert "NodeName=gpu-old01 Name=gpu File=/dev/nvidia[0-7]" in kept
    assert "NodeName=gpu-old01 Name=gpu File=/dev/nvidia0" in kept
    assert not [ln for ln in kept if "h100" in ln and not ln.startswith("#gpushare-site# ")]


def test_reader_handles_slurm_syntax():
    line = conf.parse('PartitionName=a Nodes=x[1-2] TRESBillingWeights="CPU=1,Mem=0.25G" # comment\n')[0]
    assert [(p.key, p.value, p.quoted) for p in line.pairs] == [
        ("PartitionName", "a", False),
        ("Nodes", "x[1-2]", False),
        ("TRESBillingWeights", "CPU=1,Mem=0.25G", True),
    ]
    assert conf.render_pairs(list(line.pairs)) == 'PartitionName=a Nodes=x[1-2] TRESBillingWeights="CPU=1,Mem=0.25G"'
    assert conf.parse("Include /etc/slurm/nodes.conf")[0].get("Include") == "/etc/slurm/nodes.conf"
    assert conf.keys(conf.parse("A=1 B=2\nsomething\\#x=3"))["b"][0][1].value == "2"


def test_partition_options_compare_as_slurm_reads_them(rendered):
    site = SITE_CONF.replace(
        "PartitionName=training Nodes=h100-[01-08]", "PartitionName=training Nodes=h100-[05-08],h100-[01-04]"
    )
    assert merge(rendered, site=site).refusals == []
