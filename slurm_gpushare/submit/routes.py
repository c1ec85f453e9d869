"""Class routing (``submission.routes``): which request classes go to which tiers, and MPS shares rounded to MIG. Pure.

A route matches a job that names no partition by the GRES it asks for
('none' for a job without GPUs, 'gpu', 'mps', 'shard'), its QOS and its GPU
count; the first matching route wins. It may

- match on the job's CPUs too (``min_cpus``), so CPU-heavy jobs can be kept
  on CPU-rich nodes;
- send the job to its ``tiers`` (the partition is set to their names, comma
  separated, so Slurm may start it in any of them), and
- with ``round_to: mig``, turn an MPS share ``mps:N`` (N percent of one GPU)
  into one MIG slice: the smallest MIG instance type on the route's tiers
  whose share of its GPU covers N % (``gpu:<type>:1``). A slice's share is
  the larger of its compute and memory shares, the part of the GPU it denies
  to others (as billing counts it): a 3g.20gb of an A100-40GB is 50 %.
  A share no slice covers takes one whole (non-MIG) GPU of the tiers,
  ``gpu:<model type>:1``; with neither, the request is left as it is.

A job that names a partition, and an update of a job, are never routed.
The tables here are data that job_submit.lua reads too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..policy.share import Mode
from .entries import Gres, Other  # records only: tables.py builds routes without an import cycle


@dataclass(frozen=True)
class RouteRule:
    """One validated route, with its MIG cover table: ((percent covered, GPU type), ...) ascending."""

    gres: str
    qos: tuple[str, ...] = ()
    min_gpus: int = 0
    max_gpus: int = 0  # 0: no upper bound
    min_cpus: int = 0
    tiers: tuple[str, ...] = ()
    mig_cover: tuple[tuple[int, str], ...] = ()
    round_to: str = ""


def mig_cover(groups) -> tuple[tuple[int, str], ...]:
    """Each MIG instance type on these groups and the whole percent of its GPU it covers (its billed share)."""
    best: dict[str, int] = {}
    for g in groups:
        for slot in g.gpus:
            if not slot.share.is_mig:
                best[slot.slurm_type] = 100  # a share no slice covers takes a whole GPU
                continue
            for name in slot.layout:
                share = slot.model.profile(name).fraction(slot.model)
                best[slot.model.mig_slurm_type(name)] = int(share * 100 + 1e-9)
    return tuple(sorted((pct, t) for t, pct in best.items()))


def build_routes(site) -> tuple[RouteRule, ...]:
    tiers = {t.name: t for t in site.tiers}
    out = []
    for r in site.policy.submission.routes:
        scope = [g for name in r.tiers for g in tiers[name].groups] if r.tiers else list(site.groups)
        out.append(
            RouteRule(
                gres=r.match.gres,
                qos=tuple(q.lower() for q in r.match.qos),
                min_gpus=r.match.min_gpus or 0,
                max_gpus=r.match.max_gpus or 0,
                min_cpus=r.match.min_cpus or 0,
                tiers=tuple(r.tiers),
                mig_cover=mig_cover(scope) if r.round_to == Mode.MIG else (),
                round_to=r.round_to or "",
            )
        )
    return tuple(out)


def job_class(requests: list[Gres]) -> tuple[str, int]:
    """('none' | 'gpu' | 'mps' | 'shard', GPUs asked): the kind of the job's first GRES (mixes are refused later)."""
    if not requests:
        return "none", 0
    kind = requests[0].name
    return kind, sum(r.count for r in requests if r.name == "gpu")


def matches(rule: RouteRule, kind: str, gpus: int, qos: str, cpus: int = 1) -> bool:
    if rule.gres != kind or cpus < rule.min_cpus:
        return False
    if rule.qos and qos.lower() not in rule.qos:
        return False
    if kind == "gpu" and (gpus < rule.min_gpus or (rule.max_gpus and gpus > rule.max_gpus)):
        return False
    return True


def find_route(routes, job, requests: list[Gres], modify: bool) -> RouteRule | None:
    if modify or job.get("partition") or not routes:
        return None
    kind, gpus = job_class(requests)
    qos = job.get("qos") or ""
    cpus = _int(job.get("min_cpus"))
    return next((r for r in routes if matches(r, kind, gpus, qos, cpus)), None)


def _int(value) -> int:
    """job_submit's min_cpus (unset: Slurm's NO_VAL, or absent): 1 unless a whole number below NO_VAL."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return 1
    return n if 0 < n < 0xFFFFFFFE else 1


def round_entry(rule: RouteRule, e: Gres | Other) -> Gres | Other:
    """``mps:N`` -> ``gpu:<smallest MIG type covering N %>:1`` (unchanged when nothing covers it)."""
    if rule.round_to != Mode.MIG or not isinstance(e, Gres) or e.name != Mode.MPS:
        return e
    gtype = next((t for pct, t in rule.mig_cover if pct >= e.count), None)
    if gtype is None:
        return e
    return replace(e, name="gpu", type=gtype, count=1, alias=e.alias or "mps")


def routed(rule: RouteRule | None, parsed: dict[str, list[Gres | Other]]) -> dict[str, list[Gres | Other]]:
    if rule is None or not rule.round_to:
        return parsed
    return {name: [round_entry(rule, e) for e in entries] for name, entries in parsed.items()}
