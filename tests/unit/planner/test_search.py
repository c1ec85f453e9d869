"""The planner's search and race (planner/search.py) on scripted scores, and the space planner/choose.py derives."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_gpushare.planner.choose import search_space
from slurm_gpushare.planner.knobs import Knobs
from slurm_gpushare.planner.search import Dim, Search
from slurm_gpushare.policy import build_site

from .test_plan import demand, s1_base


@dataclass(frozen=True)
class K:
    x: float = 1.0
    mode: str = "a"

    def changed(self) -> str:
        return f"x={self.x}, mode={self.mode}"


LADDER = tuple(round(0.5 + 0.05 * i, 2) for i in range(41))  # 0.5 .. 2.5
SPACE = [Dim("x", LADDER, "ladder"), Dim("mode", ("a", "b", "c"))]


def _build(k: K):
    return {"x": k.x, "mode": k.mode}, [f"built {k}"]


class Scores:
    """Score = a smooth function of the policy with its peak at x=1.85, mode 'c' (outside every start), plus a
    per-order offset common to every policy (so paired differences are exact) and ``noise`` per policy and
    order; counts every score computed. Each score takes ``delay`` seconds of the scores' own clock (``now``),
    so the budget tests do not depend on the machine's speed."""

    def __init__(self, noise=None, delay=0.0):
        self.noise, self.delay, self.calls, self.clock = noise or {}, delay, [], 0.0

    def now(self) -> float:
        return self.clock

    def __call__(self, raws, order):
        self.clock += self.delay * len(raws)
        self.calls.append((order, [(r["x"], r["mode"]) for r in raws]))
        return [
            90
            - 10 * (r["x"] - 1.85) ** 2
            + {"a": 0, "b": 0.5, "c": 1.0}[r["mode"]]
            + order * 0.01
            + self.noise.get((r["x"], r["mode"], order), 0.0)
            for r in raws
        ]


def test_the_search_finds_an_optimum_outside_its_starting_points():
    scores = Scores()
    out = Search(_build, scores, (7, 8, 9), SPACE).run([K(), K(x=1.1)], {"x": 0.5, "mode": "a"}, True)
    assert (out.best.knobs.x, out.best.knobs.mode) == (1.85, "c")
    # never the same policy twice on one order
    seen = [(o, p) for o, batch in scores.calls for p in batch]
    assert len(seen) == len(set(seen))
    assert out.scored == len(seen) and not out.out_of_time


def test_the_search_without_its_space_only_chooses_among_the_starts():
    out = Search(_build, Scores(), (7,), SPACE, search=False).run([K(), K(x=1.1)], None, False)
    assert out.best.knobs == K(x=1.1)


def test_a_lucky_first_order_loses_the_race():
    """x=1.5 mode c is 1.1 below the peak (x=1.85) but gets +1.5 of luck on order 7, so the search on order 7
    stays there; the race on more orders chooses the best of the candidates it scored near the peak (x=1.75), and
    the report gives the margin and says it is outside the noise."""
    luck = {(1.5, "c", 7): 1.5}
    out = Search(_build, Scores(luck), (7, 8, 9, 10, 11), SPACE).run([K(x=1.5, mode="c")], None, False)
    assert out.best.knobs == K(x=1.75, mode="c")
    assert out.orders[0] == 7 and len(out.orders) >= 2
    assert "outside the noise" in out.lines[0] and out.lines[0].startswith("race over sampled orders 7, 8")


def test_the_budget_stops_the_search_with_the_best_so_far():
    scores = Scores(delay=0.02)
    out = Search(_build, scores, (7, 8), SPACE, budget_s=0.15, now=scores.now).run(
        [K(), K(x=1.1)], {"x": 0.5, "mode": "a"}, True
    )
    assert out.out_of_time and scores.clock <= 0.15 + 0.02  # at most one score past the budget
    assert out.best.scores  # the best scored so far
    assert out.scored == round(scores.clock / 0.02)


def test_the_given_policy_and_the_first_start_are_scored_even_without_time():
    scores = Scores(delay=1.0)
    out = Search(_build, scores, (7, 8), SPACE, budget_s=0.0, now=scores.now).run(
        [K(), K(x=1.1)], {"x": 0.5, "mode": "a"}, True
    )
    assert out.given is not None and 7 in out.given.scores
    assert out.best.knobs in (None, K())


def test_a_ladder_moves_by_its_step_and_tries_its_quartiles_from_outside():
    d = Dim("x", (1, 2, 3, 4, 5, 6, 7, 8), "ladder", (None,))
    assert d.neighbours(4, 1) == [None, 3, 5]
    assert d.neighbours(4, 3) == [None, 1, 7]
    assert d.neighbours(None, 1) == [3, 5, 7]
    assert d.neighbours(4.5, 1) == [None, 4, 5]  # a value between rungs: the rungs around it
    assert Dim("m", ("a", "b", "c")).neighbours("b", 1) == ["a", "c"]


def _mixed_demand():
    # shares (1 x 500 m, 4 CPUs), whole GPUs of 2 to 16 CPUs, CPU-only jobs
    return demand((1, 500, 4, 40), (1, 1000, 2, 10), (1, 1000, 8, 10), (1, 1000, 16, 4), (0, 0, 8, 6))


def test_the_space_is_derived_from_the_demand():
    base = s1_base()
    site = build_site(base, "t")
    dims = {d.name: d for d in search_space(site, _mixed_demand(), Knobs(), (), False)}
    frac = dims["frac_factor"].values
    # from the shares packed perfectly to every GPU whole-GPU jobs leave: both sides of today's fixed 0.8 .. 1.1
    assert frac[0] < 1.0 < 1.1 < frac[-1] and frac == tuple(sorted(frac))
    assert dims["heavy_cpus"].values == (8, 16) and dims["heavy_cpus"].extra == (None,)  # the demand's own sizes
    assert dims["frac_heavy"].values == (4,)
    assert {"cpu_jobs", "cpu_order", "weights", "lean", "overflow", "frac_weights", "frac_nodes"} <= set(dims)
    assert "mig_factor" not in dims  # no MIG-capable GPU here
    # no shares: no MPS pool to size; no CPU-only jobs: nothing to order
    whole = {d.name for d in search_space(site, demand((1, 1000, 2, 10)), Knobs(), (), False)}
    assert not whole & {"frac_factor", "frac_heavy", "frac_weights", "frac_nodes", "cpu_jobs", "cpu_order"}


@pytest.mark.parametrize("budget", [0.0, None])
def test_plan_searches_by_default_and_not_with_explicit_candidates(budget):
    from slurm_gpushare.planner.evaluate import evaluator
    from slurm_gpushare.planner.plan import plan

    d = _mixed_demand()
    searched = plan(s1_base(), d, evaluate=evaluator(d, check_seeds=()), budget_s=budget)
    listed = plan(s1_base(), d, evaluate=evaluator(d, check_seeds=()), candidates=[Knobs()], budget_s=budget)
    assert len(listed.tried) == 1
    if budget is None:
        assert len(searched.tried) > len(listed.tried)
        assert searched.score >= listed.score  # the search starts where the list does
    assert any("candidate policies scored on the first sampled order (7)" in line for line in searched.report)


def test_knobs_that_build_no_valid_policy_are_passed_over():
    from slurm_gpushare.errors import PolicyError

    def build(k: K):
        if k.mode == "b":
            raise PolicyError("candidate", [])
        return _build(k)

    out = Search(build, Scores(), (7,), SPACE).run([K(mode="b"), K()], None, False)
    assert out.best.knobs.mode == "c" and out.unbuilt >= 1
    with pytest.raises(ValueError, match="no starting candidate"):
        Search(build, Scores(), (7,), SPACE).run([K(mode="b")], None, False)


def test_the_starts_come_before_the_search_and_a_cut_in_a_batch_ends_only_its_step():
    """The starts are scored before any knob move, up to the search's share of the budget; a start batch cut by
    the budget leaves no move; with time left after the starts the search moves (another mode than the starts')."""
    scores = Scores(delay=0.01)
    starts = [K(x=v) for v in LADDER[:30]]  # 30 starts, more than the search's share holds
    out = Search(_build, scores, (7,), SPACE, budget_s=0.3, now=scores.now).run(starts, None, False)
    assert out.out_of_time
    assert {m for _o, batch in scores.calls for _x, m in batch} == {"a"}  # starts only
    scores = Scores(delay=0.01)
    out = Search(_build, scores, (7,), SPACE, budget_s=1.0, now=scores.now).run(starts[:3], None, False)
    batches = [[m for _x, m in batch] for _o, batch in scores.calls]
    assert set(batches[0] + batches[1]) == {"a"} and any("c" in b for b in batches[2:])
