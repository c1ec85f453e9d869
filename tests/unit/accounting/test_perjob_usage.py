"""Per-job MIG in usage and fair share: a job on a per-job tier holds its slice as weight(p) carrier shards per
node (sacct AllocTRES gres/shard=<weight>); it is counted in GPU-equivalents as the fixed slice of the same profile,
also where a carrier shard bills more than its slice (the A30's 2g.12gb+me: weight 5, carrier 1/8 of a GPU)."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import yaml

from slurm_gpushare.accounting.usage import GpuConverter, aggregate
from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.billing import carrier_fraction
from slurm_gpushare.slurm.sacct import JobRecord
from tests.conftest import ROOT

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
T0, HOUR = 1740787200.0, 3600.0


@cache
def _raw() -> dict:
    return yaml.safe_load(POLICY.read_text(encoding="utf-8"))


def site(model: str = "A100-SXM4-40GB", profiles: list[str] | None = None, layout: list[str] | None = None):
    """perjob-lab with its per-job group (tier perjob) and its fixed-MIG group (tier batch) of ``model``."""
    raw = copy.deepcopy(_raw())
    groups = {g["name"]: g for g in raw["node_groups"]}
    for name in ("lab-mig", "lab-perjob"):
        groups[name]["gpu"]["model"] = model
    entry = groups["lab-perjob"]["sharing"][0]
    entry.pop("profiles") if profiles is None else entry.update(profiles=profiles)
    if layout is not None:
        groups["lab-mig"]["sharing"][0]["layout"] = layout
        raw["submission"]["aliases"] = {}
    raw["billing"]["gpu_weights"] = {"L40S": 100, model: 100}
    return build_site(raw, "perjob-lab")


def slot(s):
    return next(x for g in s.groups for x in g.gpus if x.share.is_per_job_mig)


def per_job(s, profile: str, nodes: int = 1):
    w = slot(s).share.weight(profile)
    return GpuConverter(s).convert("perjob", f"billing=9,cpu=1,gres/shard={w * nodes},mem=1G,node={nodes}")


def fixed(s, profile: str, nodes: int = 1):
    t = slot(s).model.mig_slurm_type(profile)
    return GpuConverter(s).convert("batch", f"billing=9,cpu=1,gres/gpu:{t}={nodes},gres/gpu={nodes},node={nodes}")


@pytest.mark.parametrize("profile", ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"])
def test_a_per_job_slice_is_the_fixed_slice_of_its_profile(profile):
    s = site(layout=[profile])
    assert per_job(s, profile).kinds == fixed(s, profile).kinds
    assert per_job(s, profile, nodes=2).gpus == pytest.approx(2 * fixed(s, profile).gpus)


def test_where_a_carrier_shard_bills_more_the_slice_still_counts_as_itself():
    s = site("A30-24GB", layout=["2g.12gb+me", "2g.12gb"])
    assert slot(s).share.weight("2g.12gb+me") * carrier_fraction(slot(s)) == pytest.approx(5 / 8)  # billing's
    assert per_job(s, "2g.12gb+me").kinds == fixed(s, "2g.12gb+me").kinds == (("gpu:a30_2g.12gb_me", 0.5),)
    assert per_job(s, "2g.12gb").gpus == pytest.approx(0.5)


def test_shards_that_carry_no_slice_keep_the_carrier_fraction():
    s = site()
    odd = GpuConverter(s).convert("perjob", "gres/shard=3,node=1")  # no profile weighs 3 (not from the filter)
    assert odd.kinds == (("shard", pytest.approx(3 * carrier_fraction(slot(s)))),)
    assert GpuConverter(s).convert("shared", "gres/shard=1,node=1").kinds == (("shard", 0.25),)  # time-sliced


def test_usage_and_fair_share_count_per_job_and_fixed_slices_alike():
    s = site("A30-24GB", layout=["2g.12gb+me", "2g.12gb"])
    w = slot(s).share.weight("2g.12gb+me")
    records = [
        JobRecord(
            "1", "alice", "physics", "perjob", "COMPLETED", T0, T0 + HOUR, 3600,
            f"gres/shard={w},node=1", "", "perjob",
        ),
        JobRecord(
            "2", "bob", "physics", "batch", "COMPLETED", T0, T0 + HOUR, 3600,
            "gres/gpu:a30_2g.12gb_me=1,gres/gpu=1,node=1", "", "batch",
        ),
    ]  # fmt: skip
    agg = aggregate(s, records, T0, T0 + 2 * HOUR, by="user", half_life=7 * 86400)
    alice, bob = agg.groups["alice"], agg.groups["bob"]
    assert alice.gpu_seconds == pytest.approx(bob.gpu_seconds) == pytest.approx(0.5 * HOUR)
    assert alice.fs_seconds == pytest.approx(bob.fs_seconds)
    kinds = aggregate(s, records, T0, T0 + 2 * HOUR, by="gpu-kind").groups
    assert set(kinds) == {"gpu:a30_2g.12gb_me"} and kinds["gpu:a30_2g.12gb_me"].jobs == 2


def test_custom_carrier_weights_are_read_back_as_their_profiles():
    """A site's own weights (carrier_weights): a job holding the raised weight of 1g.5gb is a 1g.5gb slice in
    usage and fair share, as with the exact weights."""
    raw = copy.deepcopy(_raw())
    entry = next(g for g in raw["node_groups"] if g["name"] == "lab-perjob")["sharing"][0]
    entry["carrier_weights"] = {"1g.5gb": 3, "2g.10gb": 5, "3g.20gb": 7, "4g.20gb": 8, "7g.40gb": 14}
    raw["billing"]["gpu_weights"] = {"L40S": 100, "A100-SXM4-40GB": 100}
    s = build_site(raw, "perjob-lab")
    assert slot(s).share.weight("1g.5gb") == 3
    assert per_job(s, "1g.5gb").kinds == fixed(s, "1g.5gb").kinds  # lab-mig's fixed layout is 1g.5gb slices
    model = slot(s).model
    for profile in ("2g.10gb", "3g.20gb"):
        kind = f"gpu:{model.mig_slurm_type(profile)}"
        assert per_job(s, profile).kinds == ((kind, pytest.approx(model.profile(profile).fraction(model))),)
    record = JobRecord(
        "1", "alice", "physics", "perjob", "COMPLETED", T0, T0 + HOUR, 3600, "gres/shard=3,node=1", "", "perjob"
    )
    kinds = aggregate(s, [record], T0, T0 + 2 * HOUR, by="gpu-kind").groups
    assert set(kinds) == {"gpu:a100_40g_1g.5gb"}
    assert kinds["gpu:a100_40g_1g.5gb"].gpu_seconds == pytest.approx(HOUR / 7)
