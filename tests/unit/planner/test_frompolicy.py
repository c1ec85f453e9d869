"""A validated site as the simulator's cluster, pods routed through the real submission decision, and the
policy additions the planner writes (gpu_models, node weights, submission.routes): validation and rendering."""

from __future__ import annotations

import copy

import pytest

from bench.scenarios import trace_policy
from slurm_gpushare.errors import PolicyError
from slurm_gpushare.planner.frompolicy import SubmitRouter, sim_cluster
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.render import render_all
from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode, SlurmRequest
from slurm_gpushare.submit import build_tables, decide
from tests.conftest import ROOT


def two_pools() -> dict:
    """An L40S exclusive pool (weight 5) and an A30 MPS pool (weight 1), each its own tier."""
    return {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {
                "name": "excl",
                "nodes": "e[1-2]",
                "gpu": {"model": "L40S", "count": 2},
                "cpus": 16,
                "memory_mb": 64000,
                "weight": 5,
            },
            {
                "name": "mps",
                "nodes": "m1",
                "gpu": {"model": "A30-24GB", "count": 2},
                "cpus": 32,
                "memory_mb": 128000,
                "weight": 1,
                "sharing": [{"gpus": "0-1", "mode": "mps", "units": 100}],
            },
        ],
        "tiers": [
            {"name": "whole", "node_groups": ["excl"], "default": True},
            {"name": "shared", "node_groups": ["mps"]},
        ],
    }


def mig_pools() -> dict:
    """A100s: one group in the balanced MIG layout, one exclusive; mps shares are rounded to slices."""
    raw = two_pools()
    raw["node_groups"] = [
        {
            "name": "mig",
            "nodes": "a1",
            "gpu": {"model": "A100-SXM4-40GB", "count": 2},
            "cpus": 16,
            "memory_mb": 64000,
            "sharing": [{"gpus": "0-1", "mode": "mig", "layout": "all-balanced"}],
        },
        {
            "name": "whole",
            "nodes": "a2",
            "gpu": {"model": "A100-SXM4-40GB", "count": 2},
            "cpus": 16,
            "memory_mb": 64000,
        },
    ]
    raw["tiers"] = [
        {"name": "whole", "node_groups": ["whole"], "default": True},
        {"name": "slices", "node_groups": ["mig"]},
    ]
    raw["submission"] = {"routes": [{"match": {"gres": "mps"}, "tiers": ["slices", "whole"], "round_to": "mig"}]}
    return raw


def pod(milli: int, gpus: int = 1, cpu: int = 4000, mem: int = 1024, qos: str = "") -> Pod:
    return Pod("p", cpu, mem, gpus, milli if gpus else 0, qos)


def test_cluster_in_slurm_conf_order_with_weights_and_partitions():
    c = sim_cluster(build_site(two_pools(), "t"), {"m1": 31500})
    assert [n.name for n in c.nodes] == ["e1", "e2", "m1"]
    assert [n.weight for n in c.nodes] == [5, 5, 1]
    assert [n.partitions for n in c.nodes] == [("whole",), ("whole",), ("shared",)]
    assert c.nodes[0].gpus[0] == SimGpu("exclusive", "L40S", "l40s")
    assert c.nodes[2].gpus[1] == SimGpu("mps", "A30-24GB", "a30", units=100)
    assert c.nodes[2].cpu_milli == 31500 and c.nodes[0].milli == 16000
    assert c.gpu_count == 6
    assert "CR_Core_Memory" in c.select_flags


def test_mig_gpus_list_their_instance_types_in_gres_order():
    c = sim_cluster(build_site(mig_pools(), "t"))
    gpu = c.nodes[0].gpus[0]
    assert gpu.mode == "mig"
    assert gpu.mig == ("a100_40g_3g.20gb", "a100_40g_2g.10gb", "a100_40g_1g.5gb", "a100_40g_1g.5gb")


def test_router_goes_through_the_submission_decision():
    r = SubmitRouter(build_site(two_pools(), "t"))
    # a share: --gres=mps:47, routed by GRES to the only tier with MPS
    assert r(pod(470)) == SlurmRequest(("shared",), 4, 1024, "mps", "", 47)
    # whole GPUs: the default tier, and the one type it serves is set (set_gpu_type)
    assert r(pod(1000, gpus=2, cpu=12500)) == SlurmRequest(("whole",), 13, 1024, "gpu", "l40s", 2)
    # no GPU: no GRES, the default tier
    assert r(pod(0, gpus=0)) == SlurmRequest(("whole",), 4, 1024)
    assert r.job(pod(471)) == {
        "tres_per_node": "gres/mps:48",
        "partition": None,
        "qos": None,
        "min_cpus": "4",
        "features": None,
    }


def test_router_refuses_what_the_product_refuses():
    raw = two_pools()
    raw["node_groups"][1].pop("sharing")
    r = SubmitRouter(build_site(raw, "t"))
    assert r(pod(470)) is None
    assert r.refused["UNKNOWN_TYPE mps"] == 1
    assert r.refused["total"] == 1


@pytest.mark.parametrize(
    "milli, gtype",
    [
        (110, "a100_40g_1g.5gb"),
        (230, "a100_40g_2g.10gb"),
        (470, "a100_40g_3g.20gb"),
        (500, "a100_40g_3g.20gb"),
        (810, "a100_40g"),
    ],
)
def test_mps_shares_round_up_to_the_smallest_covering_slice(milli, gtype):
    # balanced layout: 3g.20gb (50 %), 2g.10gb (28 %), 1g.5gb (14 %); 810 needs a whole GPU
    r = SubmitRouter(build_site(mig_pools(), "t"))
    req = r(pod(milli))
    assert (req.gres, req.gres_type, req.count) == ("gpu", gtype, 1)
    assert req.partitions == ("slices", "whole")


def test_rounding_is_shown_to_the_user_as_a_change():
    t = build_tables(build_site(mig_pools(), "t"))
    d = decide(t, {"tres_per_node": "gres/mps:47"})
    assert d.accepted
    assert d.partition == "slices,whole"
    assert d.fields == {"tres_per_node": "gres/gpu:a100_40g_3g.20gb:1"}
    # a job that names its partition is not routed, and an update never is
    assert decide(t, {"tres_per_node": "gres/mps:47", "partition": "whole"}).codes == ["UNKNOWN_TYPE mps"]


def test_routes_match_qos_and_cpus():
    raw = two_pools()
    raw["tiers"].append({"name": "cpu", "node_groups": ["mps"]})
    raw["submission"] = {
        "routes": [
            {"match": {"gres": "none"}, "tiers": ["cpu"]},
            {"match": {"gres": "gpu", "max_gpus": 1, "min_cpus": 9}, "tiers": ["cpu", "whole"]},
            {"match": {"gres": "gpu", "qos": ["LS"]}, "tiers": ["whole"]},
        ]
    }
    t = build_tables(build_site(raw, "t"))
    assert decide(t, {"tres_per_node": None}).partition == "cpu"
    # typed: an untyped request means a whole GPU, which the cpu tier (A30 MPS GPUs) does not give (UNTYPED cpu)
    assert decide(t, {"tres_per_node": "gres/gpu:a30:1", "min_cpus": "12"}).partition == "cpu,whole"
    assert decide(t, {"tres_per_node": "gres/gpu:1", "min_cpus": "12"}).codes == ["UNTYPED cpu"]
    assert decide(t, {"tres_per_node": "gres/gpu:2", "min_cpus": "12"}).partition is None
    assert decide(t, {"tres_per_node": "gres/gpu:1", "min_cpus": "4", "qos": "ls"}).partition == "whole"
    assert decide(t, {"tres_per_node": "gres/gpu:1", "min_cpus": "4294967294"}).partition is None  # NO_VAL: unset


def problems(raw) -> list[str]:
    with pytest.raises(PolicyError) as info:
        build_site(raw, "t.yaml")
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda r: r["node_groups"][0].update(weight=0),
            "node_groups[0].weight: Input should be greater than or equal to 1",
        ),
        (
            lambda r: r["submission"]["routes"][0]["tiers"].append("nope"),
            "submission.routes[0].tiers[2]: 'nope' is not a tier; known: slices, whole",
        ),
        (
            lambda r: r["submission"]["routes"][0]["match"].update(gres="gpu"),
            "submission.routes[0].round_to: rounding to a MIG slice applies to gres: mps",
        ),
        (
            lambda r: r["submission"]["routes"][0]["match"].update(min_gpus=2),
            "submission.routes[0].match: min_gpus / max_gpus apply to gres: gpu only",
        ),
        (
            lambda r: r["submission"]["routes"][0].update(tiers=["whole"]),
            "submission.routes[0].round_to: no GPU on the route's tiers runs MIG",
        ),
        (
            lambda r: r["submission"]["routes"][0]["match"].update(gres="tpu"),
            "submission.routes[0].match.gres: Input should be 'none', 'gpu', 'mps' or 'shard'",
        ),
        (
            lambda r: r["submission"]["routes"][0]["match"].update(qos=["bad qos"]),
            "submission.routes[0].match.qos[0]: 'bad qos' is not a QOS name",
        ),
    ],
)
def test_new_keys_are_validated_with_their_path(change, expected):
    raw = mig_pools()
    change(raw)
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_routes_to_a_tier_without_the_shared_gres():
    raw = two_pools()
    raw["submission"] = {"routes": [{"match": {"gres": "mps"}, "tiers": ["whole"]}]}
    assert "submission.routes[0].tiers: no GPU on the route's tiers is shared as mps" in problems(raw)


def test_undeclared_gpu_model_says_how_to_declare_it():
    raw = two_pools()
    raw["node_groups"][0]["gpu"]["model"] = "T4"
    [p] = [p for p in problems(raw) if p.startswith("node_groups[0].gpu.model")]
    assert "unknown GPU model 'T4'" in p and "declare it under gpu_models: name, memory_mb" in p


def test_declared_gpu_model_is_a_whole_gpu_model():
    raw = two_pools()
    raw["gpu_models"] = [{"name": "T4", "memory_mb": 15360}]
    raw["node_groups"][0]["gpu"]["model"] = "T4"
    site = build_site(raw, "t")
    assert site.groups[0].model.slurm_type == "t4"
    assert not site.groups[0].model.mig_capable
    assert site.groups[0].gres == {("gpu", "t4"): 2}
    # MIG on it is refused like on any model without MIG
    raw["node_groups"][0]["sharing"] = [{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}]
    assert any("T4 does not support MIG" in p for p in problems(raw))


@pytest.mark.parametrize(
    "decl, expected",
    [
        ({"name": "L40S", "memory_mb": 1}, "gpu_models[0].name: 'L40S' is already in the catalogue"),
        (
            {"name": "X1", "memory_mb": 1, "slurm_type": "l40s"},
            "gpu_models[0].slurm_type: GPU type 'l40s' already names L40S",
        ),
        ({"name": "X1", "memory_mb": 0}, "gpu_models[0].memory_mb: Input should be greater than or equal to 1"),
        ({"name": "X 1", "memory_mb": 1}, "gpu_models[0].name: String should match pattern"),
    ],
)
def test_gpu_model_declarations_are_strict(decl, expected):
    raw = two_pools()
    raw["gpu_models"] = [decl]
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_declared_twice():
    raw = two_pools()
    raw["gpu_models"] = [{"name": "T4", "memory_mb": 1}, {"name": "t4", "memory_mb": 2}]
    assert "gpu_models[1].name: GPU model 't4' is declared twice" in problems(raw)


def test_weight_is_rendered_on_the_node_line():
    files = render_all(build_site(two_pools(), "t"))
    text = files["slurm-gpushare.conf"] if "slurm-gpushare.conf" in files else files["slurm.conf"]
    lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert any("NodeName=e[1-2]" in line and " Weight=5 " in line for line in lines), lines
    assert any("NodeName=m1" in line and " Weight=1 " in line for line in lines), lines


def test_trace_policy_declares_the_trace_models():
    nodes = tuple(
        SimNode(f"n{i}", 8, 32768, tuple(SimGpu("exclusive", m) for _ in range(k)), cpu_milli=8000)
        for i, (m, k) in enumerate([("T4", 2), ("T4", 2), ("G2", 8), ("T4", 2)])
    )
    raw = trace_policy(SimCluster(nodes))
    site = build_site(copy.deepcopy(raw), "trace")
    assert [g.name for g in site.groups] == ["t4-2g-8c-32g", "g2-8g-8c-32g"]
    assert site.groups[0].nodes == ("n0", "n1", "n3")
    assert {m["name"] for m in raw["gpu_models"]} == {"G2", "T4"}
    assert all(s.mode == "mps" and s.units == 100 for g in site.groups for s in g.gpus)


def test_an_untyped_request_the_filter_refuses_is_resubmitted_with_the_type_the_refusal_names():
    """The modelled user of a refused untyped request (UNTYPED) does what the refusal says: names its type, the
    constraint kept; what the router places is what that user submits (``submitted``), never the refused request."""
    router = SubmitRouter(load_file(ROOT / "etc" / "small-lab.yaml"))
    whole = Pod("w", 2000, 1000, 1, 1000, "", "")  # the L40S is the one whole type: accepted, typed by the filter
    assert router.submitted(whole)["tres_per_node"] == "gres/gpu:1"
    assert router(whole) == SlurmRequest(("batch",), 2, 1000, "gpu", "l40s", 1)
    # the A30 is an MPS GPU, the A100 in 1g.5gb slices: no whole GPU there; the refusal names the first type
    either = Pod("e", 2000, 1000, 1, 1000, "", "A30|A100_40G")
    assert decide(router.tables, router.job(either)).codes == ["UNTYPED batch"]
    job = router.submitted(either)
    assert job["tres_per_node"] == "gres/gpu:a100_40g_1g.5gb:1" and job["features"] == "a30|a100_40g"
    assert router(either) == SlurmRequest(("batch",), 2, 1000, "gpu", "a100_40g_1g.5gb", 1, "a30|a100_40g")
    assert router.refused == {}
