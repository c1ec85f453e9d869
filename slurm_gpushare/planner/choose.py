"""Driving the search: which candidate policy a plan keeps, and how sure it is. Pure.

``choose`` builds candidates (``planner.candidates``) from the starting knobs, scores them with the caller's
``evaluate`` and runs ``planner.search.Search`` over the knobs' space (``search_space``: values derived from
the demand and the site); it returns a ``Choice``. Without ``evaluate`` the first candidate is the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..hardware.packing import GPU_MILLI
from ..policy import Site, perjob
from .candidates import build_candidate
from .demand import Demand, pack_estimate
from .estimates import HEADROOM, demand_scale, scaled_counts, split_shares, supply
from .evaluate import Evaluator
from .knobs import Knobs
from .search import Dim, Outcome, Search


@dataclass(frozen=True)
class Choice:
    """What a plan's search chose: the policy as given's score (None without ``evaluate``), the chosen
    candidate's score, knobs, policy and report lines, every candidate scored on the first sampled order
    (knobs, score; the best first), and the report's lines on the search and the race (``note``).

    When the race kept the policy as given, ``raw`` is that policy, ``knobs`` the defaults, ``why`` empty and
    ``score`` the best candidate's (the report names it)."""

    given: float | None
    score: float
    knobs: Knobs
    raw: dict
    why: tuple[str, ...]
    tried: tuple[tuple[Knobs, float], ...]
    note: tuple[str, ...] = ()


def choose(
    base: dict,
    site: Site,
    demand: Demand,
    tries: Sequence[Knobs],
    evaluate,
    *,
    budget_s: float | None,
    began: float,
    isolate: Sequence[str],
    mig_all: bool,
    searching: bool,
) -> Choice:
    """The candidate a plan keeps. Without ``evaluate`` the first of ``tries`` is the plan. With it,
    ``search.Search`` scores the policy as given and the candidates ``tries`` on the first sampled order,
    searches the knobs' space from the best of them (``searching``), and races the best few on more orders (an
    ``Evaluator``'s check seeds) until the budget ``budget_s`` (seconds from ``began``) has gone."""

    def build(knobs: Knobs) -> tuple[dict, list[str]]:
        return build_candidate(base, site, demand, knobs, isolate=isolate, mig_all=mig_all)

    if evaluate is None:
        raw, why = build(tries[0])
        return Choice(None, 0.0, tries[0], raw, tuple(why), ((tries[0], 0.0),))
    orders, workers, score = _scorer(evaluate)
    space = search_space(site, demand, tries[0], isolate, mig_all) if searching else []
    run = Search(build, score, orders, space, budget_s=budget_s, began=began, workers=workers)
    return _choice(run.run(tries, base, given_eligible=not (isolate or mig_all)), orders[0], base)


def _scorer(evaluate) -> tuple[tuple[int, ...], int, Callable[[list[dict], int], list[float]]]:
    """(the sampled orders, the processes, ``score(policies, order)``) of ``evaluate``: an ``Evaluator`` (its seeds
    and check seeds) or a plain function of the policy (one "order", no race)."""
    if isinstance(evaluate, Evaluator) or hasattr(evaluate, "check_seeds"):

        def many(raws, order):
            return evaluate.many(raws, (order,))

        return (*evaluate.seeds, *evaluate.check_seeds), evaluate.workers, many

    def each(raws, order):
        return [evaluate(r) for r in raws]

    return (0,), 1, each


def _choice(out: Outcome, first: int, base: dict) -> Choice:
    """The Choice of a search's outcome: the policy as given against the choice on the orders both were scored
    on (the race may have dropped it)."""
    best = out.best
    mine = [o for o in out.orders if o in best.scores]
    common = [o for o in mine if out.given is not None and o in out.given.scores] or [first]
    given = out.given.mean(common) if out.given is not None else None
    scored = sorted((c for c in out.candidates if first in c.scores), key=lambda c: -c.scores[first])
    tried = tuple((c.knobs, c.scores[first]) for c in scored)
    note = (
        f"{len(scored)} candidate policies scored on the first sampled order ({first}); "
        f"{out.scored} scores in all"
        + (f"; {out.unbuilt} knob settings built no valid policy" if out.unbuilt else "")
        + (" (the time budget ended the search: the best so far is kept)" if out.out_of_time else ""),
        *out.lines,
    )
    if best is out.given:  # the race kept the policy as given: the report names the best candidate's score
        rivals = [c for c in out.candidates if all(o in c.scores for o in common)]
        return Choice(given, max(c.mean(common) for c in rivals), Knobs(), base, (), tried, note)
    score = best.mean(common if out.given is not None else mine)
    return Choice(given, score, best.knobs, best.raw, tuple(best.why), tried, note)


def verdict_lines(given: float, best: float, keep_given: bool, constrained: bool) -> list[str]:
    """The report's line on which policy was kept, and why."""
    if keep_given:
        return [f"kept the policy as given: it scores {given:.2f}, no candidate scored above it (best {best:.2f})"]
    if constrained:
        return [
            f"planned: the best candidate scores {best:.2f}; the policy as given ({given:.2f}) is not eligible, "
            f"it does not give the shares the MIG slices asked for (--isolate-qos / --mig-fractions)"
        ]
    return [f"planned: the best candidate scores {best:.2f}, above the policy as given ({given:.2f})"]


def search_space(site: Site, demand: Demand, knobs: Knobs, isolate: Sequence[str], mig_all: bool) -> list[Dim]:
    """The knobs the search moves, with values derived from the demand and the site (no constant tuned on a
    workload): the MPS pool's size from the shares' own GPU demand (every share packed perfectly) up to every GPU
    of the site (whole-GPU jobs may use an MPS GPU without shares), in steps of about one node or finer; the CPU
    bounds at the demand's own CPU sizes (the quantiles of its jobs' requests); the MIG pool from half to one and
    a half times the slices the isolated shares need (no more than the MIG-capable GPUs hold); and every way of
    placing CPU-only jobs, weighting nodes and ordering pools. Knobs that cannot change this demand's policy (no
    shares: no MPS pool) are left out."""
    groups = supply(site)
    mig_frac, mps_frac = split_shares(demand, isolate, mig_all)
    scale = demand_scale(demand, groups)
    total = sum(g.gpus * len(g.nodes) for g in groups)
    dims: list[Dim] = []
    if mps_frac:
        est = max(1, pack_estimate(scaled_counts(mps_frac, scale))) * HEADROOM
        share = sum(m * n for m, n in mps_frac.items()) / GPU_MILLI * scale
        # whole-GPU jobs may take an MPS GPU that has no share (overflow): the pool may grow to every GPU
        lo, hi = min(share / est, knobs.frac_factor), max(total / est, knobs.frac_factor)
        grain = min(g.gpus for g in groups) / est  # one node of the smallest GPU count
        points = int(min(40, max(2, (hi - lo) / max(grain, 1e-9))))
        dims.append(Dim("frac_factor", _grid(lo, hi, points), "ladder"))
        dims.append(Dim("frac_heavy", _cpu_quantiles(demand, "fraction"), "ladder", (None,)))
        dims.append(Dim("frac_weights", ("group", "node")))
        dims.append(Dim("frac_nodes", ("cpus", "fit")))
    if any(cls.kind == "whole" for cls in demand.counts):
        dims.append(Dim("heavy_cpus", _cpu_quantiles(demand, "whole"), "ladder", (None,)))
    if any(cls.kind == "cpu" for cls in demand.counts):
        dims.append(Dim("cpu_jobs", ("auto", "rich", "spare", "first")))
        dims.append(Dim("cpu_order", ((), ("cpu",))))
    dims += [Dim("weights", ("gpus", "cpus", "flat")), Dim("lean", (True, False)), Dim("overflow", (True, False))]
    if mig_frac and any(g.mig for g in groups):
        mig_gpus = sum(g.gpus * len(g.nodes) for g in groups if g.mig)
        need = max(1, sum(scaled_counts(mig_frac, scale).values()))
        hi = max(1.0, min(1.5, mig_gpus * 7 / need))  # at most 7 slices per GPU: the most a layout holds
        dims.append(Dim("mig_factor", _grid(0.5, hi, 20), "ladder"))
        if not knobs.mig_types and not knobs.mig_compact:
            dims.append(Dim("mig_fill", (False, True)))
        if mig_all and perjob.ready(site.policy):
            dims.append(Dim("mig_per_job", (False, True)))
    return dims


def _grid(lo: float, hi: float, points: int) -> tuple[float, ...]:
    """``points`` values from ``lo`` to ``hi`` in equal ratios (finer where the values are small)."""
    if hi <= lo or lo <= 0:
        return (round(max(lo, hi), 3),)
    return tuple(sorted({round(lo * (hi / lo) ** (i / (points - 1)), 3) for i in range(points)}))


def _cpu_quantiles(demand: Demand, kind: str) -> tuple[int, ...]:
    """The CPU sizes of this kind's jobs at their quantiles 0.5-0.99 (as CPU bounds: jobs asking more move)."""
    sizes = sorted(c.cpus for c, n in demand.counts.items() if c.kind == kind for _ in range(n))
    if not sizes:
        return ()
    return tuple(
        sorted({sizes[min(len(sizes) - 1, int(q * len(sizes)))] for q in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)})
    )
