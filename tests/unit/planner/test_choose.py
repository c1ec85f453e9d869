"""The search driving (planner/choose.py): the ``Choice`` record a plan's search returns."""

from __future__ import annotations

import dataclasses
import time

import pytest

from slurm_gpushare.planner.choose import Choice, choose
from slurm_gpushare.planner.demand import Demand, RequestClass
from slurm_gpushare.planner.knobs import Knobs
from slurm_gpushare.policy import build_site


def _base() -> dict:
    return {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {"name": "a", "nodes": "a[1-4]", "gpu": {"model": "L40S", "count": 4}, "cpus": 32, "memory_mb": 512000}
        ],
        "tiers": [{"name": "main", "node_groups": ["a"], "default": True}],
    }


def _demand() -> Demand:
    counts = {RequestClass(1, 250, 2, 4096, ""): 12, RequestClass(1, 1000, 4, 4096, ""): 6}
    return Demand("test", counts)


def _choose(evaluate, tries) -> Choice:
    base = _base()
    site = build_site(base, "base policy")
    return choose(
        base,
        site,
        _demand(),
        tries,
        evaluate,
        budget_s=None,
        began=time.perf_counter(),
        isolate=(),
        mig_all=False,
        searching=False,
    )


def test_without_evaluate_the_first_candidate_is_the_choice():
    tries = [Knobs(frac_factor=0.9), Knobs()]
    got = _choose(None, tries)
    assert got.knobs == tries[0] and got.given is None and got.score == 0.0
    assert got.tried == ((tries[0], 0.0),) and got.note == ()
    assert got.raw["tiers"] and got.why and isinstance(got.why, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.score = 1.0  # a record: frozen


def test_with_a_plain_function_the_best_scored_candidate_is_chosen_and_every_score_kept():
    def score(raw: dict) -> float:  # more node groups score higher; the policy as given has one
        return float(len(raw["node_groups"]))

    tries = [Knobs(), Knobs(frac_factor=0.5), Knobs(frac_weights="node")]
    got = _choose(score, tries)
    assert got.given == 1.0
    assert [s for _k, s in got.tried] == sorted((s for _k, s in got.tried), reverse=True)
    assert got.score == got.tried[0][1] == float(len(got.raw["node_groups"])) > got.given
    assert got.knobs == Knobs(frac_weights="node")  # one node group per MPS node: the most groups
    assert got.note[0].startswith(f"{len(got.tried)} candidate policies scored on the first sampled order (0)")


def test_when_the_policy_as_given_wins_the_choice_is_that_policy_with_the_best_candidates_score():
    base = _base()

    def score(raw: dict) -> float:  # the policy as given scores highest
        return 10.0 if raw == base else float(len(raw["node_groups"]))

    got = _choose(score, [Knobs(), Knobs(frac_weights="node")])
    assert got.given == 10.0 and got.raw == base and got.knobs == Knobs() and got.why == ()
    assert got.score == max(s for _k, s in got.tried) < got.given
