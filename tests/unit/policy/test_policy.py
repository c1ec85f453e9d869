"""Every validation rule of the site policy, each with the message a person reads."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import PolicyError
from slurm_gpushare.policy import build_site, load_bytes
from slurm_gpushare.policy.groups import format_indexes, gpus_value, parse_indexes


def problems(raw, **kw) -> list[str]:
    with pytest.raises(PolicyError) as info:
        build_site(raw, "test.yaml", **kw)
    return [str(p) for p in info.value.problems]


def one(raw, path: str, fragment: str, **kw) -> None:
    found = problems(raw, **kw)
    hits = [p for p in found if p.startswith(path + ":") and fragment in p]
    assert hits, f"expected {path}: ...{fragment}... in {found}"


def test_minimal_policy_is_valid(policy):
    site = build_site(policy, "t.yaml")
    g = site.groups[0]
    assert [s.mode for s in g.gpus] == ["exclusive", "exclusive", "mig", "shard"]
    assert g.gres == {("gpu", "a100_40g"): 3, ("gpu", "a100_40g_3g.20gb"): 2, ("shard", ""): 4}
    assert site.tiers[0].is_default


def test_unknown_top_level_key_lists_allowed(policy):
    policy["clustr"] = {}
    one(policy, "clustr", "unknown key; allowed here: billing, cluster, gpu_models, live, node_groups")


def test_unknown_nested_key_lists_allowed(policy):
    policy["node_groups"][0]["gpu"]["modle"] = "x"
    one(policy, "node_groups[0].gpu.modle", "allowed here: count, model")


def test_version_must_be_1(policy):
    policy["version"] = 2
    one(policy, "version", "must be 1")


def test_missing_required_key(policy):
    del policy["cluster"]["controller"]
    one(policy, "cluster.controller", "required key is missing")


@pytest.mark.parametrize(
    "layout, fragment",
    [
        (["1g.5gb"] * 8, "1g.5gb"),
        (["4g.20gb", "4g.20gb"], "4g.20gb"),
        (["7g.40gb", "1g.5gb"], ""),
        (["3g.20gb"] * 3, "3g.20gb"),
    ],
)
def test_invalid_mig_layout(policy, layout, fragment):
    policy["node_groups"][0]["sharing"][1]["layout"] = layout
    one(policy, "node_groups[0].sharing[1].layout", fragment)


def test_two_4g_on_a100_has_no_placement(policy):
    policy["node_groups"][0]["sharing"][1]["layout"] = ["4g.20gb", "4g.20gb"]
    found = " ".join(problems(policy))
    assert "placement" in found or "max" in found


def test_unknown_mig_profile_lists_known(policy):
    policy["node_groups"][0]["sharing"][1]["layout"] = ["3g.40gb"]
    one(policy, "node_groups[0].sharing[1].layout", "1g.5gb")


def test_unknown_named_layout_lists_known(policy):
    policy["node_groups"][0]["sharing"][1]["layout"] = "all-9g"
    one(policy, "node_groups[0].sharing[1].layout", "all-1g.5gb")


def test_named_layout_resolves(policy):
    policy["node_groups"][0]["sharing"][1]["layout"] = "all-1g.5gb"
    site = build_site(policy, "t.yaml")
    assert site.groups[0].gpus[2].layout == ("1g.5gb",) * 7


def test_mig_on_non_mig_model(policy):
    policy["node_groups"][0]["gpu"]["model"] = "L40S"
    one(policy, "node_groups[0].sharing[1].mode", "L40S does not support MIG")


def test_mps_and_shard_on_one_node(policy):
    policy["node_groups"][0]["sharing"][0] = {"gpus": "0-1", "mode": "mps", "units": 100}
    one(policy, "node_groups[0].sharing", "mps and shard on the same node are not supported")


def test_mig_with_shard_before_23_02_7(policy):
    found = problems(policy, slurm_version="23.02.6")
    assert any("Bug 17482" in p for p in found), found
    assert any(p.startswith("cluster.slurm_version:") and "not supported" in p for p in found)


def test_mig_with_shard_fixed_in_23_02_7(policy):
    found = problems(policy, slurm_version="23.02.7")
    assert not any("Bug 17482" in p for p in found), found


def test_mig_with_shard_allowed_on_supported_versions(policy):
    build_site(policy, "t.yaml", slurm_version="26.05")


@pytest.mark.parametrize("replicas", [1, 0, -3, 2000])
def test_replicas_bounds(policy, replicas):
    policy["node_groups"][0]["sharing"][2]["replicas"] = replicas
    one(policy, "node_groups[0].sharing[2].replicas", "replicas must be >= 2")


def test_replicas_required_for_shard(policy):
    del policy["node_groups"][0]["sharing"][2]["replicas"]
    one(policy, "node_groups[0].sharing[2].replicas", "required for mode shard")


@pytest.mark.parametrize("units", [3, 30, 1, 200])
def test_mps_units_must_give_integer_percentages(policy, units):
    policy["node_groups"][0]["sharing"][2] = {"gpus": 3, "mode": "mps", "units": units}
    one(policy, "node_groups[0].sharing[2].units", "allowed: 2, 4, 5, 10, 20, 25, 50, 100")


def test_mps_units_ok(policy):
    policy["node_groups"][0]["sharing"][2] = {"gpus": 3, "mode": "mps", "units": 25}
    site = build_site(policy, "t.yaml")
    assert site.groups[0].gres[("mps", "")] == 25


def test_key_of_another_mode(policy):
    policy["node_groups"][0]["sharing"][0]["replicas"] = 4
    one(policy, "node_groups[0].sharing[0].replicas", "it applies to mode shard")


def test_unknown_mode_lists_modes(policy):
    policy["node_groups"][0]["sharing"][0]["mode"] = "timeslice"
    one(policy, "node_groups[0].sharing[0].mode", "allowed: exclusive, mig, shard, mps")


def test_unknown_gpu_model_lists_known(policy):
    policy["node_groups"][0]["gpu"]["model"] = "H300"
    one(policy, "node_groups[0].gpu.model", "H100-SXM5-80GB")


def test_overlapping_hostlists(policy):
    second = dict(policy["node_groups"][0], name="h", nodes="gpu-[02-03]")
    policy["node_groups"].append(second)
    one(policy, "node_groups[1].nodes", "node gpu-02 is also in node_groups[0]")


@pytest.mark.parametrize("nodes", ["gpu-[01-", "gpu-[05-01]", "gpu[1-2]]"])
def test_malformed_hostlist(policy, nodes):
    policy["node_groups"][0]["nodes"] = nodes
    one(policy, "node_groups[0].nodes", "not a valid hostlist")


def test_node_listed_twice(policy):
    policy["node_groups"][0]["nodes"] = "gpu-01,gpu-01"
    one(policy, "node_groups[0].nodes", "listed twice")


def test_hostile_node_name(policy):
    policy["node_groups"][0]["nodes"] = "gpu;rm -rf"
    one(policy, "node_groups[0].nodes", "not a valid node name")


@pytest.mark.parametrize("gpus", ["4", "0-7", 9])
def test_gpu_index_out_of_range(policy, gpus):
    policy["node_groups"][0]["sharing"][0]["gpus"] = gpus
    one(policy, "node_groups[0].sharing[0].gpus", "out of range: this group has 4 GPU(s), indexes 0-3")


@pytest.mark.parametrize("gpus", ["a", "1-", "3-1", "0..2"])
def test_gpu_index_malformed(policy, gpus):
    policy["node_groups"][0]["sharing"][0]["gpus"] = gpus
    one(policy, "node_groups[0].sharing[0].gpus", "")


@pytest.mark.parametrize(
    "indexes, text",
    [
        ([0], "0"),
        ([3], "3"),
        ([0, 1], "0-1"),
        ([0, 1, 2, 3], "0-3"),
        ([4, 5], "4-5"),
        ([0, 2], "0,2"),
        ([0, 1, 2, 5], "0-2,5"),
        ([1, 3, 4, 5, 7], "1,3-5,7"),
        ([5, 0, 1], "0-1,5"),
        ([2, 2, 3], "2-3"),
    ],
)
def test_format_indexes_is_the_inverse_of_parse_indexes(indexes, text):
    assert format_indexes(indexes) == text
    assert parse_indexes(text, 8) == sorted(set(indexes))
    assert format_indexes(parse_indexes(text, 8)) == text


def test_every_index_set_of_a_small_group_round_trips():
    from itertools import combinations

    for n in range(1, 7):
        for chosen in combinations(range(6), n):
            assert parse_indexes(format_indexes(chosen), 6) == list(chosen)


def test_gpus_value_writes_one_gpu_as_a_number():
    assert gpus_value([3]) == 3 and gpus_value(range(0, 1)) == 0
    assert gpus_value(range(0, 4)) == "0-3" and gpus_value([0, 2]) == "0,2"
    with pytest.raises(ValueError, match="at least one GPU"):
        format_indexes([])


def test_gpu_covered_twice(policy):
    policy["node_groups"][0]["sharing"][0]["gpus"] = "0-2"
    one(policy, "node_groups[0].sharing[1].gpus", "GPU 2 already has a sharing mode")


def test_unlisted_gpus_are_exclusive(policy):
    policy["node_groups"][0]["sharing"] = [{"gpus": 3, "mode": "shard", "replicas": 2}]
    site = build_site(policy, "t.yaml")
    assert [s.mode for s in site.groups[0].gpus] == ["exclusive"] * 3 + ["shard"]


@pytest.mark.parametrize("shares", [0, -5, "lots"])
def test_tenant_shares_must_be_positive(policy, shares):
    policy["tenants"][0]["shares"] = shares
    one(policy, "tenants[0].shares", "positive integer")


def test_tenant_shares_parent_allowed(policy):
    policy["tenants"].append({"name": "b", "shares": "parent", "parent": "a"})
    build_site(policy, "t.yaml")


def test_tenant_unknown_parent_and_cycle(policy):
    policy["tenants"] = [
        {"name": "a", "shares": 1, "parent": "b"},
        {"name": "b", "shares": 1, "parent": "a"},
        {"name": "c", "shares": 1, "parent": "zz"},
    ]
    found = problems(policy)
    assert any("parent cycle" in p for p in found)
    assert any(p.startswith("tenants[2].parent") and "'zz' is not a tenant" in p for p in found)


def test_duplicate_tenant(policy):
    policy["tenants"].append({"name": "a", "shares": 2})
    one(policy, "tenants[1].name", "already defined at tenants[0]")


def test_tier_preempt_suspend_rejected(policy):
    policy["tiers"][0]["preempt_mode"] = "SUSPEND"
    one(policy, "tiers[0].preempt_mode", "suspended jobs keep their GRES; use requeue or cancel")


def test_tier_preempt_gang_rejected(policy):
    policy["tiers"][0]["preempt_mode"] = "gang"
    one(policy, "tiers[0].preempt_mode", "use one of off, requeue, cancel")


def test_tier_grace_time_needs_preemption(policy):
    policy["tiers"][0]["grace_time"] = 60
    one(policy, "tiers[0].grace_time", "its preempt_mode is off; set preempt_mode to requeue or cancel")
    policy["tiers"][0]["preempt_mode"] = "requeue"
    assert build_site(policy, "test.yaml").tiers[0].spec.grace_time == 60
    policy["tiers"][0]["grace_time"] = -1
    one(policy, "tiers[0].grace_time", "greater than or equal to 0")


def test_tier_unknown_node_group(policy):
    policy["tiers"][0]["node_groups"] = ["nope"]
    one(policy, "tiers[0].node_groups[0]", "'nope' is not a node group; known: g")


def test_two_default_tiers(policy):
    policy["tiers"] = [
        {"name": "a", "node_groups": ["g"], "default": True},
        {"name": "b", "node_groups": ["g"], "default": True},
    ]
    one(policy, "tiers[1].default", "only one tier can be the default")


def test_tier_gpu_type_must_exist(policy):
    policy["tiers"][0]["gpu_types"] = ["h100"]
    one(policy, "tiers[0].gpu_types[0]", "available: a100_40g, a100_40g_3g.20gb")


def test_tier_conflicting_shard_weights(policy):
    second = dict(
        policy["node_groups"][0], name="h", nodes="gpu-[03-04]", sharing=[{"gpus": 3, "mode": "shard", "replicas": 2}]
    )
    policy["node_groups"].append(second)
    policy["tiers"][0]["node_groups"] = ["g", "h"]
    one(policy, "tiers[0]", "GRES/shard would need several billing weights in one partition")


def test_alias_targets(policy):
    policy["submission"] = {"aliases": {"big": "gpu:h100", "half": "mps:50", "x": "tpu:1", "a100_40g": "shard"}}
    found = problems(policy)
    assert any(p.startswith("submission.aliases.big") and "does not exist on this cluster" in p for p in found)
    assert any(p.startswith("submission.aliases.half") and "no node group shares GPUs with MPS" in p for p in found)
    assert any(p.startswith("submission.aliases.x") and "accepted: 'gpu:<type>'" in p for p in found)
    assert any(p.startswith("submission.aliases.a100_40g") and "cannot shadow" in p for p in found)


def test_billing_weight_unknown_model(policy):
    policy["billing"] = {"gpu_weights": {"H300": 1.0}}
    one(policy, "billing.gpu_weights.H300", "A100-SXM4-40GB")


@pytest.mark.parametrize("value", ["22.05", "23.02"])
def test_old_slurm_rejected(policy, value):
    policy["cluster"]["slurm_version"] = value
    one(policy, "cluster.slurm_version", "not supported: 23.11 or newer")


def test_slurm_version_float_is_refused(policy):
    policy["cluster"]["slurm_version"] = 24.11
    one(policy, "cluster.slurm_version", "quote it")


def test_every_problem_reported_at_once(policy):
    policy["tenants"][0]["shares"] = 0
    policy["tiers"][0]["preempt_mode"] = "suspend"
    policy["node_groups"][0]["sharing"][2]["replicas"] = 1
    policy["cluster"]["slurm_version"] = "21.08"
    assert len(problems(policy)) == 4


def test_duplicate_yaml_key_rejected():
    with pytest.raises(PolicyError) as info:
        load_bytes(b"version: 1\nversion: 1\n", "dup.yaml")
    assert "duplicate key 'version'" in info.value.report()


def test_not_a_mapping():
    with pytest.raises(PolicyError) as info:
        load_bytes(b"- a\n- b\n", "list.yaml")
    assert "must be a YAML mapping" in info.value.report()


def test_bad_yaml():
    with pytest.raises(PolicyError) as info:
        load_bytes(b"version: [1\n", "bad.yaml")
    assert "not valid YAML" in info.value.report()


def test_hostile_hook_path(policy):
    policy["cluster"]["hooks"] = {"prolog": "/usr/bin/x; rm -rf /"}
    one(policy, "cluster.hooks.prolog", "pattern")


def test_custom_type_cannot_name_two_models(policy):
    second = dict(
        policy["node_groups"][0],
        name="h",
        nodes="gpu-[03-04]",
        gpu={"model": "H100-SXM5-80GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "exclusive", "type": "a100_40g"}],
    )
    policy["node_groups"].append(second)
    one(policy, "node_groups[1].sharing", "GPU type 'a100_40g' is used for both A100-SXM4-40GB and H100-SXM5-80GB")


def test_group_for_node(policy):
    site = build_site(policy, "t.yaml")
    assert site.group_for_node("gpu-02").name == "g"
    with pytest.raises(KeyError, match="gpu-99"):
        site.group_for_node("gpu-99")


# ---- cluster.scheduler: SchedulerParameters ---------------------------------------------------


def _sched_site(scheduler):
    from pathlib import Path

    import yaml as _yaml

    raw = _yaml.safe_load((Path(__file__).resolve().parents[3] / "etc" / "small-lab.yaml").read_text())
    raw["cluster"]["scheduler"] = scheduler
    return load_bytes(_yaml.safe_dump(raw).encode(), "t.yaml")


def test_scheduler_parameters_default_and_overrides():
    from slurm_gpushare.render import render_all

    assert (
        _sched_site({}).cluster.scheduler.rendered()
        == "bf_continue,bf_interval=10,bf_min_age_reserve=300,nohold_on_prolog_fail"
    )
    site = _sched_site({"parameters": {"bf_interval": 30, "nohold_on_prolog_fail": False, "defer": True}})
    assert site.cluster.scheduler.rendered() == "bf_continue,bf_interval=30,bf_min_age_reserve=300,defer"
    assert "SchedulerParameters=bf_continue,bf_interval=30" in render_all(site)["slurm.conf"]
    none = _sched_site({"slurm_defaults": True})
    assert none.cluster.scheduler.rendered() == "" and "SchedulerParameters" not in render_all(none)["slurm.conf"]


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"bf_intervall": 10}, "'bf_intervall' is not a SchedulerParameters option of Slurm 24.11"),
        ({"defer": 1}, "defer: an option without a value: give true (on) or false (off), not 1"),
        ({"bf_interval": True}, "bf_interval: a whole number >= 0 (or false to leave it out), not True"),
        ({"bf_interval": -1}, "bf_interval: a whole number >= 0"),
        ({"bf_hetjob_prio": "mid"}, "bf_hetjob_prio: min, avg or max (or false), not 'mid'"),
    ],
)
def test_scheduler_parameters_refused_with_the_option_named(params, needle):
    with pytest.raises(PolicyError) as err:
        _sched_site({"parameters": params})
    assert needle in err.value.report() and "cluster.scheduler" in err.value.report(), err.value.report()
