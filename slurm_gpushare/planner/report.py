"""The plan report: the demand, the supply before and after, the choices, the routes, the candidates scored
and the verdict (``plan_report``), with its supply and stranded-capacity sections. Pure.

Expected stranded capacity is an estimate from the demand model, per tier
the routing sends each request class to (the classes are routed through the
product's submission decision, exactly as jobs would be):

- fragments: GPU shares that fractional jobs leave unused when their shares
  are packed first-fit in arrival order (``demand.pack_estimate``);
- CPU shortfall: GPUs a tier cannot use because the jobs routed to it ask
  more CPUs per GPU than its nodes have (whole CPUs, as Slurm counts them:
  the demand model already rounds each job's millicores up).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from ..policy import Site
from ..sim.cluster import GPU_MILLI, Pod
from .demand import Demand, format_demand, pack_estimate
from .estimates import demand_scale, supply
from .frompolicy import SubmitRouter
from .knobs import Knobs

SHOWN = 15  # candidates the report lists (the best first on the first sampled order)


def plan_report(
    demand: Demand,
    before: Site,
    after: Site,
    why: list[str],
    tried: Sequence[tuple[Knobs, float]],
    raw: dict,
    verdict: Sequence[str] = (),
    given: float | None = None,
) -> list[str]:
    """The plan's report: the demand, the supply as given, the choices (``why``), the planned supply and its
    expected use, the routes of the planned policy ``raw``, the candidates scored (``tried``, the best first;
    the first ``SHOWN``) beside the policy as given's score, and the verdict lines."""
    lines = format_demand(demand)
    lines += supply_lines(before, "supply (base policy)")
    lines.append("choices:")
    lines += [f"  - {w}" for w in why]
    lines += supply_lines(after, "planned layout")
    lines += stranded_lines(demand, after)
    for r in raw.get("submission", {}).get("routes", []):
        m = r["match"]
        what = ", ".join(f"{k}={v}" for k, v in m.items())
        extra = f", rounded to {r['round_to']}" if r.get("round_to") else ""
        lines.append(f"  route {what} -> {','.join(r['tiers'])}{extra}")
    if tried:
        lines.append("candidates (packing score on sampled arrivals):")
        if given is not None:
            lines.append(f"  the policy as given: {given:.2f}")
        lines += [f"  {k.changed()}: {s:.2f}" for k, s in tried[:SHOWN]]
        if len(tried) > SHOWN:
            lines.append(f"  ... and {len(tried) - SHOWN} more, down to {tried[-1][1]:.2f}")
    lines += verdict
    return lines


def supply_lines(site: Site, title: str) -> list[str]:
    total_gpus = sum(len(g.nodes) * len(g.gpus) for g in site.groups)
    lines = [
        f"{title}: {sum(len(g.nodes) for g in site.groups)} nodes, {total_gpus} GPUs, {len(site.groups)} node groups"
    ]
    for t in site.tiers:
        gpus = sum(len(g.nodes) * len(g.gpus) for g in t.groups)
        cpus = sum(len(g.nodes) * g.spec.cpus for g in t.groups)
        modes = Counter(
            "mig per job" if s.share.is_per_job_mig else s.mode.value for g in t.groups for s in g.gpus for _ in g.nodes
        )
        mode_text = ", ".join(f"{n} {m}" for m, n in sorted(modes.items()))
        lines.append(f"  tier {t.name}: {len(t.groups)} groups, {gpus} GPUs ({mode_text}), {cpus} CPUs")
    return lines


def routed_demand(demand: Demand, site: Site) -> dict[str, dict]:
    """Per first tier of its route: jobs, GPUs asked, CPUs asked, refused jobs (tier '(refused)', with ``why``:
    jobs per violation code)."""
    router = SubmitRouter(site)
    out: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "gpus": 0.0, "cpus": 0, "frac": 0})
    for cls, n in demand.counts.items():
        pod = Pod("class", cls.cpus * 1000, cls.memory_mib, cls.num_gpu, cls.gpu_milli, cls.qos, cls.gpu_spec)
        req = router(pod)
        tier = req.partitions[0] if req is not None else "(refused)"
        row = out[tier]
        row["jobs"] += n
        row["gpus"] += n * cls.gpu_demand_milli / GPU_MILLI
        row["cpus"] += n * cls.cpus
        row["frac"] += n if cls.kind == "fraction" else 0
        if req is None:
            why = row.setdefault("why", Counter())
            for code in router.refusal(pod):
                why[code] += n
    return dict(out)


def refused_text(why: Counter | dict) -> str:
    """'UNKNOWN_FEATURE a10 12, CONSTRAINT shard 3': jobs per violation code, most first."""
    return ", ".join(f"{code} {n}" for code, n in sorted(why.items(), key=lambda kv: (-kv[1], kv[0])))


def stranded_lines(demand: Demand, site: Site) -> list[str]:
    scale = demand_scale(demand, supply(site))
    lines = [f"expected use per tier (demand scaled x{scale:.2f} to 100 % of the cluster's GPUs):"]
    routed = routed_demand(demand, site)
    tiers = {t.name: t for t in site.tiers}
    for name, row in sorted(routed.items()):
        if name not in tiers:
            lines.append(
                f"  {name}: {row['jobs']} jobs ({row['gpus']:.1f} GPUs) would be refused at submission: "
                f"{refused_text(row.get('why', {}))}"
            )
            continue
        t = tiers[name]
        gpus = sum(len(g.nodes) * len(g.gpus) for g in t.groups)
        cpus = sum(len(g.nodes) * g.spec.cpus for g in t.groups)
        asked_gpus, asked_cpus = row["gpus"] * scale, row["cpus"] * scale
        short = ""
        if asked_gpus and cpus < asked_cpus:
            stranded = gpus * (1 - cpus / asked_cpus)
            short = f"; CPU-bound: {asked_cpus - cpus:.0f} CPUs short, strands about {stranded:.0f} GPUs"
        lines.append(
            f"  {name}: {row['jobs']} job classes' jobs first routed here, asking {asked_gpus:.1f} of {gpus} GPUs and "
            f"{asked_cpus:.0f} of {cpus} CPUs{short}"
        )
    fractions = {m: round(n * scale) for m, n in demand.fractions().items()}
    if fractions:
        asked = sum(m * n for m, n in fractions.items()) / GPU_MILLI
        bins = pack_estimate(fractions)
        lines.append(
            f"  fragments: fractional shares ask {asked:.1f} GPUs and fill about {bins}: "
            f"{bins - asked:.1f} GPUs ({100 * (bins - asked) / max(1, _gpus(site)):.1f} %) stranded in share remainders"
        )
    return lines


def _gpus(site: Site) -> int:
    return sum(len(g.nodes) * len(g.gpus) for g in site.groups)
