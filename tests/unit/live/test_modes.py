"""The live planner's GPU mode changes (live/modes.py, policy/document.py with_modes, live/plan.py plan_live), and a
mode change carried out by the apply path (live/apply.py) with the real planner, on etc/small-lab.yaml's L40S
nodes: lab-excl01 (2 exclusive L40S) and lab-shard01 (1 L40S in 4 shards)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.errors import PolicyError
from slurm_gpushare.live import modes as livemodes
from slurm_gpushare.live.plan import plan_live
from slurm_gpushare.live.view import ClusterView, NodeView, PendingJob, RecentJob, RunningJob
from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.document import mode_text, with_modes
from slurm_gpushare.policy.share import Share

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_800_000_000.0
EXCL, SHARD = "lab-excl01", "lab-shard01"


def lab_doc(**live) -> dict:
    """small-lab.yaml's L40S nodes (and its MIG and MPS nodes), live planner on."""
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["live"] = {"enabled": True, "min_pending": 300, "min_dwell": 3600, **live}
    return raw


def lab(**live):
    return build_site(lab_doc(**live), "small-lab")


def shard_jobs(n, count=2, first=100, age=1500.0, priority=10):
    return tuple(PendingJob(first + i, "shard", count, age, priority, "Resources", "batch") for i in range(n))


def nodes(**extra):
    out = {
        EXCL: NodeView(EXCL, ("IDLE",), "", {"gpu:l40s": 2}),
        SHARD: NodeView(SHARD, ("MIXED",), "", {"gpu:l40s": 1, "shard:l40s": 4}),
        "lab-mig01": NodeView("lab-mig01", ("IDLE",), "", {"gpu:a100_40g_1g.5gb": 7}),
        "lab-mps01": NodeView("lab-mps01", ("IDLE",), "", {"gpu:a30": 1, "mps": 100}),
    }
    out.update(extra)
    return out


FULL_SHARD = tuple(RunningJob(10 + i, SHARD, {"shard:l40s": 2}, NOW + 300) for i in range(2))  # 4 of 4 shards


def snap(pending, running=FULL_SHARD, history=(), **kw):
    return ClusterView(NOW, tuple(pending), tuple(running), nodes(**kw), {}, frozenset(), tuple(history))


# ---- what a GPU may become -------------------------------------------------------------------------


def entries(*docs: dict) -> tuple[Share, ...]:
    """Policy sharing entries as the shares the live planner handles."""
    return tuple(Share.from_entry(d) for d in docs)


def test_a_gpu_may_take_the_modes_the_site_uses_on_its_model():
    s = lab()
    excl = s.group_for_node(EXCL).gpus[0]
    assert livemodes.options(s, excl) == entries({"mode": "exclusive"}, {"mode": "shard", "replicas": 4})
    shard = s.group_for_node(SHARD).gpus[0]
    assert livemodes.options(s, shard) == entries({"mode": "shard", "replicas": 4}, {"mode": "exclusive"})
    assert livemodes.options(s, s.group_for_node("lab-mig01").gpus[0]) == ()  # MIG mode is never changed
    # no L40S runs MPS on this site: no L40S may become MPS (the A30 may go exclusive)
    assert livemodes.kinds(s) == frozenset({"shard", "mps", "gpu:l40s", "gpu:a30"})


def test_starts_on_an_empty_node():
    types = {0: "l40s", 1: "l40s"}
    kind = lambda g: g.split(":", 1)[0] if g.split(":", 1)[0] in ("mps", "shard") else g  # noqa: E731
    whole = PendingJob(1, "gpu:l40s", 1, 0, 0, "Resources", "batch")
    two = PendingJob(2, "gpu:l40s", 2, 0, 0, "Resources", "batch")
    sh = [PendingJob(10 + i, "shard", 2, 0, 0, "Resources", "batch") for i in range(3)]
    mixed = dict(enumerate(entries({"mode": "exclusive"}, {"mode": "shard", "replicas": 4})))
    # the whole job takes the exclusive GPU first, the shard jobs fill the shard GPU (2 of 3 fit), two GPUs: none
    assert livemodes.starts(mixed, types, [whole, *sh, two], kind) == [whole, sh[0], sh[1]]
    # a whole-GPU job takes an idle shard GPU too, as in Slurm; once a shard job holds it, no longer
    shard = dict(enumerate(entries({"mode": "shard", "replicas": 4})))
    assert livemodes.starts(shard, {0: "l40s"}, [whole, sh[0]], kind) == [whole]
    assert livemodes.starts(shard, {0: "l40s"}, [sh[0], whole], kind) == [sh[0]]


# ---- the plan ------------------------------------------------------------------------------------------


def test_pending_shard_jobs_turn_idle_exclusive_gpus_into_shards():
    plan = plan_live(lab(), snap(shard_jobs(4)))
    (p,) = plan.proposals
    assert p.node == EXCL and p.change.layouts == ()
    assert p.change.new_modes == {0: {"mode": "shard", "replicas": 4}, 1: {"mode": "shard", "replicas": 4}}
    assert p.change.to_json()["modes"] == [
        [0, {"mode": "exclusive"}, {"mode": "shard", "replicas": 4}],
        [1, {"mode": "exclusive"}, {"mode": "shard", "replicas": 4}],
    ]
    assert (p.change.first(), p.benefit, p.must_finish) == (("exclusive", "shard (4 replicas)"), 4, ())
    assert p.line == (
        "4 jobs have waited 25 min for shard; lab-excl01 has 0 GPU jobs running: mode change GPU 0 "
        "exclusive -> shard (4 replicas), GPU 1 exclusive -> shard (4 replicas) lets 4 start; cost: no "
        "GPU job on the node + 2 min drain and re-registration"
    )
    assert any(
        line.startswith("shard: 4 pending") and "4 blocked (a GPU mode change can serve it)" in line
        for line in plan.demand
    )


def test_two_shard_jobs_need_one_gpu_only():
    (p,) = plan_live(lab(), snap(shard_jobs(2))).proposals
    assert p.change.new_modes == {0: {"mode": "shard", "replicas": 4}} and p.benefit == 2


def test_shard_jobs_that_fit_idle_shards_now_are_left_to_slurm():
    plan = plan_live(lab(), snap(shard_jobs(2), running=()))
    assert plan.proposals == ()
    assert any("2 fit idle GPUs now, 0 blocked" in line for line in plan.demand)


def test_live_modes_false_plans_no_mode_and_says_so():
    plan = plan_live(lab(modes=False), snap(shard_jobs(4)))
    assert plan.proposals == ()
    assert any(line.startswith("shard:") and "no GPU of the site can change to a mode" in line for line in plan.demand)


def test_a_mode_change_waits_for_the_nodes_gpu_jobs_and_counts_them():
    busy = FULL_SHARD + (RunningJob(20, EXCL, {"gpu:l40s": 1}, NOW + 400),)
    (p,) = plan_live(lab(), snap(shard_jobs(2), running=busy)).proposals
    # GPU 0 holds job 20 (the snapshot does not say which GPU): the change waits for it anyway, the node drains
    assert p.must_finish == (20,) and p.ready_in_s == 400 and p.cost_s == 400 + 120
    assert "lab-excl01 has 1 GPU job running" in p.line and "cost: job 20 must finish (ends in 7 min)" in p.line
    (h,) = plan_live(lab(max_wait=300), snap(shard_jobs(2), running=busy)).held
    assert h.line.startswith("held: lab-excl01 GPU 0 exclusive -> shard (4 replicas): job(s) 20 must finish first")


def test_the_recent_whole_gpu_mix_keeps_a_gpu_exclusive():
    # 24 whole-GPU jobs on lab-excl01 in the last 6 h: 4 expected within min_dwell on its 2 exclusive GPUs; one GPU
    # to shards strands 2 of them, two strand 4. 4 shard jobs blocked: one GPU (2 start, net 0) is not worth it, nor
    # both (4 start, net 0): held, with the history as the reason
    ran = tuple(RecentJob(str(500 + i), EXCL, {"gpu:l40s": 1}, NOW - 7200, NOW - 3600) for i in range(24))
    plan = plan_live(lab(), snap(shard_jobs(4), history=ran))
    assert plan.proposals == ()
    (h,) = plan.held
    assert (
        h.node == EXCL
        and h.change.modes
        and "the last 6 h ran 24 jobs of l40s (4.0 expected within min_dwell 60 min" in h.why
    )
    # 12 of them (2 expected): one GPU strands 1, both 2: both to shards start 4, net 2 (better than one, net 1)
    (p,) = plan_live(lab(), snap(shard_jobs(4), history=ran[:12])).proposals
    assert len(p.change.modes) == 2 and p.benefit == pytest.approx(2.0)
    assert "; history: the last 6 h ran 12 jobs of l40s (2.0 expected" in p.line


def test_never_mps_and_shard_on_one_node():
    # an L40S node with MPS beside the shard one: L40S GPUs may now be exclusive, shard (4) or mps (100)
    d = lab_doc()
    d["node_groups"].append(
        {
            "name": "lab-l40s-mps",
            "nodes": "lab-lmps01",
            "gpu": {"model": "L40S", "count": 1},
            "cpus": 8,
            "memory_mb": 16000,
            "sharing": [{"gpus": 0, "mode": "mps", "units": 100}],
        }
    )
    for tier in d["tiers"]:
        tier["node_groups"].append("lab-l40s-mps")
    d["billing"]["gpu_weights"]["A30-24GB"] = 100  # one GRES/mps weight per partition: the A30's MPS units too
    s = build_site(d, "lab+mps")
    mps = tuple(PendingJob(300 + i, "mps", 50, 1500.0, 20, "Resources", "batch") for i in range(2))
    full_mps = (
        RunningJob(30, "lab-lmps01", {"mps": 100}, NOW + 60),
        RunningJob(31, "lab-mps01", {"mps": 100}, NOW + 60),
    )
    extra = {"lab-lmps01": NodeView("lab-lmps01", ("MIXED",), "", {"gpu:l40s": 1, "mps": 100})}
    plan = plan_live(s, snap(shard_jobs(2) + mps, running=FULL_SHARD + full_mps, **extra))
    (p,) = plan.proposals
    assert p.node == EXCL
    modes = {e["mode"] for e in p.change.new_modes.values()}
    assert not {"mps", "shard"} <= modes, p.change  # the higher-priority mps jobs win the node
    assert modes == {"mps"}
    with_modes(d, EXCL, p.change.new_modes)  # the policy accepts what was proposed
    with pytest.raises(PolicyError) as err:
        with_modes(d, EXCL, {0: {"mode": "mps", "units": 100}, 1: {"mode": "shard", "replicas": 4}})
    assert "mps and shard on the same node are not supported by Slurm" in str(err.value.problems)


# ---- with_modes ----------------------------------------------------------------------------------------


def test_with_modes_splits_the_node_out_and_validates():
    d = lab_doc()
    d["node_groups"][0]["nodes"] = "lab-excl[01-02]"
    out = with_modes(d, EXCL, {1: {"mode": "shard", "replicas": 4}})
    groups = {g["name"]: g for g in out["node_groups"]}
    assert groups["lab-excl"]["nodes"] == "lab-excl02"
    assert groups["lab-excl-lab-excl01"]["sharing"] == [
        {"gpus": 0, "mode": "exclusive"},
        {"gpus": 1, "mode": "shard", "replicas": 4},
    ]
    assert "lab-excl-lab-excl01" in out["tiers"][0]["node_groups"]
    assert d["node_groups"][0]["nodes"] == "lab-excl[01-02]"  # the input is not changed
    site = build_site(out, "live")
    assert site.group_for_node(EXCL).gres == {("gpu", "l40s"): 2, ("shard", ""): 4}


@pytest.mark.parametrize(
    "node, modes, says",
    [
        ("lab-mig01", {0: {"mode": "exclusive"}}, "shared by MIG"),
        (EXCL, {0: {"mode": "mig", "layout": "all-1g.5gb"}}, "MIG mode is never changed"),
        (EXCL, {2: {"mode": "exclusive"}}, "has 2 GPU(s), 0-1"),
        ("nowhere", {0: {"mode": "exclusive"}}, "in no node group"),
        (EXCL, {}, "no GPU mode given"),
    ],
)
def test_with_modes_refuses(node, modes, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        with_modes(lab_doc(), node, modes)


def test_with_modes_refuses_what_the_policy_refuses():
    with pytest.raises(PolicyError, match="replicas"):
        with_modes(lab_doc(), EXCL, {0: {"mode": "shard", "replicas": 1}})


def test_mode_text():
    assert [
        mode_text(e) for e in ({"mode": "exclusive"}, {"mode": "mps", "units": 100}, {"mode": "shard", "replicas": 4})
    ] == ["exclusive", "mps (100 units)", "shard (4 replicas)"]


# ---- carried out: the apply path with the real planner --------------------------------------------------


def test_a_mode_change_is_locked_written_rendered_and_relaid_out(tmp_path):
    from slurm_gpushare.live.apply import LiveApply
    from slurm_gpushare.slurm.model import Node
    from slurm_gpushare.slurm.relayoutjob import lock_name
    from tests.unit.live.test_apply import Clock, FakeClient
    from tests.unit.live_fakes import FakeCtld, carol_job

    raw = lab_doc(min_pending=0, max_wait=600)
    raw["cluster"]["paths"] = {"slurm_conf_dir": str(tmp_path / "etc-slurm")}
    policy = tmp_path / "gpushare.yaml"
    policy.write_text(yaml.safe_dump(raw, sort_keys=False))
    ctld = FakeCtld()
    now = int(ctld.now)

    def job(i, state, gres, node="", count=1):
        return carol_job(i, state, gres, now, node, count)

    jobs = [job(1, "RUNNING", "gpu:l40s", EXCL), job(2, "RUNNING", "shard:l40s", SHARD, 4)]
    jobs += [job(i, "PENDING", "shard", count=2) for i in (3, 4)]

    def node(name, gres, state=("MIXED",)):
        return Node(name, state, "", gres, {}, (), (), 1, ("batch",), 8, 0, 16000, 0)

    view = nodes()
    slurm_nodes = [node(n, v.gres) for n, v in view.items()]
    live = LiveApply(policy, FakeClient(ctld, jobs, slurm_nodes), clock=Clock(ctld))
    first = live.run_once()
    (p,) = first.plan.proposals
    assert p.node == EXCL and p.change.new_modes == {0: {"mode": "shard", "replicas": 4}}, first.plan.report()
    assert lock_name(EXCL) in ctld.reservations and not ctld.jobs  # job 1 still runs: locked, waiting
    record = live.store.read().current[EXCL]
    assert record.phase == "waiting" and record.change == p.change

    live.client._jobs = jobs[1:]  # job 1 ended
    ctld.now += 120
    live.run_once()
    (relayout,) = ctld.jobs.values()
    assert relayout.node == EXCL and "gpushare node relayout" in relayout.script
    state = live.store.read()
    assert state.modes == {EXCL: {0: {"mode": "shard", "replicas": 4}}} and state.layouts == {}
    text = live.policy_file.read_text()
    assert "# GPU modes changed by the live planner: lab-excl01 GPU 0: shard (4 replicas)" in text
    written = yaml.safe_load(text)
    excl = next(g for g in written["node_groups"] if g["nodes"] == EXCL)
    assert excl["sharing"] == [{"gpus": 0, "mode": "shard", "replicas": 4}, {"gpus": 1, "mode": "exclusive"}]
    conf = (tmp_path / "etc-slurm" / "slurm-gpushare.conf").read_text()
    line = next(line for line in conf.splitlines() if line.startswith(f"NodeName={EXCL} "))
    assert "Gres=gpu:l40s:2,shard:4" in line, line
    gres = (tmp_path / "etc-slurm" / "gres.conf").read_text()
    assert f"NodeName={EXCL} Name=shard Count=4 File=/dev/nvidia0" in gres, gres

    ctld.finish(relayout.job_id)
    ctld.now += 30
    last = live.run_once()
    assert live.store.read().current[EXCL].phase == "done", last.lines
    assert not ctld.reservations
    # the live policy is kept: the next run plans on it (the node now has its shards: nothing more to change)
    again = copy.deepcopy(live.store.read().modes)
    live.run_once()
    assert live.store.read().modes == again


def test_running_shards_count_whatever_their_key():
    # squeue names a running job's shards 'shard' or 'shard:l40s', the node's Gres 'shard:l40s': both are shards
    for key in ("shard", "shard:l40s"):
        busy = tuple(RunningJob(10 + i, SHARD, {key: 1}, NOW + 300) for i in range(4))
        plan = plan_live(lab(), snap(shard_jobs(2, count=1), running=busy))
        assert any("0 fit idle GPUs now, 2 blocked" in line for line in plan.demand), (key, plan.demand)
        assert [p.node for p in plan.proposals] == [EXCL]
