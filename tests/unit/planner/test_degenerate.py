"""The planner on degenerate and generated demands: a plan or a clear message, never worse than the policy as given.

A seeded generator (hypothesis is not a dependency) draws many small demands over
tiny clusters: only CPU jobs, only whole GPUs, only fractions, only multi-GPU
jobs, one class, or any mix. Every one must give a valid plan (or, for no GPU
job, the policy as given with the reason) whose own score is at least the
policy as given's. A SIGALRM watchdog turns a hang (the arrival loop without a
GPU pod) into a failure instead of a stuck run; it bounds no measured figure.
"""

from __future__ import annotations

import random
import signal
from contextlib import contextmanager

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.planner.demand import Demand, RequestClass
from slurm_gpushare.planner.evaluate import evaluator
from slurm_gpushare.planner.knobs import Knobs
from slurm_gpushare.planner.plan import plan
from slurm_gpushare.sim.arrivals import arrival_sequence
from slurm_gpushare.sim.cluster import Pod

HANG_S = 60  # far above any case here (each takes well under a second); only a hang reaches it


class Hung(Exception):
    pass


@contextmanager
def watchdog(what: str, seconds: int = HANG_S):
    def fire(*_):
        raise Hung(f"{what}: still running after {seconds} s (a loop that does not end)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def policy(groups) -> dict:
    """groups: (name, nodes, model, gpus, cpus)."""
    return {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {"name": name, "nodes": nodes, "gpu": {"model": model, "count": gpus}, "cpus": cpus, "memory_mb": 256000}
            for name, nodes, model, gpus, cpus in groups
        ],
        "tiers": [{"name": "main", "node_groups": [g[0] for g in groups], "default": True}],
    }


def small_site() -> dict:
    return policy([("big", "b[1-2]", "L40S", 4, 64), ("rich", "r1", "L40S", 2, 96)])


def demand(*rows) -> Demand:
    """rows: (num_gpu, gpu_milli, cpus, jobs)."""
    return Demand("test", {RequestClass(g, m if g else 0, c, 4096): n for g, m, c, n in rows})


# ---- the arrival sequence ----


def test_arrivals_of_cpu_only_pods_end_with_the_trace_itself():
    pods = tuple(Pod(f"p{i}", 4000, 1024, 0, 0) for i in range(5))
    with watchdog("arrival_sequence on CPU-only pods"):
        got = arrival_sequence(pods, gpu_count=8, seed=1)
    assert sorted(got.order.tolist()) == [0, 1, 2, 3, 4]  # each pod once, nothing resampled


def test_arrivals_with_one_gpu_pod_among_cpu_pods_still_reach_the_target():
    pods = (*(Pod(f"c{i}", 1000, 1, 0, 0) for i in range(20)), Pod("g", 1000, 1, 1, 500))
    with watchdog("arrival_sequence with one GPU pod"):
        got = arrival_sequence(pods, gpu_count=2, seed=3)
    demand_ = np.array([p.gpu_demand_milli for p in pods])
    assert demand_[got.order].sum() == 2500  # 5 x 500 milli: the next would pass 130 % of 2,000


# ---- degenerate demands, by hand ----


def test_cpu_only_demand_keeps_the_policy_as_given_and_says_why():
    base = small_site()
    with watchdog("plan on CPU-only demand"):
        result = plan(base, demand((0, 0, 8, 10)), evaluate=evaluator(demand((0, 0, 8, 10))))
    assert result.kept_given and result.policy == base
    assert "the demand asks for no GPU (10 CPU-only jobs)" in "\n".join(result.report)


def test_the_policy_as_given_is_kept_when_no_candidate_beats_it():
    base = small_site()

    def score(raw):  # the admin's policy scores above every candidate the planner builds
        return 80.0 if raw == base else 79.0

    result = plan(base, demand((1, 500, 4, 12), (1, 1000, 8, 4)), evaluate=score)
    assert result.kept_given and result.policy == base and result.given_score == 80.0
    assert result.score == 80.0
    text = "\n".join(result.report)
    assert "the policy as given: 80.00" in text
    assert "kept the policy as given: it scores 80.00, no candidate scored above it (best 79.00)" in text


def test_a_tie_keeps_the_policy_as_given_and_a_better_candidate_replaces_it():
    base = small_site()
    d = demand((1, 500, 4, 12))
    assert plan(base, d, evaluate=lambda raw: 50.0).kept_given
    better = plan(base, d, evaluate=lambda raw: 40.0 if raw == base else 50.0)
    assert not better.kept_given and better.policy != base
    assert "planned: the best candidate scores 50.00, above the policy as given (40.00)" in "\n".join(better.report)


def test_with_isolation_the_policy_as_given_is_scored_but_not_kept():
    base = policy([("a", "a[1-2]", "A100-SXM4-40GB", 4, 64)])
    d = Demand("t", {RequestClass(1, 200, 4, 4096, "LS"): 8, RequestClass(1, 1000, 4, 4096, "BE"): 2})
    result = plan(base, d, isolate_qos=["LS"], evaluate=lambda raw: 90.0 if raw == base else 10.0)
    assert not result.kept_given and result.given_score == 90.0
    assert "is not eligible" in "\n".join(result.report)


def test_empty_openb_file_and_cpu_only_file_through_the_cli(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(small_site(), sort_keys=False))
    empty, cpu = tmp_path / "empty.csv", tmp_path / "cpu.csv"
    empty.write_text("")
    cpu.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(f"c{i},4000,1024,0,0\n" for i in range(6)))
    res = CliRunner().invoke(main, ["plan", "--policy", str(site), "--demand", f"openb:{empty}"])
    assert res.exit_code == 1 and "empty.csv: empty file" in res.output, res.output
    with watchdog("gpushare plan on a CPU-only pod list"):
        res = CliRunner().invoke(main, ["plan", "--policy", str(site), "--demand", f"openb:{cpu}"])
    assert res.exit_code == 0, res.output
    assert "the demand asks for no GPU (6 CPU-only jobs)" in res.output
    assert "(the planned policy is the policy as read)" in res.output


# ---- generated demands ----

KINDS = ("cpu", "fraction", "whole", "multi")
SHARES = (100, 200, 250, 300, 470, 500, 750)


def random_site(rng: random.Random) -> dict:
    groups = []
    for k in range(rng.randint(1, 3)):
        model = rng.choice(["L40S", "L40S", "A100-SXM4-40GB"])
        gpus = rng.choice([1, 2, 4, 8])
        groups.append((f"g{k}", f"n{k}x[1-{rng.randint(1, 3)}]", model, gpus, gpus * rng.choice([4, 8, 16, 32])))
    return policy(groups)


def random_demand(rng: random.Random) -> Demand:
    """Only one kind of job (half the time), one class (a fifth), or a mix; counts 1-30."""
    kinds = [rng.choice(KINDS)] if rng.random() < 0.5 else rng.sample(KINDS, rng.randint(2, 4))
    counts: dict[RequestClass, int] = {}
    for _ in range(1 if rng.random() < 0.2 else rng.randint(1, 5)):
        kind = rng.choice(kinds)
        gpus, milli = {
            "cpu": (0, 0),
            "fraction": (1, rng.choice(SHARES)),
            "whole": (1, 1000),
            "multi": (rng.choice([2, 4, 8]), 1000),
        }[kind]
        cls = RequestClass(gpus, milli, rng.choice([1, 2, 4, 8, 16]), rng.choice([1024, 8192]))
        counts[cls] = counts.get(cls, 0) + rng.randint(1, 30)
    return Demand("generated", counts)


@pytest.mark.parametrize("seed", range(8))
def test_generated_demands_give_a_valid_plan_never_scored_below_the_policy_as_given(seed):
    rng = random.Random(seed)
    for case in range(25):
        base, d = random_site(rng), random_demand(rng)
        where = f"seed {seed} case {case}: {dict(d.counts)} on {[g['name'] for g in base['node_groups']]}"
        with watchdog(where):
            result = plan(base, d, evaluate=evaluator(d), candidates=[Knobs(), Knobs(frac_factor=0.95)])
        assert result.site is not None, where
        if not d.gpu_milli:
            assert result.kept_given and result.policy == base, where
            continue
        assert result.given_score is not None and result.score >= result.given_score, where
        if result.kept_given:
            assert result.policy == base, where
        assert ("kept the policy as given" in "\n".join(result.report)) == result.kept_given, where
