"""The planner's Slurm side of GPU-type constraints: a trace pod's gpu_spec becomes what a user submits
(--constraint over the models' node features, or a typed GRES), and the Slurm model places it only on those
models; what stays refused is counted by reason."""

from __future__ import annotations

import numpy as np
import pytest

from bench.scenarios import built, uniform, uniform_raw
from slurm_gpushare.planner.frompolicy import SubmitRouter, sim_cluster, spec_models
from slurm_gpushare.policy import build_site
from slurm_gpushare.sim.arrivals import Arrivals
from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode, SlurmRequest
from slurm_gpushare.sim.engine import replay
from slurm_gpushare.sim.slurmmodel import SlurmPolicy, SlurmState


def trace_cluster() -> SimCluster:
    """Four trace nodes, two GPUs each: T4, V100M16, V100M32, T4 (as trace.load_cluster gives them)."""
    models = ["T4", "V100M16", "V100M32", "T4"]
    return SimCluster(
        tuple(
            SimNode(f"n{i}", 32, 128000, tuple(SimGpu("exclusive", m) for _ in range(2))) for i, m in enumerate(models)
        )
    )


def pod(spec: str, milli: int = 1000, gpus: int = 1) -> Pod:
    return Pod("p", 2000, 1024, gpus, milli, "", spec)


def whole_v100s():
    """The uniform S1 guess (every GPU mps) with the V100s whole: an untyped request there is a whole GPU."""
    cluster = trace_cluster()
    raw = uniform_raw(cluster, "S1")
    for g in raw["node_groups"]:
        if g["gpu"]["model"].startswith("V100"):
            g.pop("sharing", None)
    return built(raw, cluster, "whole-v100")


@pytest.mark.parametrize(
    "spec, models",
    [
        ("", []),
        ("|", []),
        ("V100M16", ["v100m16"]),
        ("V100M16|V100M32", ["v100m16", "v100m32"]),
        ("|T4||T4|", ["t4"]),
    ],
)
def test_spec_models(spec, models):
    assert spec_models(spec) == models


def test_a_spec_of_several_models_becomes_a_constraint_and_is_accepted():
    sim, router, site = whole_v100s()
    assert {n.name: n.features for n in sim.nodes} == {
        "n0": ("t4",),
        "n1": ("v100m16",),
        "n2": ("v100m32",),
        "n3": ("t4",),
    }
    job = router.job(pod("V100M16|V100M32"))
    assert (job["tres_per_node"], job["features"]) == ("gres/gpu:1", "v100m16|v100m32")
    req = router(pod("V100M16|V100M32"))
    assert (req.gres, req.gres_type, req.count, req.constraint) == ("gpu", "", 1, "v100m16|v100m32")
    # one model: a typed GRES, as before
    assert router(pod("T4", gpus=2)) == SlurmRequest(("main",), 2, 1024, "gpu", "t4", 2)
    # a share keeps its models: mps with the constraint
    share = router(pod("V100M32|T4", milli=300))
    assert (share.gres, share.count, share.constraint) == ("mps", 30, "v100m32|t4")
    assert router.refused == {}
    # every GPU an MPS GPU: the untyped request is refused (UNTYPED), and its user names the type the refusal names
    _sim, router, _site = uniform(trace_cluster(), "S1")
    assert router.refusal(pod("V100M16|V100M32")) == ()
    assert router.submitted(pod("V100M16|V100M32"))["tres_per_node"] == "gres/gpu:v100m16:1"
    req = router(pod("V100M16|V100M32"))
    assert (req.gres, req.gres_type, req.count, req.constraint) == ("gpu", "v100m16", 1, "v100m16|v100m32")


def test_the_slurm_model_places_constrained_jobs_only_on_allowed_models():
    sim, router, _site = whole_v100s()
    state = SlurmState(sim)
    models = {"n0": "T4", "n1": "V100M16", "n2": "V100M32", "n3": "T4"}
    placed = []
    for p in [pod("V100M16|V100M32")] * 4 + [pod("V100M32|T4", milli=400)] * 3:
        req = router(p)
        node = state.choose_node(req)
        assert node >= 0
        state.allocate(req, node)
        placed.append(models[state.names[node]])
    # the four whole GPUs fill both V100 nodes; no T4 though the T4 node comes first in node order
    assert placed[:4] == ["V100M16", "V100M16", "V100M32", "V100M32"]
    # the shares: only the T4s are MPS GPUs
    assert placed[4:] == ["T4", "T4", "T4"]
    # a fifth V100 job finds no room: not placed anywhere else
    assert state.choose_node(router(pod("V100M16|V100M32"))) == -1


def test_a_constraint_the_model_cannot_read_is_refused_loudly():
    state = SlurmState(sim_cluster(build_site(uniform_raw_for_test(), "t")))
    with pytest.raises(ValueError, match="not modelled"):
        state.fits(SlurmRequest((), 1, 1, "gpu", "", 1, "(t4|v100m16)&x"))


def uniform_raw_for_test() -> dict:
    from bench.scenarios import uniform_raw

    return uniform_raw(trace_cluster(), "S1")


def test_refusals_are_counted_per_job_with_their_reason():
    sim, router, _site = uniform(trace_cluster(), "S1")
    pods = (pod("A10"), pod("A10"), pod("G2|A10", milli=500), pod("T4"))  # A10 and G2: no such nodes here
    policy = SlurmPolicy("product", router, lambda c: sim)
    result = replay(policy, sim, pods, Arrivals(0, np.arange(len(pods)), 2000))
    assert result.placed == 1
    probes = result.probes[130]
    assert probes["rejected"] == 3.0
    assert probes["refused UNKNOWN_FEATURE a10"] == 3.0 and probes["refused UNKNOWN_FEATURE g2"] == 1.0
    assert router.refusal(pod("A10")) == ("UNKNOWN_FEATURE a10",) and router.refusal(pod("T4")) == ()
    # the router's own count: per job, not per distinct request
    assert router.refused["total"] == 3 and router.refused["UNKNOWN_FEATURE a10"] == 3


def test_the_mig_type_spec_of_the_fidelity_sample_stays_a_typed_gres():
    raw = {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {
                "name": "mig",
                "nodes": "a1",
                "gpu": {"model": "A100-SXM4-40GB", "count": 1},
                "cpus": 8,
                "memory_mb": 16000,
                "sharing": [{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
            }
        ],
        "tiers": [{"name": "t", "node_groups": ["mig"], "default": True}],
    }
    router = SubmitRouter(build_site(raw, "t"))
    req = router(pod("a100_40g_1g.5gb", gpus=2))
    assert (req.gres, req.gres_type, req.count, req.constraint) == ("gpu", "a100_40g_1g.5gb", 2, "")


def test_the_plan_report_counts_refused_jobs_with_their_reason():
    from slurm_gpushare.planner.demand import from_pods
    from slurm_gpushare.planner.report import stranded_lines

    _sim, _router, site = uniform(trace_cluster(), "S1")
    pods = [pod("A10")] * 3 + [pod("V100M16|V100M32")] * 5 + [pod("G2|A10", milli=500)]
    lines = stranded_lines(from_pods(pods, "t"), site)
    refused = [x for x in lines if "refused at submission" in x]
    assert refused == [
        "  (refused): 4 jobs (3.5 GPUs) would be refused at submission: UNKNOWN_FEATURE a10 4, UNKNOWN_FEATURE g2 1"
    ], lines
