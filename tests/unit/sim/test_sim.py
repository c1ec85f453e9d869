"""Placement simulator: trace loading, the paper's arrivals and metric, Slurm's node and GRES choice."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from slurm_gpushare.sim.arrivals import Arrivals, arrival_sequence, percent_curve
from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode, SlurmRequest
from slurm_gpushare.sim.engine import replay
from slurm_gpushare.sim.paper.baselines import BestFit
from slurm_gpushare.sim.slurmmodel import (
    LL_SHARED_GRES,
    MULTIPLE_SHARING_GRES_PJ,
    SlurmPolicy,
    SlurmState,
    consec_pick,
    occupied_slices,
    uniform_router,
)
from slurm_gpushare.sim.trace import TraceError, load_cluster, load_pods


def node(name, cpus=8, gpus=(), weight=1, memory=1000, partitions=()):
    return SimNode(name, cpus, memory, tuple(gpus), weight=weight, partitions=partitions)


def gpu(mode="exclusive", gres_type="", units=0, mig=()):
    return SimGpu(mode=mode, model="A100-SXM4-40GB", gres_type=gres_type, units=units, mig=tuple(mig))


def req(gres="", count=0, gres_type="", cpus=1, memory=0, partitions=()):
    return SlurmRequest(partitions, cpus, memory, gres=gres, gres_type=gres_type, count=count)


# -- trace ---------------------------------------------------------------------------------------------


def test_trace_loads_nodes_and_pods(tmp_path):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,16000,1024,2,T4\nn1,8000,512,0,\n")
    pods = tmp_path / "p.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,1500,10,1,470,,LS\np1,100,1,0,0,,BE\n"
    )
    cluster = load_cluster(nodes)
    assert [(n.name, n.cpus, n.milli, len(n.gpus)) for n in cluster.nodes] == [("n0", 16, 16000, 2), ("n1", 8, 8000, 0)]
    assert cluster.nodes[0].gpus[0] == SimGpu(mode="exclusive", model="T4")
    assert load_pods(pods) == (Pod("p0", 1500, 10, 1, 470, qos="LS"), Pod("p1", 100, 1, 0, 0, qos="BE"))


@pytest.mark.parametrize(
    "row, where",
    [
        ("p0,abc,1,1,470", "line 2, column cpu_milli: 'abc' is not an integer >= 0"),
        ("p0,1,1,1,1200", "line 2, column gpu_milli: 1200 is out of range; accepted: an integer from 0 to 1000"),
        ("p0,1,1,2,500", "line 2, column gpu_milli: 500 with num_gpu 2; accepted: 1000"),
        ("p0,1,1", "line 2: 5 fields expected"),
    ],
)
def test_trace_bad_pod_row_names_file_line_column(tmp_path, row, where):
    pods = tmp_path / "p.csv"
    pods.write_text(f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{row}\n")
    with pytest.raises(TraceError) as err:
        load_pods(pods)
    assert str(err.value).startswith(f"{pods}: ") and where in str(err.value)


def test_trace_missing_column(tmp_path):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,gpu,model\nn0,1000,1,T4\n")
    with pytest.raises(TraceError, match="line 1: missing column.s. memory_mib"):
        load_cluster(nodes)


# -- arrivals and metric --------------------------------------------------------------------------------


def pods_of(*shares):
    return tuple(Pod(f"p{i}", 1000, 1, 1 if s else 0, s) for i, s in enumerate(shares))


def test_arrivals_shuffle_every_pod_once_then_resample_to_130_percent():
    pods = pods_of(500, 300, 0, 200)  # 1,000 milli of demand on a 1-GPU cluster: 100 %
    arr = arrival_sequence(pods, gpu_count=1, seed=7)
    head = arr.order[: len(pods)]
    assert sorted(head.tolist()) == [0, 1, 2, 3]
    demand = np.array([p.gpu_demand_milli for p in pods])
    total = demand[arr.order].sum()
    assert total <= 1300
    assert arr.capacity_milli == 1000
    again = arrival_sequence(pods, gpu_count=1, seed=7)
    assert again.order.tolist() == arr.order.tolist()


def test_arrivals_stop_at_the_first_draw_that_would_pass_the_target():
    pods = pods_of(500, 500)  # already 100 %; any further 500 would reach 150 % > 130 %
    arr = arrival_sequence(pods, gpu_count=1, seed=1)
    assert len(arr) == 2


def test_arrivals_larger_than_target_lose_random_pods():
    pods = pods_of(*[1000] * 5)  # 500 % of one GPU
    arr = arrival_sequence(pods, gpu_count=1, seed=3)
    assert len(arr) == 1


def test_percent_curve_by_hand():
    # capacity 2,000 milli; records after five arrivals (arrived, placed)
    arrived = np.array([1000, 1500, 1500, 2500, 3000])
    used = np.array([1000, 1500, 1500, 1500, 2000])
    curve = percent_curve(arrived, used, 2000)
    assert curve[50] == 50.0 and curve[75] == 75.0 and curve[125] == 75.0
    assert curve[49] == 50.0 and curve[51] == 50.0  # no record there: the +-1 window
    assert curve[76] == 75.0
    assert math.isnan(curve[100]) and math.isnan(curve[130])  # 150 % lies outside 129..131


def test_replay_metric_on_a_tiny_trace_by_hand():
    """Two GPUs; a whole GPU, a half, a CPU pod, a whole GPU that no longer fits, a half."""
    cluster = SimCluster((SimNode("n0", 64, 10**6, (gpu(), gpu())),))
    pods = (
        Pod("a", 1000, 1, 1, 1000),
        Pod("b", 1000, 1, 1, 500),
        Pod("c", 1000, 1, 0, 0),
        Pod("d", 1000, 1, 1, 1000),
        Pod("e", 1000, 1, 1, 500),
    )
    arrivals = Arrivals(seed=0, order=np.arange(5), capacity_milli=2000)
    result = replay(BestFit(), cluster, pods, arrivals)
    assert result.placed == 4
    # arrived 50, 75, 75, 125, 150 %; allocated 50, 75, 75, 75, 100 %
    assert result.at(50) == 50.0 and result.at(75) == 75.0 and result.at(125) == 75.0
    assert result.probes[100]["allocated"] == 75.0  # first record at or past 100 % arrived
    assert result.probes[130]["allocated"] == 100.0  # the fifth arrival takes it from 125 to 150 %


# -- Slurm's node choice ----------------------------------------------------------------------------------


def test_lowest_weight_wins():
    s = SlurmState(SimCluster((node("a", weight=10), node("b", weight=1))))
    assert s.choose_node(req(cpus=1)) == 1


def test_equal_nodes_first_in_slurm_conf_order():
    s = SlurmState(SimCluster((node("a"), node("b"), node("c"))))
    assert s.choose_node(req(cpus=1)) == 0


def test_best_fit_node_inside_a_consecutive_set():
    s = SlurmState(SimCluster((node("a", cpus=8), node("b", cpus=4), node("c", cpus=8))))
    assert s.choose_node(req(cpus=2)) == 1


def test_tightest_consecutive_set_wins():
    # a, b usable (16 CPUs together), c cannot hold the job, d usable alone with 8: d's set is tighter
    cluster = SimCluster((node("a", cpus=8), node("b", cpus=8), node("c", cpus=1), node("d", cpus=8)))
    assert SlurmState(cluster).choose_node(req(cpus=2)) == 3
    assert consec_pick(np.array([True, True, False, True]), np.ones(4, int), np.array([8, 8, 1, 8])) == 3


def test_weight_change_splits_sets():
    # same CPUs, but b has a higher weight: a's set (alone) is the lowest-weight one
    cluster = SimCluster((node("a", cpus=8), node("b", cpus=2, weight=5), node("c", cpus=8)))
    assert SlurmState(cluster).choose_node(req(cpus=2)) == 0


def test_partitions_tried_in_request_order():
    cluster = SimCluster((node("a", partitions=("p1",)), node("b", partitions=("p2",))))
    s = SlurmState(cluster)
    assert s.choose_node(req(cpus=1, partitions=("p2", "p1"))) == 1
    assert s.choose_node(req(cpus=1, partitions=("nope",))) == -1


def test_memory_is_a_hard_limit():
    s = SlurmState(SimCluster((node("a", memory=10), node("b", memory=100))))
    assert s.choose_node(req(cpus=1, memory=50)) == 1


# -- GRES inside a node ------------------------------------------------------------------------------------


def mps_node(n=2, units=100):
    return SimCluster((node("a", cpus=64, gpus=[gpu("mps", units=units) for _ in range(n)]),))


def test_whole_gpus_lowest_free_indexes():
    s = SlurmState(SimCluster((node("a", cpus=64, gpus=[gpu(), gpu(), gpu()]),)))
    assert s.allocate(req("gpu", 1), 0) == (0,)
    assert s.allocate(req("gpu", 2), 0) == (1, 2)
    assert not s.fits(req("gpu", 1))[0]


def test_mps_first_device_with_enough_count():
    s = SlurmState(mps_node())
    assert s.allocate(req("mps", 30), 0) == (0,)
    assert s.allocate(req("mps", 80), 0) == (1,)  # GPU 0 has 70 left
    assert s.allocate(req("mps", 40), 0) == (0,)  # first device that holds all 40
    assert s.sh_used[0].tolist() == [70, 80]
    assert not s.fits(req("mps", 31))[0]  # no single device has 31 left


def test_ll_shared_gres_least_loaded_first():
    s = SlurmState(replace(mps_node(), select_flags=frozenset({LL_SHARED_GRES})))
    assert s.allocate(req("mps", 30), 0) == (0,)
    assert s.allocate(req("mps", 10), 0) == (1,)
    assert s.allocate(req("mps", 10), 0) == (1,)  # GPU 1 (80 left) is still less loaded than GPU 0 (70)


def test_multiple_sharing_gres_per_job_splits():
    s = SlurmState(replace(mps_node(), select_flags=frozenset({MULTIPLE_SHARING_GRES_PJ})))
    s.allocate(req("mps", 60), 0)
    s.allocate(req("mps", 60), 0)
    assert s.fits(req("mps", 80))[0]
    assert s.allocate(req("mps", 80), 0) == (0, 1)


def test_gpu_and_mps_exclude_each_other_on_one_gpu():
    s = SlurmState(mps_node())
    assert s.allocate(req("mps", 10), 0) == (0,)
    assert not s.fits(req("gpu", 2))[0]  # GPU 0 has an mps job
    assert s.allocate(req("gpu", 1), 0) == (1,)
    assert s.allocate(req("mps", 10), 0) == (0,)
    assert not s.fits(req("mps", 95))[0]  # GPU 0 has 80 left, GPU 1 is allocated as gpu


def test_shard_is_not_mps():
    cluster = SimCluster((node("a", gpus=[gpu("shard", units=4)]),))
    s = SlurmState(cluster)
    assert not s.fits(req("mps", 1))[0]
    assert s.allocate(req("shard", 3), 0) == (0,)
    assert not s.fits(req("shard", 2))[0]


def test_typed_mig_records_in_index_order():
    g0 = gpu("mig", mig=("a100_1g", "a100_1g", "a100_3g"))
    g1 = gpu("exclusive", gres_type="a100")
    s = SlurmState(SimCluster((node("a", cpus=64, gpus=[g0, g1]),)))
    assert s.allocate(req("gpu", 1, "a100_1g"), 0) == (0,)
    assert s.allocate(req("gpu", 1, "a100_1g"), 0) == (1,)
    assert not s.fits(req("gpu", 1, "a100_1g"))[0]
    assert s.allocate(req("gpu", 1, "a100"), 0) == (3,)
    assert s.allocate(req("gpu", 1), 0) == (2,)  # untyped: any free record
    assert not s.fits(req("gpu", 1, "unknown"))[0]


def test_uniform_router():
    assert uniform_router(Pod("p", 2500, 7, 1, 470)) == SlurmRequest((), 3, 7, gres="mps", count=47)
    assert uniform_router(Pod("p", 1000, 7, 1, 475)).count == 48
    assert uniform_router(Pod("p", 1000, 7, 4, 1000)) == SlurmRequest((), 1, 7, gres="gpu", count=4)
    assert uniform_router(Pod("p", 100, 7, 0, 0)) == SlurmRequest((), 1, 7)


def test_slurm_policy_counts_rejections():
    cluster = mps_node()
    pods = (Pod("a", 1000, 1, 1, 1000), Pod("b", 1000, 1, 1, 500))
    policy = SlurmPolicy("s", lambda p: None if p.name == "b" else uniform_router(p))
    result = replay(policy, cluster, pods, Arrivals(0, np.arange(2), 2000))
    assert result.placed == 1 and result.probes[130]["rejected"] == 1.0


def test_untyped_gpu_request_may_get_a_mig_slice_and_is_counted_undersized():
    g0 = gpu("mig", mig=("a100_1g",))
    cluster = SimCluster((node("a", cpus=64, gpus=[g0]),))
    pods = (Pod("whole", 1000, 1, 1, 1000),)
    policy = SlurmPolicy("s", uniform_router, mig_slices={"a100_1g": 1}, mig_shares={"a100_1g": 143})
    result = replay(policy, cluster, pods, Arrivals(0, np.arange(1), 1000))
    assert result.placed == 1  # Slurm hands the untyped gpu:1 the only gpu record: a 1g slice
    assert result.probes[130]["undersized"] == 1.0
    assert result.probes[130]["slices_occupied"] == pytest.approx(100 / 7)


def test_slices_occupied_over_all_gpus_by_one_rule_for_every_mode():
    # four A100s: exclusive (a whole job: 7 of 7), MIG 3g+2g+1g+1g (a 3g job: 3), mps 100 units (30 + 20 units:
    # ceil(7 x 0.5) = 4), mps idle (0): 14 of 28 slices over all GPUs; MIG GPUs only: 3 of 7
    g_mig = gpu("mig", mig=("a100_3g", "a100_2g", "a100_1g", "a100_1g"))
    cluster = SimCluster(
        (
            node("a", cpus=64, gpus=[gpu(gres_type="a100"), g_mig, gpu("mps", units=100)]),
            node("b", cpus=64, gpus=[gpu("mps", units=100)]),
        )
    )
    requests = {
        "whole": req("gpu", 1, "a100"),
        "mig": req("gpu", 1, "a100_3g"),
        "m30": req("mps", 30),
        "m20": req("mps", 20),
    }
    pods = tuple(Pod(name, 1000, 1, 1, 1000 if name == "whole" else 300) for name in requests)
    slices = {"a100_3g": 3, "a100_2g": 2, "a100_1g": 1}
    policy = SlurmPolicy("s", lambda p: requests[p.name], mig_slices=slices)
    result = replay(policy, cluster, pods, Arrivals(0, np.arange(4), 4000))
    assert result.placed == 4
    assert policy.state.sh_used.max() == 50  # both mps jobs on one GPU (first device with room)
    probe = result.probes[130]
    assert probe["slices_occupied_all"] == pytest.approx(100 * 14 / 28) and probe["gpus"] == 4.0
    assert probe["slices_occupied"] == pytest.approx(100 * 3 / 7) and probe["mig_gpus"] == 1.0


def test_mps_share_rounds_up_to_slices_once_per_gpu_and_caps_at_seven():
    cluster = SimCluster((node("a", cpus=64, gpus=[gpu("mps", units=100), gpu("mps", units=100)]),))
    state = SlurmState(cluster)
    state.allocate(req("mps", 1), 0)  # 1 unit: ceil(0.07) = 1 slice
    state.allocate(req("mps", 99), 0)  # same GPU, 100 of 100 units: 7, not 1 + 7
    state.allocate(req("mps", 15), 0)  # second GPU: ceil(1.05) = 2
    assert occupied_slices(state, np.zeros_like(state.rec_type), 7) == 9


def test_ls_fractional_jobs_off_mig_are_counted():
    cluster = SimCluster((node("a", cpus=64, gpus=[gpu("mps", units=100), gpu("mig", mig=("a100_3g",))]),))
    pods = (
        Pod("ls-mps", 1000, 1, 1, 400, qos="LS"),
        Pod("ls-mig", 1000, 1, 1, 400, qos="LS"),
        Pod("be", 1000, 1, 1, 400),
    )

    def route(p):
        if p.name == "ls-mig":
            return SlurmRequest((), 1, 1, gres="gpu", gres_type="a100_3g", count=1)
        return uniform_router(p)

    result = replay(SlurmPolicy("s", route), cluster, pods, Arrivals(0, np.arange(3), 2000))
    assert result.placed == 3 and result.probes[130]["ls_share_not_on_mig"] == 1.0


def test_node_table_is_sorted_by_name_naturally_not_by_slurm_conf_order():
    # slurmctld sorts its node table with strnatcmp: n2 before n10, whatever slurm.conf lists first
    s = SlurmState(SimCluster((node("n10"), node("n2"), node("m1", cpus=1))))
    assert s.names == ("m1", "n2", "n10")
    assert s.names[s.choose_node(req(cpus=2))] == "n2"


def test_partitions_tried_by_priority_tier_first():
    cluster = SimCluster(
        (node("a", partitions=("low",)), node("b", partitions=("high",))), partition_tiers=(("low", 1), ("high", 10))
    )
    assert SlurmState(cluster).choose_node(req(cpus=1, partitions=("low", "high"))) == 1


# -- the kept counts agree with the state they summarise -----------------------------------------------


def _consec_pick_reference(ok, weight, cpus):
    """_eval_nodes_consec over every usable node, set by set (the model's first, unoptimised form)."""
    idx = [i for i in range(len(ok)) if ok[i]]
    if not idx:
        return -1
    sets, cur = [], [idx[0]]
    for a, b in zip(idx, idx[1:], strict=False):
        if b == a + 1 and weight[a] == weight[b]:
            cur.append(b)
        else:
            sets.append(cur)
            cur = [b]
    sets.append(cur)
    low = min(weight[s[0]] for s in sets)
    best = min((s for s in sets if weight[s[0]] == low), key=lambda s: sum(cpus[i] for i in s))
    return min(best, key=lambda i: (cpus[i], i))


def _fits_reference(s: SlurmState, r: SlurmRequest):
    """Feasibility derived afresh from the records and counts (what the kept per-node counts stand for)."""
    ok = (s.cpu >= r.cpus) & (s.mem >= r.memory_mib)
    if r.gres == "gpu":
        usable = s.rec_free & ~s.rec_shared_busy
        if r.gres_type:
            usable &= s.rec_type == s.types.get(r.gres_type, -2)
        return ok & (usable.sum(axis=1) >= r.count)
    if r.gres in ("mps", "shard"):
        kind = {"mps": 1, "shard": 2}[r.gres]
        room = np.where((s.sh_kind == kind) & ~s.gpu_taken, s.sh_cap - s.sh_used, 0)
        per_node = room.sum(axis=1) if MULTIPLE_SHARING_GRES_PJ in s.flags else room.max(axis=1)
        return ok & (per_node >= r.count)
    return ok


@pytest.mark.parametrize("flags", [frozenset(), frozenset({LL_SHARED_GRES}), frozenset({MULTIPLE_SHARING_GRES_PJ})])
def test_kept_counts_match_a_fresh_derivation(flags):
    rng = np.random.default_rng(5)
    kinds = [
        lambda: gpu("mps", units=100),
        lambda: gpu("shard", units=4),
        lambda: gpu(gres_type="a100"),
        lambda: gpu("mig", mig=("a100_1g", "a100_1g", "a100_3g")),
        lambda: gpu("mps", units=50),
    ]
    nodes = tuple(
        node(
            f"n{i}",
            cpus=int(rng.integers(4, 17)),
            weight=int(rng.integers(1, 3)),
            memory=400,
            gpus=[kinds[int(k)]() for k in rng.integers(0, len(kinds), size=int(rng.integers(0, 5)))],
        )
        for i in range(24)
    )
    s = SlurmState(SimCluster(nodes, select_flags=flags))
    asks = [
        ("gpu", 1, ""),
        ("gpu", 2, ""),
        ("gpu", 1, "a100"),
        ("gpu", 1, "a100_1g"),
        ("gpu", 1, "a100_3g"),
        ("mps", 30, ""),
        ("mps", 70, ""),
        ("shard", 1, ""),
        ("shard", 3, ""),
        ("", 0, ""),
    ]
    placed = refused = 0
    for _ in range(400):
        gres, count, gtype = asks[int(rng.integers(len(asks)))]
        r = req(gres, count, gtype, cpus=int(rng.integers(1, 4)), memory=int(rng.integers(0, 60)))
        want = _fits_reference(s, r)
        assert s.fits(r).tolist() == want.tolist()
        assert s.choose_node(r) == _consec_pick_reference(want, s.weight, s.cpu)
        node_i = s.choose_node(r)
        if node_i >= 0:
            s.allocate(r, node_i)
            placed += 1
        else:
            refused += 1
    assert placed > 50 and refused > 100  # the run filled the cluster, not only the easy first jobs


def test_consec_pick_matches_reference_on_random_masks():
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        ok = rng.random(n) < 0.6
        weight = rng.integers(1, 4, size=n)
        cpus = rng.integers(0, 6, size=n)
        assert consec_pick(ok, weight, cpus) == _consec_pick_reference(ok, weight, cpus)


def test_a_fresh_state_is_the_cluster_as_built_and_shares_no_count():
    """``fresh`` copies the counts jobs change: jobs placed on one copy leave the template and another copy as
    built (a candidate replays several arrival orders from one built state)."""
    cluster = SimCluster((node("a", cpus=8), node("b", cpus=4)))
    template = SlurmState(cluster)
    one, two = template.fresh(), template.fresh()
    r = req(cpus=4)
    one.allocate(r, one.choose_node(r))
    one.allocate(r, one.choose_node(r))
    assert list(one.cpu) == [4, 0] and list(two.cpu) == [8, 4] and list(template.cpu) == [8, 4]
    assert one.choose_node(req(cpus=5)) == -1 and two.choose_node(req(cpus=5)) == 0  # nor what fits nowhere


def test_a_request_that_fits_nowhere_is_not_tried_again():
    """Nothing departs: a request that found no node never will, and the state remembers it; other requests
    are still placed."""
    s = SlurmState(SimCluster((node("a", cpus=4),)))
    big, small = req(cpus=8), req(cpus=2)
    assert s.choose_node(big) == -1 and big in s._nowhere
    s.fits = None  # a remembered refusal computes nothing
    assert s.choose_node(big) == -1
    del s.fits
    assert s.choose_node(small) == 0
