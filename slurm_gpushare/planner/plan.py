"""The planner: from a demand model, a site policy and the catalogue, the layout an admin guesses today. Pure.

Three steps, as everywhere in the product: observe (the demand model and the
validated base policy: ``Supply``), plan (this module: a new policy as a
plain mapping, validated by ``policy.build_site``), and report (each choice
with its reason). Nothing here reads files or runs commands.

What it chooses:

- each GPU's sharing mode: MPS for GPUs that fractional jobs may share (with
  the fewest units that express every share exactly), MIG layouts packed
  from the slices the fractional demand rounds up to (on MIG-capable GPUs,
  for the QoS classes that must be isolated or for all of them), exclusive
  for the rest;
- pools as tiers over node groups (a group is split by whole nodes when a
  pool needs only part of it): ``frac`` where fractional jobs are packed,
  ``mig`` for slices, ``cpu`` on CPU-rich nodes for CPU-only and CPU-heavy
  jobs, ``gpu`` for whole GPUs;
- node weights (slurm.conf ``Weight``: Slurm fills lower weights first);
- class routing (``submission.routes``): which request classes go to which
  tiers, in which order (a job may start in any listed tier; Slurm tries them
  in order), and MPS shares rounded to MIG slices.

What it keeps valid on heterogeneous sites: a tier whose mps GPUs would bill
one mps unit differently (models of different billing weights) is split into
'<tier>', '<tier>-2', ... (Slurm has one TRESBillingWeights per partition),
the routes listing the split tiers in turn; a submission alias whose target
the plan removed (a MIG slice type, shard, mps) is remapped to the same share
of a GPU or dropped. Each such change has a report line.

When the caller passes ``evaluate`` (a policy mapping -> packing score, e.g.
the placement simulator on sampled arrivals) the planner tries a few
candidate pool sizes and CPU thresholds and keeps the best; otherwise it uses
the sizes the demand model gives directly.

The modules: ``knobs`` (the free parameters and the starting candidates),
``estimates`` (what is read off the demand and the site), ``candidates`` (one
policy from a set of knobs, stage by stage, written by ``builder``), ``choose``
(the search's space and its verdict, over ``search``), ``report`` (the plan
report); this module ties them together (``plan``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..policy import Site, build_site, perjob
from .choose import Choice, choose, verdict_lines
from .demand import Demand
from .knobs import Knobs, default_candidates
from .migtune import plan_weights
from .report import plan_report


@dataclass
class PlanResult:
    policy: dict
    site: Site
    report: list[str]
    knobs: Knobs
    score: float | None = None
    tried: list[tuple[Knobs, float]] = field(default_factory=list)
    kept_given: bool = False  # the policy as given was kept: no candidate scored above it (or nothing to plan)
    given_score: float | None = None  # the policy as given, scored as the candidates are (with ``evaluate``)


def plan(
    base: dict,
    demand: Demand,
    *,
    isolate_qos: Sequence[str] = (),
    mig_fractions: bool = False,
    evaluate: Callable[[dict], float] | None = None,
    candidates: Sequence[Knobs] | None = None,
    budget_s: float | None = None,
    mig_types: Sequence[str] = (),
    search: bool | None = None,
) -> PlanResult:
    """Plan a policy for ``demand`` on the hardware of ``base`` (a policy mapping, validated here).

    With ``evaluate``, the policy as given and the candidates (``candidates``, or ``default_candidates``) are
    scored on a first sampled order; then (``search``: by default when no ``candidates`` are given) a coordinate
    search over the knobs' space (``choose.search_space``) from the best of them; then the best few are raced on
    more orders when ``evaluate`` is an ``Evaluator`` with check seeds (planner/search.py). Everything stops when
    ``budget_s`` seconds have gone (the first candidate and the policy as given are always scored); the best so
    far is kept. The choice is kept only when it scores above the policy as given on the orders both were scored
    on, which is kept otherwise (never worse than changing nothing, by the planner's own measure). Under
    ``isolate_qos`` or ``mig_fractions`` the policy as given is scored for the report but not kept: it does not
    give the shares the MIG slices asked for. A demand with no GPU job keeps the policy as given (nothing to
    share; the packing score would be 0 for every candidate). ``mig_types`` (MIG profile names): the layouts
    hold only these slice types (and the whole-GPU one), packed to use the most compute slices per GPU, so a
    share is rounded to the smallest of them (e.g. the site's existing slice types; without 1g.10gb, a 20 %
    share takes a 2g.10gb); ``("compact",)``: one type per compute size, the least memory
    (``hardware.packing.compact_types``).
    """
    began = time.perf_counter()
    site = build_site(base, "base policy")
    constrained = bool(isolate_qos or mig_fractions)
    _check(site, demand, constrained)
    if not demand.gpu_milli:
        return _no_gpu_demand(base, site, demand)
    tries = _tries(site, candidates, evaluate is not None, bool(isolate_qos), mig_fractions)
    searching = candidates is None if search is None else search
    got = choose(
        base,
        site,
        demand,
        _with_mig_types(tries, site, mig_types),
        evaluate,
        budget_s=budget_s,
        began=began,
        isolate=isolate_qos,
        mig_all=mig_fractions,
        searching=searching,
    )
    keep_given = got.given is not None and not constrained and got.score <= got.given
    verdict = (  # evaluate scores the policy as given
        [*got.note, *verdict_lines(got.given, got.score, keep_given, constrained)]
        if evaluate and got.given is not None
        else []
    )
    raw, why = (copy.deepcopy(base), [verdict[-1]]) if keep_given else _planned(got, demand)
    new_site = site if keep_given else build_site(raw, "planned policy")
    report = plan_report(demand, site, new_site, why, list(got.tried) if evaluate else [], raw, verdict, got.given)
    score = (got.given if keep_given else got.score) if evaluate else None
    return PlanResult(raw, new_site, report, got.knobs, score, list(got.tried), keep_given, got.given)


def _planned(got: Choice, demand: Demand) -> tuple[dict, list[str]]:
    """The chosen policy and its reasons; with per-job MIG, its carrier weights tuned on the demand (migtune)."""
    if not got.knobs.mig_per_job:
        return got.raw, list(got.why)
    raw, tuned = plan_weights(got.raw, build_site(got.raw, "planned policy"), demand)
    return raw, [*got.why, *tuned]


def _tries(site: Site, given: Sequence[Knobs] | None, scored: bool, isolating: bool, mig_all: bool) -> list[Knobs]:
    """The starting candidates: the caller's, else the defaults when scored (one more with the MIG pool per job,
    where ``per_job_offered``), else the first."""
    if given:
        return list(given)
    if not scored:
        return [Knobs()]
    tries = default_candidates(isolating=isolating)
    return [*tries, Knobs(mig_per_job=True)] if per_job_offered(site, mig_all) else tries


def per_job_offered(site: Site, mig_all: bool) -> bool:
    """Whether candidates may make the MIG pool per-job MIG: every share on MIG (``--mig-fractions``: with an
    MPS pool beside it, shares would be asked as mps, not as slices), on a site whose hooks and cgroups per-job
    MIG needs are configured."""
    return mig_all and perjob.ready(site.policy)


def _check(site: Site, demand: Demand, mig_asked: bool) -> None:
    """ValueError for a demand without jobs, or MIG slices asked for on a site without a MIG-capable GPU."""
    if not demand.jobs:
        raise ValueError("the demand model has no jobs: nothing to plan for")
    if mig_asked and not any(g.model.mig_capable for g in site.groups):
        models = ", ".join(sorted({g.model.name for g in site.groups}))
        raise ValueError(
            f"MIG slices were asked for (isolated QoS or every share on MIG) but no GPU of the policy "
            f"supports MIG ({models})"
        )


def _with_mig_types(tries: list[Knobs], site: Site, mig_types: Sequence[str]) -> list[Knobs]:
    """The candidates held to the MIG slice types ``mig_types`` (``("compact",)``: one per compute size);
    ValueError for a type no MIG-capable GPU of the site offers."""
    if tuple(mig_types) == ("compact",):
        return [replace(k, mig_compact=True) for k in tries]
    if not mig_types:
        return tries
    known = sorted({p.name for g in site.groups if g.model.mig_capable for p in g.model.mig_profiles})
    unknown = [t for t in mig_types if t not in known]
    if unknown:
        raise ValueError(
            f"MIG slice type(s) {', '.join(unknown)} not offered by any MIG-capable GPU of the "
            f"policy; accepted: {', '.join(known)}"
        )
    return [replace(k, mig_types=tuple(mig_types), mig_fill=True) for k in tries]


def _no_gpu_demand(base: dict, site: Site, demand: Demand) -> PlanResult:
    """The plan of a demand without GPU jobs: the policy as given, with the reason."""
    why = [
        f"the demand asks for no GPU ({demand.jobs} CPU-only jobs): nothing to share or pack; kept the policy as given"
    ]
    report = plan_report(demand, site, site, why, [], base)
    return PlanResult(copy.deepcopy(base), site, report, Knobs(), None, [], True, None)


__all__ = ["PlanResult", "plan"]
