"""The live planner (live/plan.py) on hand-built cluster views, with_layout(s) on policy documents, the policy's
live: section, and `gpushare live report` over a runner that answers squeue/scontrol --json as Slurm 24.11 does."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.errors import PolicyError
from slurm_gpushare.hardware import check_layout, get_model
from slurm_gpushare.live.catalogue import candidate_layouts
from slurm_gpushare.live.plan import plan_live
from slurm_gpushare.live.view import ClusterView, NodeView, PendingJob, RunningJob, live_policy_path, view_from_client
from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.document import with_layout, with_layouts
from slurm_gpushare.proc import Result
from slurm_gpushare.render.files import render_all
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.history import history_argv

T1 = "gpu:a100_40g_1g.5gb"
T3 = "gpu:a100_40g_3g.20gb"
NOW = 1_800_000_000.0

POLICY = {
    "version": 1,
    "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
    "node_groups": [
        {
            "name": "mig",
            "nodes": "m[01-02]",
            "gpu": {"model": "A100-SXM4-40GB", "count": 2},
            "cpus": 16,
            "memory_mb": 64000,
            "sharing": [{"gpus": "0-1", "mode": "mig", "layout": "all-1g.5gb"}],
        },
        {"name": "excl", "nodes": "e01", "gpu": {"model": "L40S", "count": 2}, "cpus": 16, "memory_mb": 64000},
    ],
    "tiers": [
        {"name": "batch", "node_groups": ["mig", "excl"], "default": True},
        {"name": "night", "node_groups": ["mig"]},
    ],
    "live": {
        "enabled": True,
        "min_pending": 300,
        "min_dwell": 3600,
        "min_benefit_jobs": 1,
        "max_draining": 1,
        "max_wait": 3600,
        "change_cost": 120,
    },
}


def doc(**live) -> dict:
    d = copy.deepcopy(POLICY)
    d["live"].update(live)
    return d


def site(**live):
    return build_site(doc(**live), "test")


def one_node(**live):
    """One MIG node (m01) with one A100 laid out 7x1g.5gb."""
    d = doc(**live)
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    return build_site(d, "test")


def pending(n, gres=T3, age=1500.0, first=100, partition="batch", reason="Resources", priority=10):
    return tuple(PendingJob(first + i, gres, 1, age, priority, reason, partition) for i in range(n))


def node(name="m01", gres=None, state=("MIXED",), reason=""):
    return NodeView(name, state, reason, dict(gres or {T1: 7}))


def snap(pend, running=(), nodes=None, changes=None, locked=frozenset(), now=NOW):
    nodes = nodes or {"m01": node()}
    return ClusterView(now, tuple(pend), tuple(running), nodes, dict(changes or {}), frozenset(locked))


RUNNING_1G = (RunningJob(12, "m01", {T1: 1}, NOW + 200), RunningJob(13, "m01", {T1: 1}, NOW + 230))


# ---- the decision ------------------------------------------------------------------------------


def test_3g_jobs_pending_on_a_7x1g_node_relayout_once_its_1g_jobs_end():
    plan = plan_live(one_node(), snap(pending(9), RUNNING_1G))
    assert plan.held == ()
    (p,) = plan.proposals
    assert (
        p.change.layouts == ((0, ("1g.5gb",) * 7, ("3g.20gb", "3g.20gb")),) and p.node == "m01"
    )  # the catalogue's only layout with two 3g.20gb
    assert p.starts == {"a100_40g_3g.20gb": 2} and p.benefit == 2
    assert p.must_finish == (12, 13) and p.ready_in_s == 230 and p.cost_s == 230 + 120
    assert p.line == (
        "9 jobs have waited 25 min for a100_40g_3g.20gb; m01 GPU 0 has 5 of 7 1g.5gb slices idle: "
        "relayout to 3g.20gb+3g.20gb lets 2 start; cost: jobs 12,13 must finish (the last ends in 4 min) "
        "+ 2 min drain and re-registration"
    )
    assert any(
        line.startswith("a100_40g_3g.20gb: 9 pending, 9 for >= 5 min") and "9 blocked" in line for line in plan.demand
    )
    assert "proposals:" in plan.report() and json.dumps(plan.to_dict())


def test_a_node_without_gpu_jobs_costs_only_the_change():
    (p,) = plan_live(one_node(), snap(pending(2))).proposals
    assert p.must_finish == () and p.ready_in_s == 0 and p.cost_s == 120
    assert "cost: no GPU job on the node + 2 min drain" in p.line and "has 7 idle 1g.5gb slices" in p.line
    (p,) = plan_live(one_node(), snap(pending(2), RUNNING_1G, now=NOW + 300)).proposals  # past their limits
    assert p.ready_in_s == 0 and "jobs 12,13 must finish (at their time limit now)" in p.line


def test_jobs_that_fit_idle_instances_now_are_left_to_slurm():
    plan = plan_live(one_node(), snap(pending(5, T1), RUNNING_1G))  # 5 idle 1g.5gb: they start without a change
    assert plan.proposals == () and plan.held == ()
    assert any("5 fit idle instances now, 0 blocked" in line for line in plan.demand)


def test_young_held_or_unknown_jobs_do_not_count():
    young = pending(3, age=100)
    held = pending(3, first=200, reason="JobHeldUser")
    other = pending(3, first=300, partition="elsewhere")  # a partition no MIG node is in
    plan = plan_live(one_node(), snap(young + held + other))
    assert plan.proposals == ()
    assert plan_live(one_node(min_pending=60), snap(young)).proposals != ()


def test_not_mig_requests_are_reported_not_planned():
    plan = plan_live(one_node(), snap(pending(2, "gpu:l40s") + pending(1, "shard", first=50)))
    assert plan.proposals == ()
    assert [line.split(":")[0] for line in plan.demand] == ["gpu", "shard"]
    # no GPU of this site shares by shard: nothing can serve it; whole L40S jobs: only weights could help
    assert "not a MIG type, and no GPU of the site can change to a mode that serves it" in plan.demand[1]
    assert "node weights can keep small jobs off the nodes a multi-GPU job needs" in plan.demand[0]
    assert plan.weights == ()  # e01 is not in the snapshot's nodes


def test_the_old_layouts_service_is_subtracted():
    # 6 pending 1g.5gb jobs are blocked (all 7 busy); after the drain the present layout would start 6 of them:
    # a 3g+3g layout starting 2 3g jobs loses 6, so no change; 3g+4x1g starts 1 3g and 4 1g: -1
    busy = tuple(RunningJob(20 + i, "m01", {T1: 1}, NOW + 60) for i in range(7))
    jobs = pending(6, T1, priority=20) + pending(2, T3, first=200)
    assert plan_live(one_node(), snap(jobs, busy)).proposals == ()


def test_priority_order_decides_which_jobs_a_layout_serves():
    busy = tuple(RunningJob(20 + i, "m01", {T1: 1}, NOW + 60) for i in range(7))
    jobs = pending(2, T3, priority=50) + pending(6, T1, first=200, priority=1)  # 3g first: 2 of them > 6 1g
    plan = plan_live(one_node(), snap(jobs, busy))
    assert plan.proposals == ()  # net: 2 3g gained, 6 1g lost
    jobs = pending(9, T3, priority=50) + pending(1, T1, first=200, priority=1)
    (p,) = plan_live(one_node(), snap(jobs, busy)).proposals
    # 3g.20gb+3g.20gb starts 2 and drops the 1g job, 3g+4x1g starts 1 and keeps it: 1 either way, and the same
    # wait; the smaller change wins
    assert p.benefit == 1 and p.change.new_layouts == {0: ("3g.20gb",) + ("1g.5gb",) * 4}
    assert p.starts == {"a100_40g_3g.20gb": 1}


def test_min_benefit_holds_a_small_change():
    plan = plan_live(one_node(min_benefit_jobs=3), snap(pending(9), RUNNING_1G))
    assert plan.proposals == ()
    (h,) = plan.held
    assert (h.node, h.change.new_layouts) == ("m01", {0: ("3g.20gb", "3g.20gb")})
    assert "lets 2 more pending job(s) start; min_benefit_jobs is 3" in h.why


def test_dwell_holds_a_node_changed_recently():
    plan = plan_live(one_node(), snap(pending(9), changes={"m01": NOW - 600}))
    assert plan.proposals == ()
    assert "changed (or tried) 10 min ago; min_dwell is 60 min" in plan.held[0].why
    assert plan_live(one_node(), snap(pending(9), changes={"m01": NOW - 3600})).proposals != ()


def test_demand_alternating_faster_than_the_dwell_changes_a_node_once():
    """Every 10 minutes for two hours the demand flips between 1g.5gb and 3g.20gb jobs; each proposal is carried
    out (the live policy gets the layout, the change is recorded): the node changes once per min_dwell."""
    live_doc, changes, made, held = doc(), {}, [], {}
    live_doc["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    for step in range(12):
        now = NOW + 600 * step
        s = build_site(live_doc, "live")
        gres = {k: v for (n, t), v in s.group_for_node("m01").gres.items() for k in [f"{n}:{t}"]}
        kind = T3 if step % 2 == 0 else T1
        plan = plan_live(
            s, snap(pending(9, kind, first=1000 * step), nodes={"m01": node(gres=gres)}, changes=changes, now=now)
        )
        held[now - NOW] = list(plan.held)
        for p in plan.proposals:
            (layout,) = p.change.new_layouts.values()
            made.append((now, layout))
            live_doc = with_layouts(live_doc, p.node, p.change.new_layouts)
            changes[p.node] = now
    # at 0 s to 3g; the 1g demand of 600, 1800 and 3000 s is held (dwell), the 3g demand between finds 3g;
    # at 4200 s (the first 1g demand after min_dwell) back to 1g; the 3g demand after it is held again
    assert [(t - NOW, layout) for t, layout in made] == [(0, ("3g.20gb", "3g.20gb")), (4200, ("1g.5gb",) * 7)]
    assert held[600] and all("min_dwell is 60 min" in h.why for h in held[600] + held[4800])
    assert all(b - a >= 3600 for (a, _), (b, _) in zip(made, made[1:], strict=False))


def test_max_draining_counts_locked_and_relayout_drained_nodes_per_tier():
    s = site()
    nodes = {"m01": node("m01", {T1: 14}), "m02": node("m02", {T1: 14})}
    plan = plan_live(s, snap(pending(9), nodes=nodes))
    assert [p.node for p in plan.proposals] == ["m01"]  # one per tier at once
    assert "tier batch, night already has 1 node(s) under relayout; max_draining is 1" in plan.held[0].why
    assert plan.held[0].node == "m02"
    # m02 under relayout (its lock): m01 waits; the held line names m02's relayout
    plan = plan_live(s, snap(pending(9), nodes=nodes, locked={"m02"}))
    assert plan.proposals == () and [h.node for h in plan.held] == ["m02", "m01"]
    assert "under relayout" in plan.held[0].why and "max_draining is 1" in plan.held[1].why
    drained = {**nodes, "m02": node("m02", {T1: 14}, ("IDLE", "DRAIN"), "gpushare relayout failed: timeout")}
    assert plan_live(s, snap(pending(9), nodes=drained)).proposals == ()
    assert [p.node for p in plan_live(site(max_draining=2), snap(pending(9), nodes=nodes)).proposals] == ["m01", "m02"]


def test_the_faster_node_is_chosen():
    s = site()
    nodes = {"m01": node("m01", {T1: 14}), "m02": node("m02", {T1: 14})}
    running = (RunningJob(12, "m01", {T1: 1}, NOW + 900),)
    assert [p.node for p in plan_live(s, snap(pending(2), running, nodes=nodes)).proposals] == ["m02"]


def test_unknown_end_time_and_max_wait_hold_the_change():
    unlimited = (RunningJob(12, "m01", {T1: 1}, None),)
    (h,) = plan_live(one_node(), snap(pending(9), unlimited)).held
    assert "job(s) 12 on the node have no end time" in h.why
    late = (RunningJob(12, "m01", {T1: 1}, NOW + 7200),)
    (h,) = plan_live(one_node(), snap(pending(9), late)).held
    assert "the last in 120 min; max_wait is 60 min" in h.why
    assert plan_live(one_node(max_wait=7200), snap(pending(9), late)).proposals != ()


def test_a_node_drained_by_someone_else_or_with_other_gres_is_left_alone():
    maint = {"m01": node(state=("IDLE", "DRAIN"), reason="fan replaced")}
    (h,) = plan_live(one_node(), snap(pending(9), nodes=maint)).held
    assert "by someone else (reason: fan replaced)" in h.why
    other = {"m01": node(gres={T3: 2})}
    (h,) = plan_live(one_node(), snap(pending(9), nodes=other)).held
    assert "Slurm has Gres gpu:a100_40g_3g.20gb:2, the policy gpu:a100_40g_1g.5gb:7" in h.why


def test_one_proposal_per_node_even_with_two_mig_gpus():
    nodes = {"m01": node("m01", {T1: 14}), "m02": node("m02", {T1: 14})}
    plan = plan_live(site(max_draining=5), snap(pending(20), nodes=nodes))
    assert sorted(p.node for p in plan.proposals) == ["m01", "m02"]
    # each node changes both its GPUs in its one drain (2 x 3g.20gb each); the jobs m01's change starts are not
    # counted again for m02
    assert [p.benefit for p in plan.proposals] == [4, 4]
    plan = plan_live(site(max_draining=5), snap(pending(6), nodes=nodes))
    assert [(p.node, p.benefit, list(p.change.gpus)) for p in plan.proposals] == [("m01", 4, [0, 1]), ("m02", 2, [0])]


def two_gpu_node(layouts, **live):
    """One MIG node (m01) with two A100s, GPU i laid out ``layouts[i]``."""
    d = doc(**live)
    d["node_groups"][0].update(
        nodes="m01", sharing=[{"gpus": i, "mode": "mig", "layout": list(lay)} for i, lay in enumerate(layouts)]
    )
    s = build_site(d, "test")
    gres = {f"{n}:{t}": c for (n, t), c in s.group_for_node("m01").gres.items()}
    return d, s, {"m01": node("m01", gres)}


def test_both_gpus_of_a_node_change_in_one_proposal():
    d, s, nodes = two_gpu_node([("1g.5gb",) * 7, ("1g.5gb",) * 7])
    plan = plan_live(s, snap(pending(9), RUNNING_1G, nodes=nodes), d)
    (p,) = plan.proposals
    three = ("3g.20gb", "3g.20gb")
    assert p.change.layouts == ((0, ("1g.5gb",) * 7, three), (1, ("1g.5gb",) * 7, three))
    assert p.change.new_layouts == {0: three, 1: three} and p.change.modes == ()
    assert p.benefit == 4 and p.starts == {"a100_40g_3g.20gb": 4}
    assert p.must_finish == (12, 13) and p.cost_s == 230 + 120  # one drain for both
    assert p.line == (
        "9 jobs have waited 25 min for a100_40g_3g.20gb; m01 GPUs 0-1 have 12 of 14 1g.5gb slices "
        "idle: relayout GPUs 0-1 to 3g.20gb+3g.20gb lets 4 start; cost: jobs 12,13 must finish (the "
        "last ends in 4 min) + 2 min drain and re-registration"
    )
    # the policy the apply side writes: both GPUs, one node, valid
    live = with_layouts(d, "m01", p.change.new_layouts)
    assert build_site(live, "t").group_for_node("m01").gres[("gpu", "a100_40g_3g.20gb")] == 4
    assert live == with_layout(with_layout(d, "m01", 0, three), "m01", 1, three)


def test_a_gpu_whose_layout_is_already_best_is_kept():
    three = ("3g.20gb", "3g.20gb")
    d, s, nodes = two_gpu_node([three, ("1g.5gb",) * 7])
    busy = (RunningJob(12, "m01", {T3: 1}, NOW + 200), RunningJob(13, "m01", {T3: 1}, NOW + 200))
    (p,) = plan_live(s, snap(pending(4), busy, nodes=nodes), d).proposals
    assert p.change.layouts == ((1, ("1g.5gb",) * 7, three),) and p.benefit == 2
    assert "m01 GPU 1 has 7 idle 1g.5gb slices: relayout to 3g.20gb+3g.20gb lets 2 start" in p.line
    # different needs per GPU: one 3g.20gb and 1g.5gb jobs blocked -> GPU 0 keeps 3g+3g (one 3g is busy, the other
    # serves the 3g job), GPU 1 keeps 7 x 1g: nothing to change
    jobs = pending(1, first=300) + pending(7, T1, first=400)
    busy1g = tuple(RunningJob(20 + i, "m01", {T1: 1}, NOW + 60) for i in range(7))
    assert plan_live(s, snap(jobs, busy + busy1g, nodes=nodes), d).proposals == ()


def test_mixed_demand_gets_a_different_layout_per_gpu():
    d, s, nodes = two_gpu_node([("1g.5gb",) * 7, ("1g.5gb",) * 7])
    busy = tuple(RunningJob(20 + i, "m01", {T1: 1}, NOW + 60) for i in range(14))
    jobs = pending(3, T3, priority=50) + pending(3, T1, first=200, priority=40)
    (p,) = plan_live(s, snap(jobs, busy, nodes=nodes), d).proposals
    # GPU 0: 3g+3g starts 2 3g jobs and GPU 1's 7 1g instances the 3 1g jobs (5 > 3 kept); GPU 1 then: 3g+4x1g
    # starts the third 3g job and keeps room for the 3 1g jobs (6 > 5)
    mixed = ("3g.20gb",) + ("1g.5gb",) * 4
    assert p.change.layouts == ((0, ("1g.5gb",) * 7, ("3g.20gb", "3g.20gb")), (1, ("1g.5gb",) * 7, mixed))
    assert p.benefit == 3 and p.starts == {"a100_40g_3g.20gb": 3}
    assert "relayout GPU 0 to 3g.20gb+3g.20gb and GPU 1 to 3g.20gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb lets 3 start" in p.line


def test_a_refused_set_of_layouts_keeps_what_the_policy_needs():
    d, s, nodes = two_gpu_node([("1g.5gb",) * 7, ("1g.5gb",) * 7])
    d["submission"] = {"aliases": {"small": T1}}  # 1g.5gb must stay on some GPU of the cluster
    d["node_groups"][0]["nodes"] = "m01"
    d["node_groups"] = [d["node_groups"][0]]
    d["tiers"] = [{"name": "batch", "node_groups": ["mig"], "default": True}]
    s = build_site(d, "t")
    plan = plan_live(s, snap(pending(9), nodes=nodes), d)
    (p,) = plan.proposals
    news = [step.new for step in p.change.layouts]
    assert p.change.layouts[0].new == ("3g.20gb", "3g.20gb")  # GPU 0 still takes 3g+3g: GPU 1 keeps 1g.5gb
    assert any("1g.5gb" in new for new in news) and p.benefit == 3
    (h,) = plan.held  # the set the policy refuses (both GPUs 3g+3g) and why
    assert len(h.change.layouts) == 2 and "would let 4 pending job(s) start" in h.why
    assert "held: m01 GPUs 0-1 to 3g.20gb+3g.20gb: " in h.line and "submission.aliases.small" in h.why


def test_a_layout_the_policy_refuses_is_not_proposed():
    d = doc()
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    d["submission"] = {"aliases": {"small": T1}}  # the site names 1g.5gb: it must stay somewhere
    plan = plan_live(build_site(d, "t"), snap(pending(9)))
    (p,) = plan.proposals
    (new,) = p.change.new_layouts.values()
    assert "1g.5gb" in new and new.count("3g.20gb") == 1
    (h,) = plan.held  # the better layout, and why the policy refuses it
    assert (
        tuple(h.change.new_layouts.values()) == (("3g.20gb", "3g.20gb"),)
        and "would let 2 pending job(s) start" in h.why
    )
    assert "submission.aliases.small" in h.why


def test_candidate_layouts_are_the_catalogues_full_layouts():
    model = get_model("A100-SXM4-40GB")
    layouts = candidate_layouts(model)
    assert ("1g.5gb",) * 7 in layouts and ("7g.40gb",) in layouts and ("3g.20gb", "3g.20gb") in layouts
    for layout in layouts:
        assert check_layout(model, list(layout)) == []
        assert all(check_layout(model, list(layout) + [p.name]) for p in model.mig_profiles if "+me" not in p.name)


# ---- with_layout -------------------------------------------------------------------------------


def test_with_layout_splits_the_node_out_and_renders_it_alone():
    before = render_all(site())["slurm.conf"]
    d = with_layout(doc(), "m01", 1, ("3g.20gb", "3g.20gb"))
    groups = {g["name"]: g for g in d["node_groups"]}
    assert groups["mig"]["nodes"] == "m02" and groups["mig-m01"]["nodes"] == "m01"
    assert groups["mig-m01"]["sharing"] == [
        {"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"},
        {"gpus": 1, "mode": "mig", "layout": ["3g.20gb", "3g.20gb"]},
    ]
    assert [t["node_groups"] for t in d["tiers"]] == [["mig", "mig-m01", "excl"], ["mig", "mig-m01"]]
    after = render_all(build_site(d, "live"))["slurm.conf"]

    def node_line(text, name):
        return next(line for line in text.splitlines() if line.startswith(f"NodeName={name} "))

    assert "Gres=gpu:a100_40g_1g.5gb:7,gpu:a100_40g_3g.20gb:2 " in node_line(after, "m01")
    assert node_line(after, "m02")[len("NodeName=m02") :] == node_line(before, "m[01-02]")[len("NodeName=m[01-02]") :]
    assert node_line(after, "e01") == node_line(before, "e01")
    assert d is not POLICY and POLICY["node_groups"][0]["nodes"] == "m[01-02]"  # the input is not changed


def test_with_layout_on_a_node_alone_in_its_group_keeps_the_group():
    d = with_layout(with_layout(doc(), "m01", 0, ("7g.40gb",)), "m01", 0, ("4g.20gb", "3g.20gb"))
    assert [g["name"] for g in d["node_groups"]] == ["mig", "mig-m01", "excl"]
    sharing = d["node_groups"][1]["sharing"]
    assert sharing[0] == {"gpus": 0, "mode": "mig", "layout": ["4g.20gb", "3g.20gb"]}


def test_with_layout_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="node 'x01' is in no node group"):
        with_layout(doc(), "x01", 0, ("7g.40gb",))
    with pytest.raises(ValueError, match="no MIG sharing entry in node group excl"):
        with_layout(doc(), "e01", 0, ("7g.40gb",))
    with pytest.raises(ValueError, match="GPU 2 of node m01: node group mig has 2 GPU"):
        with_layout(doc(), "m01", 2, ("7g.40gb",))
    with pytest.raises(PolicyError):
        with_layout(doc(), "m01", 0, ("7g.40gb", "1g.5gb"))  # no room: the catalogue says so


# ---- the policy's live: section -----------------------------------------------------------------


def test_live_defaults_and_path():
    d = doc()
    del d["live"]
    s = build_site(d, "t")
    assert s.policy.live.enabled is False and s.policy.live.min_dwell == 3600 and s.policy.live.change_cost == 120
    assert live_policy_path(s) == "/etc/slurm/gpushare-live.yaml"
    assert live_policy_path(site(policy_file="/srv/live.yaml")) == "/srv/live.yaml"


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("min_benefit_jobs", 0, "live.min_benefit_jobs"),
        ("max_draining", 0, "live.max_draining"),
        ("min_dwell", -1, "live.min_dwell"),
        ("dwell", 5, "unknown key; allowed here: change_cost, enabled, history_window, max_draining"),
        ("history", 3600, "unknown key; allowed here: change_cost, enabled, history_window"),
        ("history_window", -1, "live.history_window"),
        ("history_window", 8 * 86400, "live.history_window"),
        ("history_window", "6h", "live.history_window"),
        ("modes", "sometimes", "live.modes"),
        ("policy_file", "live.yaml", "live.policy_file"),
        ("policy_file", "/etc/slurm/../x.yaml", "no '..'"),
    ],
)
def test_live_section_is_strict(key, value, says):
    with pytest.raises(PolicyError) as err:
        site(**{key: value})
    assert says in "; ".join(f"{p.path}: {p.message}" for p in err.value.problems)


# ---- reading Slurm, and the CLI ------------------------------------------------------------------


def _t(value):
    return {"set": value is not None, "infinite": False, "number": value or 0}


def _job(job_id, state, gres, node="", end=None, age=1500, reason="None", priority=10):
    j = {
        "job_id": job_id,
        "job_state": [state],
        "state_reason": reason,
        "partition": "batch",
        "name": "j",
        "user_name": "alice",
        "account": "physics",
        "qos": "normal",
        "nodes": node,
        "tres_per_node": f"gres/{gres}:1",
        "submit_time": _t(int(NOW - age)),
        "end_time": _t(end),
        "priority": _t(priority),
    }
    if state == "RUNNING":
        j["gres_detail"] = [f"{gres}:1(IDX:{job_id % 7})"]
        j["job_resources"] = {"nodes": {"allocation": [{"name": node}]}}
    return j


def _node(name, gres, state=("MIXED",), reason=""):
    return {"name": name, "state": list(state), "reason": reason, "gres": gres, "tres_used": ""}


class SqueueScontrol:
    """A Runner answering `squeue --all --json`, `scontrol show node --json` and `scontrol show reservation
    --json` (data_parser v0.0.42 shapes, as in tests/data/slurm/recorded-24.11.5), and the history's sacct
    (``history``: its --parsable2 lines, answered for any window, only with SLURM_TIME_FORMAT=%s); anything else
    raises."""

    def __init__(self, jobs, nodes, reservations=(), history=()):
        self.answers = {
            tuple(commands.SQUEUE_JSON): json.dumps({"jobs": jobs}),
            tuple(commands.NODES_JSON): json.dumps({"nodes": nodes}),
            tuple(commands.RESERVATIONS_JSON): json.dumps({"reservations": list(reservations)}),
        }
        self.history = list(history)
        self.calls = []

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[:1] == ("sacct",):
            window = history_argv(0, 1)
            if len(argv) != len(window) or [a for i, a in enumerate(argv) if i not in (6, 8)] != [
                a for i, a in enumerate(window) if i not in (6, 8)
            ]:
                raise AssertionError(f"not the live planner's history query: {argv}")
            if (env or {}).get("SLURM_TIME_FORMAT") != "%s":
                raise AssertionError("sacct without SLURM_TIME_FORMAT=%s: its times would not be epoch seconds")
            return Result(argv, 0, "".join(line + "\n" for line in self.history), "")
        if argv not in self.answers:
            raise AssertionError(f"the live report runs only squeue/scontrol --json, not {argv}")
        return Result(argv, 0, self.answers[argv], "")


def cluster(reservations=()):
    jobs = [_job(12, "RUNNING", T1, "m01", end=int(NOW + 200)), _job(13, "RUNNING", T1, "m01", end=int(NOW + 230))]
    jobs += [_job(100 + i, "PENDING", T3, reason="Resources") for i in range(9)]
    jobs.append(_job(99, "PENDING", "gpu:l40s", reason="Priority", age=60))
    return SqueueScontrol(jobs, [_node("m01", "gpu:a100_40g_1g.5gb:7"), _node("e01", "gpu:l40s:2")], reservations)


def test_snapshot_from_the_client():
    s = one_node()
    snapshot = view_from_client(CliClient(cluster()), s, NOW, {"m01": NOW - 10}, {"m02"})
    assert snapshot.running == RUNNING_1G
    assert snapshot.pending[0] == PendingJob(100, T3, 1, 1500.0, 10, "Resources", "batch")
    assert snapshot.nodes["m01"] == NodeView("m01", ("MIXED",), "", {T1: 7}, 0)  # no weight in the fake's JSON
    assert snapshot.changes == {"m01": NOW - 10} and snapshot.locked == frozenset({"m02"})
    assert plan_live(s, snapshot).held[0].why.startswith("changed (or tried) 0 min ago")


def write_policy(tmp_path, d):
    d["live"]["policy_file"] = str(tmp_path / "gpushare-live.yaml")  # absent: --policy is what runs
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def test_plan_live_cli_prints_demand_proposals_and_held(tmp_path):
    d = doc()
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    policy = write_policy(tmp_path, d)
    runner = cluster()
    res = CliRunner().invoke(
        main,
        ["live", "report", "--policy", str(policy), "--slurm-backend", "cli"],
        obj={"runner": runner, "clock": lambda: NOW},
    )
    assert res.exit_code == 0, res.output
    out = res.output
    assert f"policy: {policy}\n" in out and "limits: min_pending 300 s, min_dwell 3600 s" in out
    assert (
        "history: 0 GPU job(s) ended in the last 21600 s (live.history_window); modes: planned; weights: planned\n"
        in out
    )
    assert "  a100_40g_3g.20gb: 9 pending, 9 for >= 5 min for resources (oldest 25 min); 0 fit idle" in out
    assert "  gpu:l40s: 1 pending, 0 for >= 5 min" in out
    assert (
        "  9 jobs have waited 25 min for a100_40g_3g.20gb; m01 GPU 0 has 5 of 7 1g.5gb slices idle: relayout "
        "to 3g.20gb+3g.20gb lets 2 start; cost: jobs 12,13 must finish (the last ends in 4 min)"
    ) in out
    assert {c for c in runner.calls if c[0] != "sacct"} <= {
        tuple(commands.SQUEUE_JSON),
        tuple(commands.NODES_JSON),
        tuple(commands.RESERVATIONS_JSON),
    }  # reads only
    assert [c[:2] for c in runner.calls if c[0] == "sacct"] == [("sacct", "-a")]  # the history, once

    res = CliRunner().invoke(
        main, ["live", "report", "--json", "--policy", str(policy)], obj={"runner": cluster(), "clock": lambda: NOW}
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["policy"] == str(policy) and got["held"] == []
    assert [(p["node"], p["new_layout"], p["must_finish"]) for p in got["proposals"]] == [
        ("m01", ["3g.20gb", "3g.20gb"], [12, 13])
    ]


def test_plan_live_cli_plans_on_the_live_policy_when_it_exists(tmp_path):
    d = doc()
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    policy = write_policy(tmp_path, d)
    live = with_layout(yaml.safe_load(policy.read_text()), "m01", 0, ("3g.20gb", "3g.20gb"))
    (tmp_path / "gpushare-live.yaml").write_text(yaml.safe_dump(live, sort_keys=False))
    res = CliRunner().invoke(main, ["live", "--policy", str(policy)], obj={"runner": cluster(), "clock": lambda: NOW})
    assert res.exit_code == 0, res.output
    assert "(the live policy)" in res.output
    # Slurm still has 7x1g.5gb, the live policy 2x3g.20gb: a change is under way, the planner leaves m01 alone
    assert "held: m01" in res.output and "Slurm has Gres gpu:a100_40g_1g.5gb:7, the policy" in res.output


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "Missing option '--demand'"),
        (["--live", "--demand", "openb:x.csv"], "No such option '--demand'"),  # the alias runs `live report`
        (["--json", "--demand", "openb:x.csv"], "No such option '--json'"),
    ],
)
def test_plan_options_that_do_not_go_together(tmp_path, args, says):
    policy = write_policy(tmp_path, doc())
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), *args])
    assert res.exit_code == 2 and says in res.output


def test_plan_live_cli_sees_a_relayout_lock(tmp_path):
    """A gpushare-relayout-<node> reservation (another planner's lock, read by the apply side's read_state):
    the node is under relayout, the report proposes nothing for it."""
    d = doc()
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    policy = write_policy(tmp_path, d)
    lock = {
        "name": "gpushare-relayout-m01",
        "node_list": "m01",
        "flags": ["MAINT", "IGNORE_JOBS"],
        "start_time": _t(int(NOW - 60)),
        "end_time": _t(int(NOW + 4200)),
        "users": "root",
    }
    res = CliRunner().invoke(
        main, ["live", "--policy", str(policy)], obj={"runner": cluster([lock]), "clock": lambda: NOW}
    )
    assert res.exit_code == 0, res.output
    assert "proposals:\n  none\n" in res.output and "held: m01: under relayout" in res.output


def test_plan_live_is_live_report_with_a_deprecation_note_on_stderr(tmp_path):
    d = doc()
    d["node_groups"][0].update(
        nodes="m01",
        gpu={"model": "A100-SXM4-40GB", "count": 1},
        sharing=[{"gpus": 0, "mode": "mig", "layout": "all-1g.5gb"}],
    )
    policy = write_policy(tmp_path, d)
    outputs = []
    for args in (["plan", "--live"], ["live", "report"], ["live"]):
        for extra in ([], ["--json"]):
            res = CliRunner().invoke(
                main, [*args, *extra, "--policy", str(policy)], obj={"runner": cluster(), "clock": lambda: NOW}
            )
            assert res.exit_code == 0, res.output
            outputs.append((res.stdout, res.stderr))
    (alias, alias_json), reports = outputs[:2], outputs[2:]
    assert (
        alias[1] == alias_json[1] == "gpushare plan --live is deprecated and goes in the next release: use "
        "gpushare live report\n"
    )
    assert [out for out, _err in reports] == [alias[0], alias_json[0]] * 2 and all(not e for _o, e in reports)
    assert "proposals:\n  9 jobs have waited 25 min" in alias[0] and json.loads(alias_json[0])["proposals"]


def test_live_without_a_command_needs_a_policy():
    res = CliRunner().invoke(main, ["live"])
    assert res.exit_code == 2 and "give --policy FILE (the report), or a command: report, apply" in res.output


# ---- per-job MIG GPUs: the live loop leaves them alone -------------------------------------------------------


def per_job_site():
    """POLICY with m01-m02's A100s per-job MIG (mode mig, no layout): an instance per job, no relayout."""
    d = doc()
    d["cluster"]["hooks"] = {
        "prolog": "/usr/local/sbin/gpushare-prolog",
        "epilog": "/usr/local/sbin/gpushare-epilog",
        "task_prolog": "/usr/local/bin/gpushare-task-prolog",
        "job_submit_lua": True,
    }
    d["node_groups"][0]["sharing"] = [
        {"gpus": "0-1", "mode": "mig", "per_job": True, "profiles": ["1g.5gb", "2g.10gb", "3g.20gb"]}
    ]
    return build_site(d, "test")


def test_per_job_gpus_are_neither_laid_out_nor_changed_in_mode():
    from slurm_gpushare.live.choose import relayout_slots

    s = per_job_site()
    assert relayout_slots(s.group("mig")) == ()
    nodes = {"m01": node(gres={"gpu:a100_40g": 2, "shard": 30})}
    busy = (RunningJob(12, "m01", {"shard": 7}, NOW + 200),)
    plan = plan_live(s, snap(pending(9) + pending(3, "shard", first=300), busy, nodes))
    assert plan.proposals == () and plan.held == ()
    # the same view on fixed MIG GPUs is relaid out (the catalogue's 3g.20gb+3g.20gb)
    assert plan_live(one_node(), snap(pending(9), RUNNING_1G)).proposals != ()
