"""The live-loop simulator (live/sim.py): departures, the live planner's relayouts, the static baseline,
min_dwell, and the trace arrivals. Small hand-built cases; the live runs use the product's plan_live."""

from __future__ import annotations

import itertools

import pytest

from slurm_gpushare.live import sim as livesim
from slurm_gpushare.live.sim import SimJob, simulate, site_doc
from slurm_gpushare.sim.trace import parse_pod_times, parse_pods

ALL_1G = ("1g.5gb",) * 7
LIVE = {
    "enabled": True,
    "min_pending": 300,
    "min_dwell": 3600,
    "min_benefit_jobs": 1,
    "max_draining": 1,
    "max_wait": 3600,
    "change_cost": 120,
}


def one_gpu(layout, live=LIVE):
    return site_doc(1, [layout], cpus=64, memory_mb=100_000, live=live)


def test_a_job_departs_at_its_end_time_and_frees_its_instance():
    doc = one_gpu(("3g.20gb", "3g.20gb"))
    jobs = [SimJob(1, 0, 100, "3g.20gb"), SimJob(2, 0, 50, "3g.20gb"), SimJob(3, 10, 10, "3g.20gb")]
    r = simulate(doc, jobs, horizon=1000, live=False)
    assert r.ends == {1: 100, 2: 50, 3: 60}  # job 3 took job 2's instance when it left at 50
    assert r.waits == {1: 0, 2: 0, 3: 40}
    assert (r.finished, r.not_started, r.relayouts) == (3, 0, 0)
    # 2 x 3 slices for 50 s, 3 + 3 until 100 (job 3: 50..60 on job 2's instance), over 7 x 1000 slice-seconds
    assert r.allocation == pytest.approx(100 * (6 * 50 + 3 * 50 + 3 * 10) / 7000)


def test_cpus_bind_like_instances():
    doc = site_doc(1, [("3g.20gb", "3g.20gb")], cpus=8, memory_mb=100_000)
    jobs = [SimJob(1, 0, 100, "3g.20gb", cpus=6), SimJob(2, 0, 100, "3g.20gb", cpus=6)]
    r = simulate(doc, jobs, horizon=1000, live=False)
    assert r.waits == {1: 0, 2: 100}


def test_fifo_per_type_a_blocked_type_does_not_block_another():
    doc = one_gpu(("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"))
    jobs = [SimJob(1, 0, 500, "3g.20gb"), SimJob(2, 1, 100, "3g.20gb"), SimJob(3, 2, 100, "1g.5gb")]
    r = simulate(doc, jobs, horizon=1000, live=False)
    assert r.waits == {1: 0, 2: 499, 3: 0}


def shifted():
    """A 7 x 1g.5gb GPU whose 1g job runs until 1000; two 3g jobs arrive at 0, a 1g job at 600."""
    return [
        SimJob(1, 0, 1000, "1g.5gb"),
        SimJob(2, 0, 2000, "3g.20gb"),
        SimJob(3, 0, 2000, "3g.20gb"),
        SimJob(4, 600, 100, "1g.5gb"),
    ]


def test_a_shifted_mix_makes_the_live_planner_relayout_and_the_3g_jobs_start():
    r = simulate(one_gpu(ALL_1G), shifted(), horizon=5000, live=True, interval=300)
    assert r.relayouts == 1
    ((t, node, gpu, layout),) = r.changes
    assert (node, gpu) == ("sim01", 0) and layout.count("3g.20gb") == 2
    # locked at 300 (the jobs have pended min_pending), the 1g job ends at 1000 untouched, the next loop run
    # (1200) starts the relayout, change_cost later the node has its new layout and the 3g jobs start
    assert r.ends[1] == 1000
    assert t == 1200 + 120
    assert r.waits[2] == r.waits[3] == 1320
    assert r.ends[2] == r.ends[3] == 1320 + 2000
    # the node took no new job while it was locked: the 1g job of 600 waited at least for the relayout
    assert 4 not in r.ends or r.ends[4] - 100 >= 1320


def test_one_relayout_changes_every_gpu_of_the_node_that_should_change():
    """A node of two 7 x 1g.5gb GPUs, a 1g job on GPU 0 until 1000, four 3g jobs pending: one lock, one drain,
    both GPUs get 3g+3g and the four 3g jobs start together."""
    doc = site_doc(1, [ALL_1G, ALL_1G], cpus=64, memory_mb=100_000, live=LIVE)
    jobs = [SimJob(1, 0, 1000, "1g.5gb")] + [SimJob(2 + i, 0, 2000, "3g.20gb") for i in range(4)]
    r = simulate(doc, jobs, horizon=6000, live=True, interval=300)
    assert (r.relayouts, r.gpu_changes) == (1, 2)
    assert [(t, n, g, lay) for t, n, g, lay in r.changes] == [
        (1320, "sim01", 0, ("3g.20gb", "3g.20gb")),
        (1320, "sim01", 1, ("3g.20gb", "3g.20gb")),
    ]
    assert [r.waits[j] for j in range(2, 6)] == [1320] * 4


def test_every_change_of_a_proposal_goes_through_with_layouts_in_one_set():
    from slurm_gpushare.live.change import Change, LayoutStep
    from slurm_gpushare.live.report import Proposal
    from slurm_gpushare.policy.document import with_layouts

    class Plan:
        def __init__(self, proposals):
            self.proposals = proposals

    two = Change("sim01", (LayoutStep(0, ALL_1G, ("7g.40gb",)), LayoutStep(1, ALL_1G, ("3g.20gb", "3g.20gb"))))
    prop = Proposal(two, {}, (), 0.0, 0.0, 2.0, "two GPUs of sim01 in one proposal")
    calls = []

    def record(doc, node, layouts):
        calls.append((node, layouts))
        return with_layouts(doc, node, layouts)

    doc = site_doc(1, [ALL_1G, ALL_1G], cpus=64, memory_mb=100_000, live=LIVE)
    r = simulate(
        doc,
        [],
        horizon=1000,
        live=True,
        interval=300,
        decide=lambda site, view: Plan((prop,) if view.now == 300 else ()),
        with_layouts=record,
    )
    assert calls == [("sim01", {0: ("7g.40gb",), 1: ("3g.20gb", "3g.20gb")})]
    assert (r.relayouts, r.gpu_changes) == (1, 2)


def test_the_static_run_never_relayouts():
    r = simulate(one_gpu(ALL_1G), shifted(), horizon=5000, live=False)
    assert (r.relayouts, r.gpu_changes, r.plan_calls) == (0, 0, 0)
    assert r.not_started == 2  # the 3g jobs: no 3g instance, ever
    assert r.waits[2] == r.waits[3] == 5000  # counted until the horizon
    assert r.waits[4] == 0


def alternating(hours: int, block: int = 1200):
    """Demand that flips between 1g and 3g jobs every ``block`` seconds, faster than min_dwell."""
    jobs, jid = [], 0
    for k in range(hours * 3600 // block):
        profile = "3g.20gb" if k % 2 else "1g.5gb"
        for _ in range(6):
            jid += 1
            jobs.append(SimJob(jid, k * block, 900, profile))
    return jobs


def test_min_dwell_limits_changes_of_a_node():
    hours = 8
    slow = simulate(
        one_gpu(ALL_1G, {**LIVE, "min_dwell": 3600}), alternating(hours), horizon=hours * 3600, live=True, interval=300
    )
    fast = simulate(
        one_gpu(ALL_1G, {**LIVE, "min_dwell": 0}), alternating(hours), horizon=hours * 3600, live=True, interval=300
    )
    times = [t for t, *_ in slow.changes]
    assert slow.relayouts >= 2  # the demand does move the planner
    assert all(b - a >= 3600 for a, b in itertools.pairwise(times))
    assert slow.relayouts <= hours  # at most one change per min_dwell
    assert fast.relayouts > slow.relayouts  # without the dwell the same demand changes the node more often


def test_a_decision_that_proposes_nothing_changes_nothing():
    class Nothing:
        proposals = ()

    r = simulate(
        one_gpu(ALL_1G),
        shifted(),
        horizon=5000,
        live=True,
        decide=lambda site, snap: Nothing(),
        with_layouts=lambda *a: pytest.fail("with_layouts called without a proposal"),
    )
    assert r.relayouts == 0 and r.plan_calls == 16  # a run every 300 s before 5000


POD_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,\
scheduled_time
p1,4000,1000,1,100,,LS,Succeeded,10,400,100
p2,8000,2000,1,470,,LS,Running,0,999999,5
p3,6000,3000,1,470,,BE,Pending,0,90,
p4,6000,3000,1,1000,,BE,Running,0,90,0
p5,0,3000,0,0,,BE,Running,0,90,0
"""


def test_trace_pool_runtime_is_deletion_minus_scheduled_capped_and_none_when_never_scheduled():
    pods = parse_pods(POD_CSV, "t.csv")
    pool = livesim.trace_pool(pods, parse_pod_times(POD_CSV, "t.csv"))
    assert pool.by_profile == {
        "1g.5gb": ((4, 1000, 300.0),),  # 10 % of a GPU -> 1g.5gb; ran 400 - 100
        "3g.20gb": ((8, 2000, float(livesim.MAX_TIME)), (6, 3000, None)),  # capped at 1 day; p3 never ran
    }  # whole-GPU and CPU-only pods are not MIG demand


def test_trace_jobs_are_seeded_and_follow_the_phase_mix():
    pool = livesim.TracePool({"1g.5gb": ((2, 10, 600.0),), "3g.20gb": ((4, 20, 1200.0), (4, 20, None))})
    phases = (
        livesim.Phase("A", 2, (("1g.5gb", 0.9), ("3g.20gb", 0.1))),
        livesim.Phase("B", 2, (("1g.5gb", 0.1), ("3g.20gb", 0.9))),
    )
    a = livesim.trace_jobs(pool, phases, gpus=8, seed=5)
    assert a == livesim.trace_jobs(pool, phases, gpus=8, seed=5)
    assert a != livesim.trace_jobs(pool, phases, gpus=8, seed=6)
    first = [j for j in a if j.phase == 0]
    second = [j for j in a if j.phase == 1]
    assert all(j.submit < 7200 for j in first) and all(7200 <= j.submit < 14400 for j in second)

    def share(js):
        return sum(j.profile == "3g.20gb" for j in js) / len(js)

    assert share(first) < 0.3 and share(second) > 0.7
    assert {j.duration for j in a if j.profile == "3g.20gb"} == {1200.0}  # the unknown runtime drawn from the known


def test_static_layouts_pack_the_phase_mix_on_every_gpu_of_a_node():
    pool = livesim.TracePool({"1g.5gb": ((1, 1, 1000.0),), "3g.20gb": ((1, 1, 1000.0),)})
    lays = livesim.static_layouts(pool, livesim.Phase("A", 1, (("1g.5gb", 0.5), ("3g.20gb", 0.5))), gpus=4)
    assert len(lays) == 4
    flat = [p for lay in lays for p in lay]
    assert flat.count("3g.20gb") >= 3 and flat.count("1g.5gb") >= 3
