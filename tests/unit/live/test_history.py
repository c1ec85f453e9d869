"""The live planner's history: slurm/history.py (the sacct query and its parser), the client's recent_jobs, and
how plan_live uses what a node ran lately (live/recent.py ``RecentMix``): a change that would strand the recent
mix is held, one that strands some of it is proposed with its net benefit."""

from __future__ import annotations

import pytest

from slurm_gpushare.live.plan import plan_live
from slurm_gpushare.live.view import RecentJob, recent_from_records, view_from_client
from slurm_gpushare.proc import Result
from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.history import FinishedJob, history_argv, parse_history
from slurm_gpushare.slurm.parsable import SlurmParseError
from tests.unit.live.test_plan import NOW, RUNNING_1G, T1, T3, cluster, one_node, pending, snap

HOUR = 3600.0


# ---- the query and its parser --------------------------------------------------------------------


def test_history_argv_asks_for_every_allocation_of_the_window_with_its_nodes():
    argv = history_argv(NOW - 6 * HOUR, NOW)
    assert argv[:5] == ["sacct", "-a", "-X", "-P", "--noheader"]
    assert argv[5] == "-S" and argv[7] == "-E" and argv[9:] == ["-o", "JobID,State,Start,End,NodeList,AllocTRES"]
    assert "--state" not in argv and "-s" not in argv  # -S/-E alone: every job that ran in the window


def test_parse_history_keeps_only_jobs_that_ran_and_ended():
    until = NOW
    lines = [
        f"101|COMPLETED|{NOW - 600:.0f}|{NOW - 60:.0f}|m01|billing=14,cpu=1,gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1",
        f"102|CANCELLED by 0|{NOW - 900:.0f}|{NOW - 800:.0f}|m[01-02]|cpu=2,gres/mps=50|",  # --parsable's '|'
        f"103|RUNNING|{NOW - 60:.0f}|Unknown|m01|cpu=1,gres/gpu=1",  # still running
        "104|PENDING|Unknown|Unknown|None assigned|",  # never started
        f"105|CANCELLED by 1000|None|{NOW - 30:.0f}|None assigned|",  # cancelled while pending
        f"101.batch|COMPLETED|{NOW - 600:.0f}|{NOW - 60:.0f}|m01|cpu=1",  # a step (sacct -X prints none anyway)
        f"106|COMPLETED|{NOW - 60:.0f}|{NOW + 30:.0f}|m01|gres/gpu=1",  # ended after the window
        "",
    ]
    got = list(parse_history(lines, until))
    assert got == [
        FinishedJob("101", "COMPLETED", NOW - 600, NOW - 60, ("m01",), {"gpu:a100_40g_1g.5gb": 1, "gpu": 1}),
        FinishedJob("102", "CANCELLED", NOW - 900, NOW - 800, ("m01", "m02"), {"mps": 50}),
    ]


def test_parse_history_names_the_line_it_cannot_read():
    with pytest.raises(SlurmParseError, match=r"sacct line 2: 3 fields, expected 6"):
        list(parse_history([f"1|COMPLETED|{NOW:.0f}|{NOW:.0f}|m01|", "1|2|3"], NOW))
    with pytest.raises(SlurmParseError, match=r"line 1: job 7: NodeList 'm\[01-'"):
        list(parse_history([f"7|COMPLETED|{NOW - 9:.0f}|{NOW - 1:.0f}|m[01-|"], NOW))


class Sacct:
    def __init__(self, out):
        self.out, self.calls = out, []

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        self.calls.append((tuple(argv), dict(env or {})))
        return Result(tuple(argv), 0, self.out, "")


def test_the_client_reads_the_history_with_epoch_times():
    runner = Sacct(f"9|COMPLETED|{NOW - 99:.0f}|{NOW - 9:.0f}|e01|gres/gpu:l40s=2,gres/gpu=2\n")
    got = CliClient(runner, env={"PATH": "/usr/bin"}).recent_jobs(NOW - HOUR, NOW)
    assert got == [FinishedJob("9", "COMPLETED", NOW - 99, NOW - 9, ("e01",), {"gpu:l40s": 2, "gpu": 2})]
    ((argv, env),) = runner.calls
    assert argv == tuple(history_argv(NOW - HOUR, NOW))
    assert env == {"PATH": "/usr/bin", "SLURM_TIME_FORMAT": "%s"}  # the client's environment, epoch times


def test_recent_from_records_one_per_node_gpu_jobs_only():
    recs = [
        FinishedJob("1", "COMPLETED", 1.0, 2.0, ("m01", "m02"), {"gpu:a100_40g_1g.5gb": 1, "gpu": 1}),
        FinishedJob("2", "COMPLETED", 1.0, 2.0, ("e01",), {}),  # no GRES: a CPU job
        FinishedJob("3", "FAILED", 1.0, 2.0, ("s01",), {"shard": 2, "gpu": 0}),
    ]
    assert recent_from_records(recs) == (
        RecentJob("1", "m01", {T1: 1}, 1.0, 2.0),
        RecentJob("1", "m02", {T1: 1}, 1.0, 2.0),
        RecentJob("3", "s01", {"shard": 2}, 1.0, 2.0),
    )


def test_snapshot_reads_the_policys_window_through_the_client():
    runner = cluster()
    runner.history = [f"7|COMPLETED|{NOW - 3000:.0f}|{NOW - 2000:.0f}|m01|gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1"]
    s = one_node(history_window=7200)
    snapshot = view_from_client(CliClient(runner), s, NOW)
    assert snapshot.history == (RecentJob("7", "m01", {T1: 1}, NOW - 3000, NOW - 2000),)
    (sacct,) = [c for c in runner.calls if c[0] == "sacct"]
    assert sacct == tuple(history_argv(NOW - 7200, NOW))
    runner = cluster()
    assert view_from_client(CliClient(runner), one_node(history_window=0), NOW).history == ()
    assert not [c for c in runner.calls if c[0] == "sacct"]  # window 0: no history read


# ---- the decision -----------------------------------------------------------------------------------


def ran(n, gres=T1, node="m01", hours_ago=1.0):
    """n jobs of ``gres`` that ran on ``node`` and ended ``hours_ago``."""
    end = NOW - hours_ago * HOUR
    return tuple(RecentJob(str(500 + i), node, {gres: 1}, end - 600, end) for i in range(n))


def with_history(history, pend=None, running=RUNNING_1G):
    base = snap(pending(9) if pend is None else pend, running)
    return type(base)(**{**base.__dict__, "history": tuple(history)})


def test_a_change_that_would_strand_the_recent_mix_is_held():
    # 2 3g jobs blocked; m01 (7x1g.5gb) ran 40 1g jobs in the last 6 h: 40 * 3600 / 21600 = 6.7 expected within
    # min_dwell, and 3g+3g keeps none of the 7 1g.5gb: strands 6.7 against the 2 it starts
    plan = plan_live(one_node(), with_history(ran(40)))
    assert plan.proposals == ()
    (h,) = plan.held
    assert (h.node, h.change.new_layouts) == ("m01", {0: ("3g.20gb", "3g.20gb")})
    assert h.why.startswith(
        "the last 6 h ran 40 jobs of a100_40g_1g.5gb (6.7 expected within min_dwell 60 min; "
        "the change keeps 0 of 7): it would strand 6.7 of them against the 2 pending job(s)"
    )
    assert "net -4.7; min_benefit_jobs is 1" in h.why


def test_without_the_history_the_same_queue_relayouts():
    assert plan_live(one_node(), with_history(())).proposals[0].change.new_layouts == {0: ("3g.20gb", "3g.20gb")}
    # a window of 0 reads nothing, a min_dwell of 0 holds nothing: the history has no weight either way
    assert plan_live(one_node(history_window=0), with_history(ran(40))).proposals
    assert plan_live(one_node(min_dwell=0), with_history(ran(40))).proposals


def test_history_of_another_node_or_of_a_type_the_node_has_not_does_not_count():
    assert plan_live(one_node(), with_history(ran(40, node="m02"))).proposals
    assert plan_live(one_node(), with_history(ran(40, gres="gpu:l40s"))).proposals
    # the 3g type the change adds is not taken from anyone: 3g history only supports it
    assert plan_live(one_node(), with_history(ran(40, gres=T3))).proposals


def test_some_recent_demand_is_subtracted_from_the_benefit_and_said():
    # 6 1g jobs in 6 h: 1.0 expected within the dwell; 3g+3g strands all of it (benefit 2 - 1 = 1), a layout that
    # keeps 4 1g.5gb starts 1 3g and strands 3/7: 0.57: 3g+3g is still the better one
    (p,) = plan_live(one_node(), with_history(ran(6))).proposals
    assert p.change.new_layouts == {0: ("3g.20gb", "3g.20gb")} and p.benefit == pytest.approx(1.0)
    assert p.line.endswith(
        "; history: the last 6 h ran 6 jobs of a100_40g_1g.5gb (1.0 expected within min_dwell "
        "60 min; the change keeps 0 of 7): 1.0 stranded, net benefit 1.0"
    )
    # a larger min_benefit_jobs holds it, and says the history is why
    (h,) = plan_live(one_node(min_benefit_jobs=2), with_history(ran(6))).held
    assert "it would strand 1.0 of them against the 2 pending job(s) it lets start (net 1.0" in h.why


def test_history_picks_a_layout_that_keeps_some_of_the_recent_type():
    # 1 3g job blocked and 12 1g jobs in 6 h (2.0 expected): 3g+3g starts 1 and strands 2.0 (net -1); a layout
    # with 3g.20gb and four 1g.5gb starts the 3g job and strands 2.0 * 3/7 = 0.86 (net 0.14): the better one, held
    # by min_benefit_jobs 1 with the history as its reason
    (h,) = plan_live(one_node(), with_history(ran(12), pend=pending(1), running=())).held
    (new,) = h.change.new_layouts.values()
    assert "3g.20gb" in new and new.count("1g.5gb") == 4
    assert (
        "the change keeps 4 of 7): it would strand 0.9 of them against the 1 pending job(s) it lets start "
        "(net 0.1; min_benefit_jobs is 1)" in h.why
    )


def test_the_report_shows_the_history_by_type_and_node():
    plan = plan_live(one_node(), with_history(ran(6) + ran(2, node="m02") + ran(3, gres=T3)))
    assert plan.history == ("a100_40g_1g.5gb: 8 job(s) (m01 6, m02 2)", "a100_40g_3g.20gb: 3 job(s) (m01 3)")
    report = plan.report()
    assert (
        report[report.index("history (GPU jobs ended within live.history_window, by type):") + 1]
        == "  a100_40g_1g.5gb: 8 job(s) (m01 6, m02 2)"
    )
    assert plan.to_dict()["history"] == list(plan.history)
    assert not any(line.startswith("history") for line in plan_live(one_node(), with_history(())).report())
