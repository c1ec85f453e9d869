"""GPU-type constraints: each node's GPU model is a node feature, and a job's --constraint picks among them.

The corpus (tests/cases/submit.yaml, "constraint-*") holds the decisions; here are the pieces: the policy's
features, reading a constraint, and the same decision in Python and Lua on generated constraints.
"""

from __future__ import annotations

import random

import pytest
import yaml

from slurm_gpushare.errors import PolicyError
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.render.jobsubmit import job_submit_lua
from slurm_gpushare.submit import build_tables, decide
from slurm_gpushare.submit.constraint import read
from tests.conftest import ROOT

SMALL_LAB = ROOT / "etc" / "small-lab.yaml"


# ---- the policy: a feature per GPU model, derived, never typed ----------------------------------


def test_every_group_has_its_models_feature_first_then_its_own():
    site = load_file(ROOT / "etc" / "mixed-production.yaml")  # lists h100 itself: kept once
    assert [g.features for g in site.groups] == [("h100", "nvlink")]
    lab = load_file(SMALL_LAB)
    assert [g.features for g in lab.groups] == [("l40s",), ("l40s",), ("a100_40g",), ("a30",)]
    assert lab.model_features == ("l40s", "a100_40g", "a30") and lab.features == lab.model_features


def _lab_with(features: list[str], group: int = 0) -> dict:
    raw = yaml.safe_load(SMALL_LAB.read_text())
    raw["node_groups"][group]["features"] = features
    return raw


def test_a_group_may_not_carry_another_models_feature():
    with pytest.raises(PolicyError) as err:
        build_site(_lab_with(["a30"]), "lab")  # lab-excl has L40S GPUs
    text = err.value.report()
    assert "node_groups[0].features[0]" in text and "GPU model A30-24GB" in text and "L40S" in text
    build_site(_lab_with(["l40s", "ib"]), "lab")  # its own model's feature, and one of the site's: fine


@pytest.mark.parametrize("name", ["a|b", "x&y", "ib*2", "(ib)", "[ib]", "with space", "a,b", "", "-lead"])
def test_a_feature_a_constraint_cannot_name_is_refused(name):
    with pytest.raises(PolicyError) as err:
        build_site(_lab_with([name]), "lab")
    assert "node_groups[0].features[0]" in err.value.report() and "not a feature name" in err.value.report()


# ---- reading a constraint -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, names, op",
    [
        ("a30", ("a30",), "|"),
        ("a30|l40s", ("a30", "l40s"), "|"),
        ("[a30|l40s]", ("a30", "l40s"), "|"),
        ("a30*2|a30", ("a30",), "|"),
        ("a30&ib", ("a30", "ib"), "&"),
        ("(a30|l40s)&ib", ("a30", "l40s", "ib"), ""),
        ("a30||l40s", ("a30", "l40s"), "|"),  # Slurm refuses the empty name itself
        ("a30*\n", ("a30*\n",), "|"),  # '*count' only at the very end (Lua's '$' is the end of the string)
    ],
)
def test_read(text, names, op):
    c = read(text)
    assert (c.names, c.op, c.text) == (names, op, text)


def test_nothing_to_read():
    assert read(None) is None and read("") is None and read("a" * 1025) is None and read(42) is None
    assert read("a" * 1024) is not None


@pytest.mark.parametrize(
    "text, features, allowed",
    [
        ("a30|l40s", ("l40s",), True),
        ("a30|l40s", ("a100_40g",), False),
        ("a30&ib", ("a30",), False),
        ("a30&ib", ("ib", "a30"), True),
        ("(a30|l40s)&ib", (), True),  # not read: Slurm alone decides
    ],
)
def test_allows(text, features, allowed):
    assert read(text).allows(features) is allowed


# ---- the decision --------------------------------------------------------------------------------


def test_an_untyped_request_gets_the_whole_gpu_type_its_allowed_groups_serve():
    t = build_tables(load_file(SMALL_LAB))
    assert decide(t, {"tres_per_node": "gres/gpu:1", "features": "l40s"}).fields == {"tres_per_node": "gres/gpu:l40s:1"}
    # the A30s are MPS GPUs, the A100s MIG slices: no whole GPU where the constraint allows; refused, a typed example
    d = decide(t, {"tres_per_node": "gres/gpu:1", "features": "a30"})
    assert d.codes == ["UNTYPED batch"] and "e.g. --gres=gpu:a30:1" in d.user_message
    assert decide(t, {"tres_per_node": "gres/gpu:1", "features": "a30|a100_40g"}).codes == ["UNTYPED batch"]
    # without a constraint the tier serves three types, one of them whole (l40s): that one
    assert decide(t, {"tres_per_node": "gres/gpu:1"}).fields == {"tres_per_node": "gres/gpu:l40s:1"}


def test_a_constraint_is_read_only_for_gpu_jobs():
    t = build_tables(load_file(SMALL_LAB))
    assert decide(t, {"features": "no-such-feature"}).accepted  # Slurm refuses it; gpushare leaves CPU jobs alone
    assert not decide(t, {"tres_per_node": "gres/gpu:1", "features": "no-such-feature"}).accepted


# Python and Lua on generated constraints and requests: the same decision, codes, message and rewrites.
NAMES = ["l40s", "a30", "a100_40g", "A30", "v100m16", "nvlink", "h100"]
OPS = ["|", "&", "|", "|"]
GRES = [
    "gres/gpu:1",
    "gres/gpu:2",
    "gres/mps:50",
    "gres/shard:1",
    "gres/gpu:l40s:1",
    "gres/gpu:a100_40g_1g.5gb:1",
    "gres/gpu:h100_3g.40gb:1",
    "gres/gpu:t4:1",
    "gres/mps:100",
]


def _constraint(rng: random.Random) -> str:
    names = [
        rng.choice(NAMES) + (f"*{rng.randint(1, 3)}" if rng.random() < 0.1 else "") for _ in range(rng.randint(1, 3))
    ]
    text = names[0]
    for n in names[1:]:
        text += rng.choice(OPS) + n
    return f"[{text}]" if rng.random() < 0.1 else f"({text})&nvlink" if rng.random() < 0.05 else text


@pytest.mark.parametrize("policy", ["small-lab", "mixed-production", "planned-lab"])
@pytest.mark.parametrize("version", ["lua51", "lua54"])
def test_python_and_lua_agree_on_generated_constraints(policy, version):
    from tests.lua.harness import ESLURM_INVALID_GRES, Script

    site = load_file(ROOT / "etc" / f"{policy}.yaml")
    t = build_tables(site)
    script = Script(version, job_submit_lua(site))
    rng = random.Random(f"{policy}-{version}")
    outcomes = set()
    for _ in range(300):
        job = {"tres_per_node": rng.choice(GRES), "features": _constraint(rng)}
        if rng.random() < 0.3:
            job["partition"] = rng.choice([x.name for x in site.tiers])
        want = decide(t, job)
        res = script.submit(dict(job))
        assert res.rc == (0 if want.accepted else ESLURM_INVALID_GRES), (job, res.user)
        assert (res.user[0] if res.user else None) == want.user_message, job
        expected = {
            **job,
            **({"partition": want.partition} if want.partition else {}),
            **want.fields,
            **({"qos": want.qos} if want.qos else {}),
        }
        assert res.job == expected, job
        outcomes |= {c.split()[0] for c in want.codes} | ({"accepted"} if want.accepted else set())
    assert {"accepted", "UNKNOWN_FEATURE"} <= outcomes
