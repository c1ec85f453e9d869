"""The carrier-weight tuner (planner.migtune) and the per-job pool under churn it simulates on (sim.perjob.churn)."""

from __future__ import annotations

import pytest

from slurm_gpushare.hardware import get_model
from slurm_gpushare.hardware.migplace import FIRST, LARGEST_FIRST
from slurm_gpushare.hardware.migweights import Weights, exact_weights
from slurm_gpushare.planner.migtune import churn_evaluator, demand_mix, drawn_jobs, neighbours, tune
from slurm_gpushare.sim.perjob import Carrier, ChurnJob, churn

MODEL = get_model("A100-SXM4-40GB")
PROFILES = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")  # exact 2, 4, 7, 8, 14 of 15


def exact() -> Weights:
    found = exact_weights(MODEL, PROFILES)
    assert found is not None and found.weights == (2, 4, 7, 8, 14)
    return found


def test_a_slice_with_no_start_is_requeued_and_counted_once_per_job():
    # first rule: a lone 1g.5gb takes slice 0, the only start of a 4g.20gb; Slurm's count (2 + 8 <= 15) admits it
    car = Carrier(MODEL.name, tuple(exact().as_dict().items()), 15, FIRST)
    jobs = [ChurnJob(0.0, 100.0, "1g.5gb"), ChurnJob(1.0, 10.0, "4g.20gb")]
    got = churn(car, jobs, nodes=1, gpus=1, delay=120.0)
    assert (got.jobs, got.admitted, got.requeued) == (2, 2, 1)
    assert got.requeue_share == 0.5
    raised = Carrier(MODEL.name, (("1g.5gb", 8), *tuple(exact().as_dict().items())[1:]), 15, FIRST)
    assert churn(raised, jobs, nodes=1, gpus=1).requeued == 0  # 8 + 8 > 15: the 4g.20gb waits instead


def test_an_unknown_pick_is_refused():
    car = Carrier(MODEL.name, tuple(exact().as_dict().items()), 15)
    with pytest.raises(ValueError, match="LL_SHARED_GRES"):
        churn(car, [], 1, 1, pick="random")


def test_the_tuner_raises_small_weights_where_they_strand():
    mix = {"1g.5gb": 3, "4g.20gb": 1}
    workloads = [drawn_jobs(MODEL, mix, 4, jobs=400, seed=s) for s in (1, 2)]
    got = tune(MODEL, exact(), churn_evaluator(MODEL, workloads, 1, 4, FIRST), raise_only=tuple(mix))
    assert got.changed and got.chosen.capacity == 15
    assert all(c >= e for c, e in zip(got.chosen.weights, got.exact.weights, strict=True))
    assert got.chosen.weights[2:3] + got.chosen.weights[4:] == (7, 14)  # not asked for: never raised
    assert got.trial(got.chosen).requeue_share < got.trial(got.exact).requeue_share
    assert len(set(got.chosen.weights)) == len(got.chosen.weights)
    again = tune(MODEL, exact(), churn_evaluator(MODEL, workloads, 1, 4, FIRST), raise_only=tuple(mix))
    assert again.chosen == got.chosen  # deterministic


def test_the_tuner_keeps_the_exact_weights_where_nothing_strands():
    workload = drawn_jobs(MODEL, {"7g.40gb": 1}, 4, jobs=300)
    got = tune(MODEL, exact(), churn_evaluator(MODEL, [workload], 1, 4, LARGEST_FIRST))
    assert not got.changed and got.met and len(got.trials) == 1
    assert got.trial(got.exact).requeue_share == 0


def test_the_tuner_takes_the_highest_allocation_under_the_target_else_the_fewest_requeues():
    def evaluate(w: Weights) -> tuple[float, float]:  # raising 1g.5gb cuts requeues and allocation alike
        extra = w.weights[0] - 2
        return max(0.0, 0.04 - 0.01 * extra), 1.0 - 0.001 * extra - 0.0001 * sum(w.weights[1:])

    got = tune(MODEL, exact(), evaluate, steps=(1,), target=0.005, raise_only=("1g.5gb",))
    assert got.chosen.weights[0] == 6 and got.met  # 0.0 requeued at 6; 5 requeues 1 %
    strict = tune(MODEL, exact(), evaluate, steps=(1,), target=0.0, raise_only=("1g.5gb",), rounds=2)
    assert not strict.met and strict.chosen.weights[0] == 5  # two rounds (3, then 5: 4 is taken): the fewest found


def test_neighbours_skip_taken_weights_and_stay_valid():
    near = neighbours(MODEL, exact(), (2, 4, 7, 8, 14), (1, 2))
    assert (3, 4, 7, 8, 14) in near and (5, 4, 7, 8, 14) in near  # 2 + 2 = 4 is 2g.10gb's: the next free one
    assert all(len(set(v)) == 5 and max(v) <= 15 for v in near)


def test_a_demand_s_shares_become_the_profiles_that_cover_them():
    assert demand_mix(MODEL, {100: 3, 230: 2, 470: 1, 900: 4}, PROFILES) == {
        "1g.5gb": 3,
        "2g.10gb": 2,
        "3g.20gb": 1,
        "7g.40gb": 4,
    }
