"""Per-job MIG in the policy (issue 35): the share, its carrier weights, and every rule that refuses it."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import yaml

from slurm_gpushare.errors import PolicyError
from slurm_gpushare.hardware import get_model
from slurm_gpushare.hardware.migweights import placeable_multisets
from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.billing import tier_fractions, unit_fractions
from slurm_gpushare.policy.perjob import default_weights
from slurm_gpushare.policy.share import Mode, Share
from tests.conftest import ROOT

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


@cache
def _raw() -> dict:
    return yaml.safe_load(POLICY.read_text(encoding="utf-8"))


def raw() -> dict:
    return copy.deepcopy(_raw())


def problems(policy: dict) -> list[str]:
    with pytest.raises(PolicyError) as info:
        build_site(policy, "t.yaml")
    return [str(p) for p in info.value.problems]


def one(policy: dict, path: str, *fragments: str) -> None:
    found = problems(policy)
    assert any(p.startswith(path + ":") and all(f in p for f in fragments) for p in found), found


def perjob_entry(policy: dict) -> dict:
    return policy["node_groups"][3]["sharing"][0]


def test_a_per_job_range_is_the_whole_gpu_plus_its_carrier_shards():
    site = build_site(raw(), "t.yaml")
    group = site.group("lab-perjob")
    share = group.gpus[0].share
    assert share.mode is Mode.MIG and share.per_job and share.is_per_job_mig and not share.is_mig
    assert share.profiles == tuple(PROFILES)
    assert (share.weights, share.capacity) == ((2, 4, 7, 8, 14), 15)
    assert (share.shared_gres, share.shared_count) == ("shard", 15)
    assert group.gres == {("gpu", "a100_40g"): 2, ("shard", ""): 30}
    assert group.slice_types == {
        "a100_40g_1g.5gb": 2,
        "a100_40g_2g.10gb": 4,
        "a100_40g_3g.20gb": 7,
        "a100_40g_4g.20gb": 8,
        "a100_40g_7g.40gb": 14,
    }
    assert share.weight("3g.20gb") == 7
    with pytest.raises(KeyError):
        share.weight("1g.10gb")
    assert share.text == "mig per job (1g.5gb=2, 2g.10gb=4, 3g.20gb=7, 4g.20gb=8, 7g.40gb=14 of 15)"


def test_the_weights_admit_exactly_the_sets_that_fit():
    """The proof for the test policy's set: every multiset within the capacity's reach fits iff it weighs <= C."""
    share = build_site(raw(), "t.yaml").group("lab-perjob").gpus[0].share
    fit = placeable_multisets(get_model("A100-SXM4-40GB"), share.profiles)
    bounds = [share.capacity // w + 1 for w in share.weights]
    from itertools import product

    for counts in product(*(range(b + 1) for b in bounds)):
        weighs = sum(w * n for w, n in zip(share.weights, counts, strict=True))
        assert (weighs <= share.capacity) == (counts in fit), counts


def test_share_round_trips_through_the_policy_entry_and_the_node_spec_json():
    share = build_site(raw(), "t.yaml").group("lab-perjob").gpus[0].share
    assert share.to_entry() == {"mode": "mig", "per_job": True, "profiles": PROFILES}
    assert Share.from_entry(share.to_entry()) == Share(Mode.MIG, per_job=True, profiles=tuple(PROFILES))
    assert Share.from_json(share.to_json()) == share
    old = {k: v for k, v in Share(Mode.MIG, ("1g.5gb",)).to_json().items() if k not in ("per_job", "profiles")}
    assert Share.from_json({k: v for k, v in old.items() if k not in ("weights", "capacity")}).is_mig


def test_a_fixed_range_is_unchanged():
    share = build_site(raw(), "t.yaml").group("lab-mig").gpus[0].share
    assert (
        share.is_mig
        and not share.is_per_job_mig
        and share.shared_gres == ""
        and share.to_entry().keys()
        == {
            "mode",
            "layout",
        }
    )


def test_default_profiles_are_a_largest_exactly_weighted_set():
    a30 = default_weights(get_model("A30-24GB"))
    assert a30 is not None
    assert (a30.profiles, a30.weights, a30.capacity) == (
        ("1g.6gb", "2g.12gb", "2g.12gb+me", "4g.24gb"),
        (2, 4, 5, 8),
        9,
    )


def test_a_profile_set_without_exact_weights_is_refused_naming_the_largest_that_have_them():
    policy = raw()
    perjob_entry(policy)["profiles"] = ["1g.5gb", "1g.5gb+me", "4g.20gb"]
    found = [p for p in problems(policy) if p.startswith("node_groups[3].sharing[0].profiles:")]
    assert len(found) == 1, found
    text = found[0]
    assert "[1g.5gb, 1g.5gb+me, 4g.20gb] on A100-SXM4-40GB have no exact carrier weights" in text
    assert "The largest subsets that have them: [" in text


@pytest.mark.parametrize(
    "change, path, fragment",
    [
        ({"profiles": ["9g.1tb"]}, "node_groups[3].sharing[0].profiles", "unknown MIG profile '9g.1tb'"),
        ({"profiles": ["1g.5gb", "1g.5gb"]}, "node_groups[3].sharing[0].profiles", "name each allowed profile once"),
        ({"layout": "all-1g.5gb"}, "node_groups[3].sharing[0].layout", "a per-job range has no fixed layout"),
        ({"per_job": False}, "node_groups[3].sharing[0].profiles", "only for per_job: true"),
        ({"mode": "shard", "replicas": 4}, "node_groups[3].sharing[0].per_job", "not used by mode shard"),
        ({"on_slice_failure": "retry"}, "node_groups[3].sharing[0].on_slice_failure", "'requeue' or 'fail'"),
        (
            {"per_job": None, "profiles": None, "layout": "all-1g.5gb", "on_slice_failure": "fail"},
            "node_groups[3].sharing[0].on_slice_failure",
            "only for per_job: true",
        ),
    ],
)
def test_wrong_per_job_entries_are_refused(change, path, fragment):
    policy = raw()
    perjob_entry(policy).update(change)
    one(policy, path, fragment)


def test_per_job_on_a_model_without_mig_is_refused():
    policy = raw()
    policy["node_groups"][3]["gpu"]["model"] = "L40S"
    del perjob_entry(policy)["profiles"]
    one(policy, "node_groups[3].sharing[0].per_job", "L40S does not support MIG")


def test_one_profiles_list_per_group_and_no_shard_or_mps_gpus_beside():
    policy = raw()
    policy["node_groups"][3]["sharing"] = [
        {"gpus": 0, "mode": "mig", "per_job": True, "profiles": PROFILES},
        {"gpus": 1, "mode": "mig", "per_job": True, "profiles": ["1g.5gb", "7g.40gb"]},
    ]
    one(policy, "node_groups[3].sharing", "must allow the same profiles")
    policy["node_groups"][3]["sharing"][1] = {"gpus": 1, "mode": "mps", "units": 100}
    one(policy, "node_groups[3].sharing", "cannot share a node with mps GPUs")


def test_a_tier_mixing_fixed_and_per_job_slices_of_one_type_is_refused():
    policy = raw()
    policy["tiers"][1]["node_groups"] = ["lab-perjob", "lab-mig"]
    one(policy, "tiers[1].node_groups", "a100_40g_1g.5gb would be both fixed and per-job")


def test_a_tier_with_time_sliced_gpus_beside_per_job_ones_is_refused():
    policy = raw()
    policy["tiers"][1]["node_groups"] = ["lab-perjob", "lab-shard"]
    one(policy, "tiers[1].node_groups", "time-sliced GPUs (lab-shard)")


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task_prolog", "job_submit_lua"])
def test_per_job_needs_the_hooks_and_the_filter(hook):
    policy = raw()
    del policy["cluster"]["hooks"][hook]
    one(policy, f"cluster.hooks.{hook}", "required by per-job MIG")


def test_per_job_needs_device_cgroups():
    policy = raw()
    policy["cluster"]["cgroups"] = False
    one(policy, "cluster.cgroups", "per-job MIG needs device cgroups")


def test_a_per_job_slice_bills_what_a_fixed_slice_of_its_profile_bills():
    site = build_site(raw(), "t.yaml")
    fixed = dict(unit_fractions(site.group("lab-mig")))
    per_shard = dict(unit_fractions(site.group("lab-perjob")))["shard"]
    share = site.group("lab-perjob").gpus[0].share
    model = get_model("A100-SXM4-40GB")
    for profile in share.profiles:
        assert share.weight(profile) * per_shard == pytest.approx(model.profile(profile).fraction(model))
    assert per_shard * share.weight("1g.5gb") == pytest.approx(fixed["gpu:a100_40g_1g.5gb"])
    assert tier_fractions(next(t for t in site.tiers if t.name == "perjob").groups)["gres/shard"] == pytest.approx(
        1 / 14
    )
    assert dict(next(t for t in site.tiers if t.name == "perjob").billing)["GRES/shard"] == pytest.approx(
        100 / 14, abs=1e-5
    )


def test_an_aliased_per_job_type_is_a_valid_alias_target():
    policy = raw()
    policy["submission"]["aliases"]["half"] = "gpu:a100_40g_3g.20gb"
    site = build_site(policy, "t.yaml")
    assert site.policy.submission.aliases["half"] == "gpu:a100_40g_3g.20gb"


def test_a_refused_slice_is_requeued_unless_the_policy_says_fail():
    share = build_site(raw(), "t.yaml").group("lab-perjob").gpus[0].share
    assert share.on_slice_failure == "requeue" and "on_slice_failure" not in share.to_entry()
    policy = raw()
    perjob_entry(policy)["on_slice_failure"] = "fail"
    share = build_site(policy, "t.yaml").group("lab-perjob").gpus[0].share
    assert share.on_slice_failure == "fail" and share.to_entry()["on_slice_failure"] == "fail"
    assert Share.from_json(share.to_json()) == share
    assert build_site(raw(), "t.yaml").group("lab-mig").gpus[0].share.on_slice_failure == ""


# ---- isolation (issue 35, part 4) ---------------------------------------------------------------------


def test_per_job_gpus_are_isolated_where_slurm_can_and_not_before():
    assert build_site(raw(), "t.yaml").group("lab-perjob").gpus[0].share.isolated
    for version in ("24.11", "25.05", "26.05"):
        assert build_site(raw(), "t.yaml", slurm_version=version).group("lab-perjob").gpus[0].share.isolated
    old = build_site(raw(), "t.yaml", slurm_version="24.05").group("lab-perjob").gpus[0].share
    assert old.is_per_job_mig and old.isolation == "none" and not old.isolated


def test_isolation_none_is_kept_and_round_trips():
    policy = raw()
    perjob_entry(policy)["isolation"] = "none"
    share = build_site(policy, "t.yaml").group("lab-perjob").gpus[0].share
    assert not share.isolated and share.to_entry()["isolation"] == "none"
    assert Share.from_json(share.to_json()) == share


def test_isolation_where_slurm_cannot_have_it_is_refused():
    policy = raw()
    policy["cluster"]["slurm_version"] = "24.05"
    perjob_entry(policy)["isolation"] = "namespace"
    one(policy, "node_groups[3].sharing[0].isolation", "needs Slurm 24.11 or newer", "isolation: none")


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"isolation": "private"}, "'namespace' or 'none'"),
        ({"per_job": None, "profiles": None, "layout": "all-1g.5gb", "isolation": "none"}, "only for per_job: true"),
    ],
)
def test_wrong_isolation_entries_are_refused(change, fragment):
    policy = raw()
    perjob_entry(policy).update(change)
    one(policy, "node_groups[3].sharing[0].isolation", fragment)


# ---- carrier_weights: the site's own weights -------------------------------------------------------------------

RAISED = {"1g.5gb": 3, "2g.10gb": 5, "3g.20gb": 7, "4g.20gb": 8, "7g.40gb": 14}  # exact: 2, 4, 7, 8, 14 of 15


def with_weights(weights: dict) -> dict:
    policy = raw()
    perjob_entry(policy)["carrier_weights"] = weights
    return policy


def test_raised_carrier_weights_are_taken_at_the_exact_count_and_round_trip():
    share = build_site(with_weights(RAISED), "t.yaml").group("lab-perjob").gpus[0].share
    assert (share.weights, share.capacity, share.tuned) == ((3, 5, 7, 8, 14), 15, True)
    assert share.to_entry()["carrier_weights"] == RAISED
    assert Share.from_json(share.to_json()) == share
    fit = placeable_multisets(get_model("A100-SXM4-40GB"), share.profiles)
    from itertools import product

    for counts in product(*(range(share.capacity // w + 1) for w in share.weights)):  # every admitted set fits
        if sum(w * n for w, n in zip(share.weights, counts, strict=True)) <= share.capacity:
            assert counts in fit, counts


def test_carrier_weights_name_profiles_as_profiles_does():
    weights = {("1G.5GB" if k == "1g.5gb" else k): v for k, v in RAISED.items()}  # any case, as profiles takes
    share = build_site(with_weights(weights), "t.yaml").group("lab-perjob").gpus[0].share
    assert share.weight("1g.5gb") == 3
    twice = problems(with_weights({**RAISED, "1G.5GB": 6}))
    assert any("1g.5gb is given twice" in p for p in twice), twice


def test_weights_admitting_a_set_that_does_not_fit_are_refused_naming_it():
    one(
        with_weights({**RAISED, "1g.5gb": 1}),
        "node_groups[3].sharing[0].carrier_weights",
        "admit 8 x 1g.5gb on one GPU (weighs 8 of 15)",
        "does not fit on A100-SXM4-40GB",
    )
    found = problems(with_weights({**RAISED, "1g.5gb": 2, "2g.10gb": 3}))
    assert any("carrier_weights: these weights admit" in p and "2g.10gb" in p for p in found), found


def test_two_profiles_of_one_weight_are_refused():
    one(
        with_weights({**RAISED, "1g.5gb": 5}),
        "node_groups[3].sharing[0].carrier_weights",
        "1g.5gb and 2g.10gb both weigh 5",
        "its own weight",
    )


@pytest.mark.parametrize(
    ("weights", "fragments"),
    [
        ({k: v for k, v in RAISED.items() if k != "4g.20gb"}, ("no weight for 4g.20gb", "1g.5gb, 2g.10gb, 3g.20gb")),
        ({**RAISED, "1g.10gb": 6}, ("1g.10gb not among the allowed profiles",)),
        ({**RAISED, "7g.40gb": 16}, ("7g.40gb=16", "from 1 to the shard Count per GPU (15)")),
        ({**RAISED, "1g.5gb": 0}, ("1g.5gb=0",)),
    ],
)
def test_missing_extra_or_out_of_range_weights_are_refused(weights, fragments):
    one(with_weights(weights), "node_groups[3].sharing[0].carrier_weights", *fragments)


def test_an_unknown_profile_in_carrier_weights_is_refused_naming_the_allowed():
    one(
        with_weights({**RAISED, "9g.1tb": 20}),
        "node_groups[3].sharing[0].carrier_weights.9g.1tb",
        "give a weight for each of: 1g.5gb, 2g.10gb",
    )


def test_carrier_weights_only_on_a_per_job_range():
    policy = raw()
    index = next(i for i, g in enumerate(policy["node_groups"]) if g["name"] == "lab-mig")
    policy["node_groups"][index]["sharing"][0]["carrier_weights"] = RAISED
    one(policy, f"node_groups[{index}].sharing[0].carrier_weights", "only for per_job: true")


def test_custom_weights_reach_billing_and_the_submission_tables():
    from slurm_gpushare.policy.billing import carried_slices
    from slurm_gpushare.submit.tables import slice_caps

    site = build_site(with_weights(RAISED), "t.yaml")
    groups = next(t for t in site.tiers if t.name == "perjob").groups
    assert carried_slices(groups)[3] == ("gpu:a100_40g_1g.5gb", pytest.approx(1 / 7))
    assert carried_slices(groups)[5][0] == "gpu:a100_40g_2g.10gb"
    assert slice_caps(groups)["a100_40g_1g.5gb"] == (3, "1g.5gb")
