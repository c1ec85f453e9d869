"""policy/share.py: a GPU's share, the one type every room asks (GRES, shared count, keys, text, entries, JSON)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_gpushare.policy.share import KEYS, MODES, SHARING_KEYS, Mode, Share, misplaced_keys, parse_mode
from slurm_gpushare.records import FrozenInstanceError


def mig_type(profile: str) -> str:
    return f"a100_40g_{profile}"


def test_modes_are_the_policy_text():
    assert MODES == ("exclusive", "mig", "shard", "mps")
    assert parse_mode(" MPS ") is Mode.MPS and f"{Mode.SHARD}" == "shard" and Mode.MIG == "mig"
    with pytest.raises(ValueError, match="'time' is not a sharing mode; allowed: exclusive, mig, shard, mps"):
        parse_mode("time")


@pytest.mark.parametrize(
    ("share", "gres", "shared", "text"),
    [
        (Share(), (("gpu", "a100_40g", 1),), ("", 0), "exclusive"),
        (Share(type="a100_res"), (("gpu", "a100_res", 1),), ("", 0), "exclusive"),
        (Share(Mode.SHARD, replicas=4), (("gpu", "a100_40g", 1), ("shard", "", 4)), ("shard", 4), "shard (4 replicas)"),
        (Share(Mode.MPS, units=100), (("gpu", "a100_40g", 1), ("mps", "", 100)), ("mps", 100), "mps (100 units)"),
        (
            Share(Mode.MIG, ("3g.20gb", "1g.5gb")),
            (("gpu", "a100_40g_3g.20gb", 1), ("gpu", "a100_40g_1g.5gb", 1)),
            ("", 0),
            "mig (3g.20gb+1g.5gb)",
        ),
    ],
)
def test_a_share_answers_its_gres_shared_count_and_text(share, gres, shared, text):
    assert share.gres("a100_40g", mig_type) == gres
    assert (share.shared_gres, share.shared_count) == shared
    assert share.text == text
    assert share.is_mig == (share.mode is Mode.MIG)


def test_document_entries_round_trip():
    entries = [
        {"mode": "exclusive"},
        {"mode": "exclusive", "type": "h100_reserved"},
        {"mode": "shard", "replicas": 4},
        {"mode": "mps", "units": 100},
        {"mode": "mps", "units": 50, "compute_mode": "exclusive_process", "client_mem_limit_mib": 8192},
        {"mode": "mig", "layout": ["3g.20gb", "3g.20gb"]},
    ]
    for entry in entries:
        assert Share.from_entry(entry).to_entry() == entry
    # a missing compute_mode is the GPU's default; a named layout stays one name; gpus is not the share's
    assert Share.from_entry({"gpus": "0-3", "mode": "MPS", "units": 10}).compute_mode == "default"
    assert Share.from_entry({"mode": "mig", "layout": "all-1g.5gb"}).text == "mig (all-1g.5gb)"
    assert Share.from_entry({"mode": "mps", "units": 10}).exclusive_process is False
    assert Share.from_entry({"mode": "mps", "units": 10, "compute_mode": "exclusive_process"}).exclusive_process


def test_node_spec_json_round_trips_and_refuses_other_shapes():
    share = Share(Mode.MIG, ("1g.5gb",) * 7)
    assert Share.from_json(share.to_json()) == share
    assert share.to_json()["mode"] == "mig" and share.to_json()["layout"] == ["1g.5gb"] * 7
    with pytest.raises(TypeError):
        Share.from_json({**share.to_json(), "bogus": 1})
    with pytest.raises(ValueError):
        Share.from_json({**share.to_json(), "mode": "time"})
    with pytest.raises(FrozenInstanceError):
        share.units = 3


def test_keys_each_mode_allows():
    assert set(SHARING_KEYS) == {k for keys in KEYS.values() for k in keys}
    assert misplaced_keys(Mode.EXCLUSIVE, {"type": "x", "compute_mode": None}) == []
    assert misplaced_keys(Mode.SHARD, {"replicas": 4, "units": 10, "client_mem_limit_mib": 100}) == [
        ("units", "not used by mode shard; it applies to mode mps"),
        ("client_mem_limit_mib", "not used by mode shard; it applies to mode mps"),
    ]
    assert misplaced_keys(Mode.MIG, {"layout": "all-balanced", "type": "t"}) == [
        ("type", "not used by mode mig; it applies to mode shard / mps / exclusive")
    ]


def test_the_hooks_import_it_without_pydantic_yaml_dataclasses_or_the_catalogue():
    code = "import sys; import slurm_gpushare.policy.share; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not loaded & {
        "pydantic",
        "yaml",
        "dataclasses",
        "json",
        "slurm_gpushare.hardware",
        "slurm_gpushare.policy.model",
    }
    assert {m for m in loaded if m.startswith("slurm_gpushare")} == {
        "slurm_gpushare",
        "slurm_gpushare.policy",
        "slurm_gpushare.policy.share",
        "slurm_gpushare.records",
    }


def test_client_mem_limit_is_an_mps_key_of_the_policy_and_reaches_the_share():
    import copy
    from pathlib import Path

    import yaml

    from slurm_gpushare.errors import PolicyError
    from slurm_gpushare.policy import build_site

    doc = yaml.safe_load((Path(__file__).parents[3] / "etc" / "mps-inference.yaml").read_text())
    capped = copy.deepcopy(doc)
    capped["node_groups"][0]["sharing"][0]["client_mem_limit_mib"] = 16384
    slot = build_site(capped, "capped").groups[0].gpus[0]
    assert slot.share.client_mem_limit_mib == 16384 and slot.share.to_entry()["client_mem_limit_mib"] == 16384
    assert build_site(doc, "plain").groups[0].gpus[0].share.client_mem_limit_mib == 0
    shard = copy.deepcopy(doc)
    shard["node_groups"][0]["sharing"][0] = {"gpus": "0-3", "mode": "shard", "replicas": 4, "client_mem_limit_mib": 1}
    with pytest.raises(PolicyError) as refused:
        build_site(shard, "shard")
    assert ("node_groups[0].sharing[0].client_mem_limit_mib", "not used by mode shard; it applies to mode mps") in [
        (p.path, p.message) for p in refused.value.problems
    ]
