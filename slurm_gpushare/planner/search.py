"""The planner's search over the knobs of a static policy, and the race that chooses among the best. Pure.

``planner.choose`` gives this module three things: how to build a policy from a
set of knobs (``build``), how to score policies on one sampled arrival order
(``score(policies, order)``: the Slurm placement model, planner/evaluate.py),
and the space (``Dim``: each knob's values, derived from the demand by
``choose.search_space``). Everything here is generic over the knobs' dataclass.

Three steps, all scored on the same sampled arrival orders (common random
numbers: two candidates are compared on the same jobs in the same order, so
their difference is far less noisy than their scores):

1. **Starts.** The starting points (the admin's policy and the planner's own
   default candidates) on the first order.
2. **Coordinate search.** From the best start, each knob in turn: its
   neighbours (a ladder knob: the values ``step`` places below and above the
   current one; a choice knob: every other value) are scored on the first
   order, and the best of them is kept when it scores above the incumbent.
   A pass that keeps nothing halves the ladders' steps; the search ends when
   every step is 1 and a pass keeps nothing, or when its share of the budget
   has gone. Candidates that build a policy already scored are not scored
   again.
3. **Race.** The first order's winner is lucky by construction (the winner's
   curse: of many candidates scored once, the best is the one whose noise was
   most favourable). The best few of the first order (and the admin's policy
   when it may be kept) are scored on more orders, one order per round, all
   of them on the same ones; after each round a candidate whose mean paired
   difference to the leader is more than ``Z`` standard errors below it is
   dropped, and a candidate not yet raced that could still win (its first-order
   gap to the leader within ``Z`` of the measured noise of one order) joins.
   The race ends when one candidate is left, when the orders are used up, or
   when the budget has gone; the leader by mean over the common orders wins.
   The report says how sure the choice is: the margin over the runner-up, its
   standard error and the number of orders, and whether that margin is outside
   the noise.

Anytime: the budget is checked before every batch of scores (a batch is cut to
what the time left allows at the measured seconds per score); when it runs out
the best so far is kept, and the report says so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import GpushareError

BUDGET_S = 9.0  # `gpushare plan --budget`'s default: a plan within 10 s on the 1,213-node trace cluster
Z = 2.0  # standard errors: a candidate this far below the leader on the common orders is out of the race
RACE_SIZE = 4  # candidates raced from the start (the best of the first order), before any joins
# of the budget, what the starts and then the coordinate search may use; the race has the rest. The starts come
# first and may use all of it: each is a configuration that is best on some kind of workload, and on a slow
# machine a start left unscored (the paper's gpuspec20: the CPU-heavy bound by node shape, +1.3 points) cost more
# than the knob moves it would have left time for
SEARCH_SHARE = 0.7
START_SHARE = SEARCH_SHARE
JOIN = 2  # candidates that may join the race in one round (the closest first); more may join in later rounds


@dataclass(frozen=True)
class Dim:
    """One knob's values. ``ladder``: ordered values, moved along by a step that halves (``extra``: values
    outside the order, such as None for "derived from the demand", tried as alternatives); ``choice``: every
    other value is a neighbour."""

    name: str
    values: tuple
    kind: str = "choice"  # 'ladder' or 'choice'
    extra: tuple = ()

    def neighbours(self, value: Any, step: int) -> list:
        if self.kind == "choice" or not self.values:
            return [v for v in (*self.values, *self.extra) if v != value]
        out = [v for v in self.extra if v != value]
        if value in self.extra or value is None:
            n = len(self.values)  # from outside the ladder: its quartiles
            return out + _unique(self.values[min(n - 1, (n * q) // 4)] for q in (1, 2, 3))
        below = [i for i, v in enumerate(self.values) if v < value]
        above = [i for i, v in enumerate(self.values) if v > value]
        if below:
            out.append(self.values[max(0, below[-1] - (step - 1))])
        if above:
            out.append(self.values[min(len(self.values) - 1, above[0] + (step - 1))])
        return out

    def first_step(self) -> int:
        return max(1, len(self.values) // 4) if self.kind == "ladder" else 1


def _unique(items) -> list:
    out: list = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


@dataclass
class Candidate:
    knobs: Any  # None: the policy as given
    raw: dict
    why: list[str]
    scores: dict[int, float] = field(default_factory=dict)  # arrival order (seed) -> score

    def mean(self, orders: Sequence[int]) -> float:
        return sum(self.scores[o] for o in orders) / len(orders)


@dataclass
class Outcome:
    """What the search found: the chosen candidate, every candidate scored, the race's orders and its
    verdict lines, how many scores were computed, and whether the budget ended it."""

    best: Candidate
    candidates: list[Candidate]
    orders: tuple[int, ...]  # the orders the race's survivors share (the first alone when no race ran)
    lines: list[str]
    scored: int
    out_of_time: bool
    given: Candidate | None
    unbuilt: int = 0  # knob settings that built no valid policy


Score = Callable[[list[dict], int], list[float]]


class _Clock:
    def __init__(self, budget_s: float | None, began: float, now: Callable[[], float]):
        self.budget_s, self.began, self.per_score, self.now = budget_s, began, 0.0, now

    def left(self, share: float = 1.0) -> float:
        if self.budget_s is None:
            return math.inf
        return self.budget_s * share - (self.now() - self.began)

    def fits(self, n: int, share: float = 1.0, workers: int = 1) -> int:
        """How many of ``n`` scores fit in the time left (all when there is no budget; at least none)."""
        left = self.left(share)
        if left == math.inf:
            return n
        if left <= 0:
            return 0
        if not self.per_score:
            return 1
        return max(0, min(n, int(left / self.per_score * max(1, workers))))


class Search:
    """One search; ``run`` returns its Outcome."""

    def __init__(
        self,
        build: Callable[[Any], tuple[dict, list[str]]],
        score: Score,
        orders: Sequence[int],
        space: Sequence[Dim],
        *,
        budget_s: float | None = None,
        began: float | None = None,
        workers: int = 1,
        race: bool = True,
        search: bool = True,
        now: Callable[[], float] = time.perf_counter,
    ):
        """``now``: the clock the budget is read on (seconds; a test's own clock)."""
        self.build, self._score, self.orders = build, score, tuple(orders)
        self.space, self.workers, self.race_on, self.search_on = list(space), max(1, workers), race, search
        self.clock = _Clock(budget_s, now() if began is None else began, now)
        self.by_raw: dict[str, Candidate] = {}
        self.by_knobs: dict[Any, Candidate | None] = {}  # None: the knobs build no valid policy
        self.scored = self.unbuilt = 0
        self.out_of_time = self.cut = False

    # -- scoring ----------------------------------------------------------------------------------
    def candidate(self, knobs) -> Candidate | None:
        """The candidate these knobs build (the one already seen when they build the same policy); None when they
        build no valid policy (counted in ``unbuilt``; the search goes on without it)."""
        if knobs in self.by_knobs:
            return self.by_knobs[knobs]
        try:
            raw, why = self.build(knobs)
        except (ValueError, GpushareError):  # a combination the policy's rules refuse (PolicyError)
            self.by_knobs[knobs] = None
            self.unbuilt += 1
            return None
        key = json.dumps(raw, sort_keys=True)
        c = self.by_raw.get(key)
        if c is None:
            c = self.by_raw[key] = Candidate(knobs, raw, why)
        self.by_knobs[knobs] = c
        return c

    def score(self, cands: Sequence[Candidate], order: int, share: float = 1.0, force: int = 0) -> list[Candidate]:
        """Score the candidates not yet scored on ``order`` (as many as the budget allows, at least ``force``);
        returns those that now have a score on it."""
        todo = _unique(c for c in cands if order not in c.scores)
        n = max(force, self.clock.fits(len(todo), share, self.workers))
        self.cut = n < len(todo)  # this batch was cut: its step's share of the budget has gone
        if self.cut:
            self.out_of_time = True
            todo = todo[:n]
        if todo:
            began = self.clock.now()
            for c, s in zip(todo, self._score([c.raw for c in todo], order), strict=False):
                c.scores[order] = s
            spent = (self.clock.now() - began) * min(self.workers, len(todo)) / len(todo)
            old = self.clock.per_score
            self.clock.per_score = spent if not old else 0.5 * (old + spent)
            self.scored += len(todo)
        return [c for c in cands if order in c.scores]

    # -- the three steps ----------------------------------------------------------------------------
    def run(self, starts: Sequence, given: dict | None, given_eligible: bool) -> Outcome:
        first = self.orders[0]
        # the policy as given stands apart: a candidate that builds the same policy is scored as itself
        given_c = Candidate(None, given, []) if given is not None else None
        start_cands = _unique(c for c in map(self.candidate, starts) if c is not None)
        if not start_cands:
            raise ValueError("no starting candidate builds a valid policy")
        # the given policy and the first start always; the other starts while the search's share lasts
        self.score([c for c in (given_c, *start_cands[:1]) if c is not None], first, force=2)
        self.score(start_cands, first, START_SHARE)
        pool = [c for c in start_cands if first in c.scores]
        best = max(pool, key=lambda c: c.scores[first])
        if self.search_on and self.space:
            best = self._coordinate(best, first)
        contenders = [c for c in self.by_raw.values() if first in c.scores]
        if given_c is not None and given_eligible and first in given_c.scores:
            contenders.append(given_c)
        lines: list[str] = []
        orders: tuple[int, ...] = (first,)
        if self.race_on and len(self.orders) > 1 and len(contenders) > 1:
            best, orders, lines = self._race(contenders, given_c if given_eligible else None)
        else:
            best = max(contenders, key=lambda c: (c.scores[first], c is given_c))  # a tie keeps the policy as given
        return Outcome(
            best, list(self.by_raw.values()), orders, lines, self.scored, self.out_of_time, given_c, self.unbuilt
        )

    def _coordinate(self, best: Candidate, order: int) -> Candidate:
        steps = {d.name: d.first_step() for d in self.space}
        while True:
            gained = False
            for dim in self.space:
                current = getattr(best.knobs, dim.name)
                built = [
                    self.candidate(replace(best.knobs, **{dim.name: v}))
                    for v in dim.neighbours(current, steps[dim.name])
                ]
                trials = [c for c in built if c is not None and c is not best]
                scored = self.score(trials, order, SEARCH_SHARE)
                if self.cut:  # the search's share has gone (the starts' own cut leaves it its share)
                    return best
                top = max(scored, key=lambda c: c.scores[order], default=None)
                if top is not None and top.scores[order] > best.scores[order]:
                    best, gained = top, True
            if not gained:
                if all(s == 1 for s in steps.values()):
                    return best
                steps = {k: max(1, s // 2) for k, s in steps.items()}

    def _race(
        self, contenders: list[Candidate], given: Candidate | None
    ) -> tuple[Candidate, tuple[int, ...], list[str]]:
        first = self.orders[0]
        ranked = _distinct(sorted(contenders, key=lambda c: (-c.scores[first], c is not given)), first)
        if given is not None and given not in ranked:  # it places as a candidate does: that one stands for both
            ranked = [given if c.scores[first] == given.scores[first] else c for c in ranked]
        active = ranked[:RACE_SIZE]
        if given is not None and given not in active:
            active.append(given)
        waiting = [c for c in ranked if c not in active]
        used = [first]
        noise = None  # the standard deviation of one order's paired difference, once measured
        for order in self.orders[1:]:
            if len(active) < 2:
                break
            done = self.score(active, order)
            if len(done) < len(active):
                self.out_of_time = True
                break
            used.append(order)
            leader = max(active, key=lambda c: c.mean(used))
            noise = _paired_sd([leader], active, used) or noise
            if noise is not None:
                se = noise / math.sqrt(len(used))
                active = [c for c in active if c is leader or leader.mean(used) - c.mean(used) <= Z * se]
                joining = [c for c in waiting if leader.scores[first] - c.scores[first] <= Z * noise][:JOIN]
                waiting = [c for c in waiting if c not in joining]
                for c in joining:  # scored on every order so far, or left out when the time is gone
                    if all(self.score([c], o) for o in used[1:]):
                        active.append(c)
        leader = max(active, key=lambda c: (c.mean(used), c is given))  # a tie keeps the policy as given
        return leader, tuple(used), self._verdict(leader, active, used, noise, given)

    def _verdict(self, leader: Candidate, active: list[Candidate], used: list[int], noise, given) -> list[str]:
        """The report's line on the race. The standard error of the margin over the runner-up: the pair's own
        spread over the orders, or on two orders (one difference's spread is no measure) the race's pooled noise
        of one order over every pair it compared, over the square root of the orders."""
        everyone = [*self.by_raw.values(), *([given] if given is not None else [])]
        others = [c for c in everyone if c is not leader and all(o in c.scores for o in used)]
        if len(used) < 2 or not others:
            return [f"chosen on one sampled order ({used[0]}): no other candidate was scored on more"]
        same = [c for c in others if all(c.scores[o] == leader.scores[o] for o in used)]
        others = [c for c in others if c not in same]
        if not others:
            return [
                f"race over sampled orders {', '.join(str(o) for o in used)}: every candidate left places as "
                f"the choice does"
            ]
        runner = max(others, key=lambda c: c.mean(used))
        diffs = [leader.scores[o] - runner.scores[o] for o in used]
        margin = sum(diffs) / len(diffs)
        sd = _sd(diffs) if len(diffs) >= 3 or noise is None else noise
        se = sd / math.sqrt(len(diffs)) if sd is not None else float("nan")
        sure = "outside the noise" if margin > Z * se else "within the noise: either would do as well"
        name = "the policy as given" if runner is given else _name(runner)
        orders = ", ".join(str(o) for o in used)
        twins = f"; {len(same)} other candidate(s) place exactly as it does on these orders" if same else ""
        return [
            f"race over sampled orders {orders}: {len(active)} left{twins}; chosen by {margin:+.2f} points "
            f"(standard error {se:.3f}) over the runner-up ({name}), {sure}"
        ]


def _distinct(ranked: list[Candidate], order: int) -> list[Candidate]:
    """The first of each run of equal scores on ``order``: policies that differ only where no job of the sample
    goes (an order for CPU-only jobs on a site whose CPU-only jobs all fit anywhere) place identically, and racing
    them would spend the budget on one placement several times."""
    out: list[Candidate] = []
    for c in ranked:
        if not out or c.scores[order] != out[-1].scores[order]:
            out.append(c)
    return out


def _name(c: Candidate) -> str:
    changed = getattr(c.knobs, "changed", None)
    return changed() if callable(changed) else repr(c.knobs)


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _paired_sd(leaders: list[Candidate], active: list[Candidate], used: list[int]) -> float | None:
    """The pooled standard deviation, over the active candidates, of one order's difference to the leader."""
    sq, df = 0.0, 0
    for lead in leaders:
        for c in active:
            if c is lead:
                continue
            d = [lead.scores[o] - c.scores[o] for o in used]
            m = sum(d) / len(d)
            sq += sum((x - m) ** 2 for x in d)
            df += len(d) - 1
    return math.sqrt(sq / df) if df and sq > 0 else None
