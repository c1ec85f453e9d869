"""FGD, BestFit and Random honour a pod's GPU type (gpu_spec) as the paper's simulator does.

pkg/utils/utils.go ``IsNodeAccessibleToPodByType``: the spec lists models split
on '|'; a GPU pod may run only on a node whose model is listed; the
fragmentation measure counts all of a node's idle GPU milli as fragment for a
class that may not run there (frag.go ``NoAccess``).
"""

from __future__ import annotations

import numpy as np
import pytest

from slurm_gpushare.sim.arrivals import Arrivals
from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode
from slurm_gpushare.sim.engine import replay
from slurm_gpushare.sim.paper.baselines import BestFit, PaperState, RandomPolicy, spec_allows
from slurm_gpushare.sim.paper.fgd import FGD, FragMeasure, TaskClass
from slurm_gpushare.sim.paper.gpustate import milli_kind


@pytest.mark.parametrize(
    "spec, model, allowed",
    [
        ("", "T4", True),  # no type asked: any node
        ("", "", True),
        ("T4", "T4", True),
        ("T4", "P100", False),
        ("V100M16|V100M32", "V100M32", True),  # any of several
        ("V100M16|V100M32", "V100M3", False),  # whole names only
        ("V100M16|V100M32|V100M32", "V100M16", True),
        ("T4", "", False),  # a node without GPUs
        ("|", "T4", True),  # separators only: no type asked
        ("|T4|", "T4", True),
    ],
)
def test_spec_allows_is_the_simulators_rule(spec, model, allowed):
    assert spec_allows(spec, model) is allowed


def node(name, model, gpus=2, cpus=32):
    return SimNode(name, cpus, 256000, tuple(SimGpu("exclusive", model) for _ in range(gpus)))


def cluster() -> SimCluster:
    return SimCluster((node("t1", "T4"), node("v1", "V100M16"), node("v2", "V100M32")))


def placed_nodes(policy, pods, seed=0) -> list[str]:
    """Replay ``pods`` in order; the model of the node each placed pod's GPUs ended on (by GPU state)."""
    c = cluster()
    result = replay(policy, c, pods, Arrivals(seed, np.arange(len(pods)), 6000))
    used = policy.s.kind.left[policy.s.st] < policy.s.kind.left[policy.s.kind.free]
    return result.placed, sorted(c.nodes[i].gpus[0].model for i in np.flatnonzero(used.any(axis=1)))


@pytest.mark.parametrize("make", [FGD, BestFit, RandomPolicy])
def test_typed_pods_land_only_on_allowed_models(make):
    pods = (
        Pod("c", 1000, 1, 2, 1000, gpu_spec="V100M32"),
        Pod("a", 1000, 1, 1, 1000, gpu_spec="V100M16|V100M32"),
        Pod("b", 1000, 1, 1, 1000, gpu_spec="V100M16|V100M32"),
        Pod("d", 1000, 1, 1, 300, gpu_spec="T4"),
    )
    for seed in range(5):
        policy = make()
        placed, _ = placed_nodes(policy, pods, seed)
        assert placed == 4
        # c holds both V100M32 GPUs, a and b take V100M16's, d shares a T4 (nodes t1, v1, v2 in this order)
        left = [sorted(row) for row in policy.s.kind.left[policy.s.st].tolist()]
        assert left == [[700, 1000], [0, 0], [0, 0]], (seed, left)


@pytest.mark.parametrize("make", [FGD, BestFit, RandomPolicy])
def test_a_pod_whose_models_are_full_or_absent_is_not_placed(make):
    pods = (
        Pod("a", 1000, 1, 2, 1000, gpu_spec="T4"),
        Pod("b", 1000, 1, 1, 500, gpu_spec="T4"),
        Pod("c", 1000, 1, 1, 100, gpu_spec="A100"),
        Pod("cpu", 1000, 1, 0, 0, gpu_spec="A100"),
    )
    placed, models = placed_nodes(make(), pods)
    assert placed == 2 and models == ["T4"]  # b finds the T4 node full; c's model is nowhere; cpu asks no GPU


def test_filter_by_spec_in_the_state():
    pods = (Pod("a", 1000, 1, 1, 500, gpu_spec="V100M32|T4"), Pod("b", 1000, 1, 0, 0, gpu_spec="T4"))
    state = PaperState(cluster(), pods, milli_kind(pods), np.random.default_rng(0))
    assert state.fits(0)[0].tolist() == [True, False, True]
    assert state.fits(1)[0].tolist() == [True, True, True]


def test_fragmentation_counts_all_idle_milli_for_a_class_barred_from_the_node():
    # one class, 500 milli on T4 only: on the T4 node the idle 2,000 milli hold it (fragment 0); on a V100
    # node it may not run, so all 2,000 idle milli are fragment
    pods = (Pod("x", 1, 1, 1, 500),)
    fm = FragMeasure((TaskClass(1000, 500, 1, "T4", count=1),), milli_kind(pods), 2, ["T4", "V100M16"])
    st = np.array([[1000, 1000], [1000, 1000]])
    assert fm.frag(np.array([8000, 8000]), st, np.array([0, 1])).tolist() == [0.0, 2000.0]
    # untyped measure (no models): both nodes alike
    untyped = FragMeasure((TaskClass(1000, 500, 1, "T4", count=1),), milli_kind(pods), 2)
    assert untyped.frag(np.array([8000, 8000]), st).tolist() == [0.0, 0.0]


def test_fgd_steers_an_untyped_share_away_from_the_gpus_a_typed_class_needs():
    # the workload is mostly whole T4 jobs at 1.5 CPUs: an untyped 500-milli share goes to the V100 node, where
    # it fragments nothing the typical classes could use (they may not run there). Blind to types, FGD would put it
    # on the T4 node: on the V100 node it leaves 1 CPU, too few for the whole-GPU class, so all idle milli would
    # count as fragment
    pods = tuple(Pod(f"t{i}", 1500, 1, 1, 1000, gpu_spec="T4") for i in range(19)) + (Pod("s", 1000, 1, 1, 500),)
    c = SimCluster((node("t1", "T4"), node("v1", "V100M16", cpus=2)))
    fgd = FGD()
    replay(fgd, c, pods, Arrivals(0, np.array([19]), 4000))
    assert fgd.s.kind.left[fgd.s.st].tolist() == [[1000, 1000], [500, 1000]]
