"""The live planner's node weights (live/weights.py through plan_live), and the apply path's
`scontrol update nodename=<node> weight=<n>` (live/steps.py SetWeight, live/apply.py) on the stateful fake."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from slurm_gpushare.live.plan import plan_live
from slurm_gpushare.live.view import ClusterView, NodeView, PendingJob, RunningJob
from slurm_gpushare.policy import build_site
from slurm_gpushare.slurm import commands

NOW = 1_800_000_000.0
L40S = "gpu:l40s"
DOC = {
    "version": 1,
    "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
    "node_groups": [
        {"name": "excl", "nodes": "e[01-02]", "gpu": {"model": "L40S", "count": 2}, "cpus": 16, "memory_mb": 64000}
    ],
    "tiers": [{"name": "batch", "node_groups": ["excl"], "default": True}],
    "live": {"enabled": True, "min_pending": 300},
}


def site(nodes="e[01-02]", **live):
    d = copy.deepcopy(DOC)
    d["node_groups"][0]["nodes"] = nodes
    d["live"].update(live)
    return build_site(d, "test")


def big(n=1, count=2, first=100, age=1800.0):
    return tuple(PendingJob(first + i, L40S, count, age, 10, "Resources", "batch") for i in range(n))


# e01's small job ends in 100 s, e02's in 500 s: neither node has 2 free L40S now
SMALL = (RunningJob(1, "e01", {L40S: 1}, NOW + 100), RunningJob(2, "e02", {L40S: 1}, NOW + 500))


def view(name, weight=1, state=("MIXED",)):
    return NodeView(name, state, "", {L40S: 2}, weight)


def snap(pending, running=SMALL, weights=(1, 1), steered=None):
    nodes = {f"e0{i + 1}": view(f"e0{i + 1}", w) for i, w in enumerate(weights)}
    return ClusterView(NOW, tuple(pending), tuple(running), nodes, {}, frozenset(), (), dict(steered or {}))


def test_a_blocked_two_gpu_job_keeps_the_node_that_frees_first():
    plan = plan_live(site(), snap(big()))
    (w,) = plan.weights
    assert (w.node, w.old, w.new, w.jobs) == ("e01", 1, 2, (100,))
    assert w.line == (
        "job 100 has waited 30 min for 2 x l40s on one node; e01 can hold it (its GPU jobs 1 end in "
        "2 min): weight 1 -> 2, above e02 (1), so new small l40s jobs go there first; cost: none "
        "(scontrol update, no drain; slurm.conf's weight comes back at the next reconfigure)"
    )
    assert "weights:" in plan.report() and plan.to_dict()["weights"][0]["new"] == 2
    assert plan.proposals == ()  # a weight is no relayout
    assert any(
        line.startswith("gpu:l40s: 1 pending") and "node weights can keep small jobs off" in line
        for line in plan.demand
    )


def test_one_node_per_blocked_large_job():
    running = SMALL + (RunningJob(3, "e03", {L40S: 1}, NOW + 50),)
    (a, b) = plan_live(
        site("e[01-03]"),
        ClusterView(NOW, big(2), running, {"e01": view("e01"), "e02": view("e02"), "e03": view("e03")}),
    ).weights
    # e03 frees first (50 s), then e01 (100 s): one kept for each blocked job; e02 takes the small jobs
    assert [(x.node, x.new) for x in (a, b)] == [("e01", 2), ("e03", 2)]


def test_nothing_to_steer():
    assert plan_live(site("e01"), ClusterView(NOW, big(), SMALL[:1], {"e01": view("e01")})).weights == ()  # no other
    assert plan_live(site(), snap(big(count=1))).weights == ()  # a 1-GPU job is small: not kept for
    assert plan_live(site(), snap(big(), weights=(5, 1))).weights == ()  # e01 is above e02 already
    assert plan_live(site(weights=False), snap(big())).weights == ()
    assert plan_live(site(), snap(big(age=60))).weights == ()  # not pending for min_pending yet
    assert plan_live(site(), snap(big(), running=())).weights == ()  # it fits idle GPUs now: Slurm starts it


def test_the_policys_weight_comes_back_when_nothing_large_waits():
    (w,) = plan_live(site(), snap((), weights=(2, 1), steered={"e01": 2})).weights
    assert (w.node, w.old, w.new, w.jobs) == ("e01", 2, 1, ())
    assert w.line == "no job waits for several whole GPUs on one node; e01: weight 2 -> 1 (the policy's)"
    # a weight someone else changed since (an admin; a reconfigure put slurm.conf's back) is left alone
    assert plan_live(site(), snap((), weights=(7, 1), steered={"e01": 2})).weights == ()
    assert plan_live(site(), snap((), weights=(1, 1), steered={"e01": 2})).weights == ()
    # while the large job still waits, the weight stays (nothing proposed: e01 is above e02 already)
    assert plan_live(site(), snap(big(), weights=(2, 1), steered={"e01": 2})).weights == ()


def test_every_steered_node_gets_the_policys_weight_back():
    back = plan_live(site(), snap((), weights=(2, 3), steered={"e01": 2, "e02": 3})).weights
    assert [(w.node, w.old, w.new) for w in back] == [("e01", 2, 1), ("e02", 3, 1)]


def test_the_weight_command_is_slurms_node_update():
    assert commands.set_weight("e01", 2) == ["scontrol", "update", "nodename=e01", "weight=2"]


# ---- the apply path ------------------------------------------------------------------------------------


def test_apply_sets_the_weight_through_the_client_and_puts_it_back(tmp_path: Path):
    from slurm_gpushare.live.apply import LiveApply
    from slurm_gpushare.slurm.model import Node
    from tests.unit.live.test_apply import Clock, FakeClient
    from tests.unit.live_fakes import FakeCtld, carol_job

    d = copy.deepcopy(DOC)
    d["cluster"]["paths"] = {"slurm_conf_dir": str(tmp_path / "etc-slurm")}
    d["live"]["min_pending"] = 0
    policy = tmp_path / "gpushare.yaml"
    policy.write_text(yaml.safe_dump(d, sort_keys=False))
    ctld = FakeCtld()
    now = int(ctld.now)

    def job(i, state, count, node=""):
        return carol_job(i, state, L40S, now, node, count)

    jobs = [job(1, "RUNNING", 1, "e01"), job(2, "RUNNING", 1, "e02"), job(3, "PENDING", 2)]

    def node(name):
        return Node(name, ("MIXED",), "", {L40S: 2}, {}, (), (), ctld.weights.get(name, 1), ("batch",), 16, 1, 64000, 0)

    class Client(FakeClient):
        def nodes(self):
            return [node("e01"), node("e02")]

    live = LiveApply(policy, Client(ctld, jobs, []), clock=Clock(ctld))
    first = live.run_once()
    assert ctld.weights == {"e01": 2}, first.lines
    assert ("scontrol", "update", "nodename=e01", "weight=2") in ctld.calls
    assert live.store.read().weights == {"e01": 2}
    assert not ctld.reservations and not ctld.jobs  # no lock, no relayout job, no drain
    assert any(line.startswith("e01: weight 1 -> 2: job 3 has waited") for line in first.lines)

    assert live.run_once().actions == []  # still waiting, already steered: nothing to do

    live.client._jobs = jobs[:2]  # job 3 started elsewhere (or ended)
    last = live.run_once()
    assert ctld.weights == {"e01": 1} and live.store.read().weights == {}, last.lines
