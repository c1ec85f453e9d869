"""One candidate policy from a set of knobs: which nodes go to which pool, and the routes. Pure.

``build_candidate`` runs the stages in turn, each adding its report lines: the MIG pool (slices packed into
layouts of one MIG-capable model), the MPS pool (shares packed first fit), the CPU-rich and CPU-poor pools,
the node groups split by pool (``planner.builder``), the order CPU-only jobs take the pools, and the routes;
tiers are split by mps billing weight and submission aliases whose target the plan removed are remapped
(``policy.document.remap_aliases``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..hardware.packing import GPU_MILLI, compact_types, pack, whole_profile
from ..policy import Site
from ..policy.document import remap_aliases
from ..policy.perjob import default_weights
from ..policy.share import Mode, Share
from .builder import Builder, gpu_range, mig_sharing, mps_sharing, per_job_sharing, split_group
from .demand import Demand, pack_estimate
from .estimates import (
    CPU_RICH,
    HEADROOM,
    MIG_CPUS,
    GroupInfo,
    bulk_cpus_per_gpu,
    cpu_rich,
    demand_scale,
    heavy_threshold,
    lean_groups,
    mps_units,
    scaled_counts,
    slices_needed,
    spare_cpus,
    split_shares,
    supply,
)
from .knobs import Knobs


@dataclass(frozen=True)
class _Inputs:
    """What every stage of one candidate reads: the site, its groups, the demand and how it splits, the knobs."""

    site: Site
    groups: list[GroupInfo]
    demand: Demand
    knobs: Knobs
    isolate: Sequence[str]
    mig_all: bool
    mig_frac: dict[int, int]  # {share: jobs} that get MIG slices
    mps_frac: dict[int, int]  # {share: jobs} that share GPUs through MPS
    units: int  # mps units per GPU
    scale: float  # site GPUs / demand GPUs


@dataclass
class _Pools:
    """Whole nodes taken per group ({group index: nodes}) by each pool, and the CPU-rich and CPU-poor groups."""

    mig_nodes: dict[int, int] = field(default_factory=dict)
    layouts_by_gpu: list[tuple[str, ...]] = field(default_factory=list)
    frac_nodes: dict[int, int] = field(default_factory=dict)
    rich: set[int] = field(default_factory=set)
    heavy: int = 0  # single-GPU jobs asking more CPUs than this go to the CPU-rich pool
    lean: set[int] = field(default_factory=set)
    light: int = 0  # single-GPU jobs asking at most this many CPUs start in the CPU-poor pool


def build_candidate(
    base: dict, site: Site, demand: Demand, knobs: Knobs, *, isolate: Sequence[str] = (), mig_all: bool = False
) -> tuple[dict, list[str]]:
    """One candidate policy and the report lines that explain it.

    Stages, each adding its report lines in turn: the MIG pool, the MPS pool, the CPU-rich and CPU-poor pools
    (which groups go where), the node groups split by pool, the order CPU-only jobs take the pools, and the
    routes (with tiers split by mps billing weight and submission aliases remapped).
    """
    groups = supply(site)
    mig_frac, mps_frac = split_shares(demand, isolate, mig_all)
    units, scale = mps_units(mps_frac), demand_scale(demand, groups)
    c = _Inputs(site, groups, demand, knobs, isolate, mig_all, mig_frac, mps_frac, units, scale)
    why: list[str] = []
    pools = _Pools()
    if mig_frac and any(g.mig for g in groups):
        pools.mig_nodes, pools.layouts_by_gpu = _mig_pool(c, why)
    if mps_frac:
        pools.frac_nodes = _mps_pool(c, pools.mig_nodes, why)
    _cpu_pools(c, pools, why)
    b = Builder(base, groups)
    _add_groups(b, c, pools, {g["name"]: g for g in base["node_groups"]})
    cpu_order = _cpu_job_order(b, c, pools, why)
    routes = _routes(b.members, pools.heavy, isolate, mig_all, knobs.overflow, cpu_order, pools.light, knobs.frac_heavy)
    if knobs.mig_per_job:  # users name the per-job tier and slice: no route rounds shares to it
        routes = [r for r in routes if r.get("round_to") != "mig"]
    default = next((t for t in ("gpu", "frac", "cpu") if t in b.members), next(iter(b.members)))
    why += b.split_by_mps_weight(site.policy.billing)
    raw = b.policy(routes, default)
    why += remap_aliases(raw, site)
    return raw, why


def _take_nodes(pool: dict[int, int], groups: list[GroupInfo], order: list[GroupInfo], gpus_wanted: int) -> int:
    """Move whole nodes of ``order``'s groups into ``pool`` ({group index: nodes}) until it holds ``gpus_wanted``."""
    got = 0
    for g in order:
        if got >= gpus_wanted:
            break
        free = len(g.nodes) - pool.get(g.index, 0)
        n = min(free, math.ceil((gpus_wanted - got) / g.gpus))
        if n > 0:
            pool[g.index] = pool.get(g.index, 0) + n
            got += n * g.gpus
    return got


def _mig_model(c: _Inputs, why: list[str]) -> list[GroupInfo]:
    """The MIG-capable groups of the one model that holds the MIG pool.

    Layouts are packed from one model's profiles: the MIG-capable model with the most GPUs (first listed among
    equals) holds the pool; another model's GPUs could not take those layouts (an A30 has no 3g.20gb).
    """
    mig_groups = [g for g in c.groups if g.mig]
    per_model: Counter[str] = Counter()
    for g in mig_groups:
        per_model[g.model] += g.gpus * len(g.nodes)
    top = max(per_model.values())
    chosen = next(g.model for g in mig_groups if per_model[g.model] == top)
    if len(per_model) > 1:
        why.append(
            f"MIG pool on {chosen} only (the MIG-capable model with the most GPUs; slices are one "
            f"model's profiles): not on {', '.join(m for m in per_model if m != chosen)}"
        )
    return [g for g in mig_groups if g.model == chosen]


def _mig_pool(c: _Inputs, why: list[str]) -> tuple[dict[int, int], list[tuple[str, ...]]]:
    """MIG slices for the isolated (or all) fractional demand: (nodes taken per group, each GPU's layout)."""
    mig_groups = _mig_model(c, why)
    model = c.site.groups[mig_groups[0].index].model
    knobs, mig_frac = c.knobs, c.mig_frac
    # isolated classes get a slice even when only the whole-GPU one covers them; with every share on MIG
    # (mig_all) such a share takes a whole GPU from the whole-GPU pool, where whole-GPU jobs can use it too
    allowed = knobs.mig_types or (compact_types(model) if knobs.mig_compact else ())
    need, whole_from_mig = slices_needed(
        model,
        scaled_counts(mig_frac, c.scale * HEADROOM * knobs.mig_factor),
        whole_slice=not c.mig_all,
        allowed=allowed,
    )
    layouts_by_gpu = pack(model, need, allowed, knobs.mig_fill or knobs.mig_compact)
    # slices strand when their node runs out of CPUs first: CPU-rich nodes first
    cpu_need = (
        sum(cls.cpus * n for cls, n in c.demand.counts.items() if cls.kind == "fraction" and cls.gpu_milli in mig_frac)
        * c.scale
        / max(1, len(layouts_by_gpu))
    )
    order = sorted(mig_groups, key=lambda g: (g.cpus_per_gpu < MIG_CPUS * cpu_need, -g.gpus, -g.cpus_per_gpu, g.index))
    mig_nodes: dict[int, int] = {}
    _take_nodes(mig_nodes, c.groups, order, len(layouts_by_gpu))
    if knobs.mig_per_job:
        why.append(_per_job_line(c, mig_groups, len(layouts_by_gpu)))
    elif allowed:
        why.append(
            f"MIG slice types offered: {', '.join(allowed)} (and the whole GPU's)"
            + (
                " (one per compute size, the least memory: a memory-heavy slice strands compute slices)"
                if not knobs.mig_types
                else ""
            )
        )
    why.append(
        f"MIG: {sum(need.values())} slices ({', '.join(f'{n} x {p}' for p, n in sorted(need.items()))}) for "
        f"{sum(mig_frac.values())} fractional jobs ({', '.join(sorted({q for q in c.isolate}) or ['all'])}), packed "
        f"into {len(layouts_by_gpu)} GPUs"
        + (f"; {whole_from_mig} larger shares take whole GPUs" if whole_from_mig else "")
    )
    return mig_nodes, layouts_by_gpu


def _per_job_line(c: _Inputs, mig_groups: list[GroupInfo], gpus: int) -> str:
    """The report line of a per-job MIG pool: the profiles and carrier weights its GPUs get (the model's
    default: ``policy.perjob``), and how users reach it."""
    model = c.site.groups[mig_groups[0].index].model
    weights = default_weights(model)
    if weights is None:
        raise ValueError(f"{model.name}: no set of its MIG profiles has exact carrier weights, so no per-job MIG")
    share = Share(Mode.MIG, per_job=True, profiles=weights.profiles, weights=weights.weights, capacity=weights.capacity)
    return (
        f"MIG per job on the pool's nodes ({gpus} GPUs' worth of packed layouts): each job's slice is made for it, "
        f"{share.text}; users ask for a slice on tier mig (--partition=mig --gres=gpu:<slice>:1), as the "
        "submission filter rounds mps shares to fixed slices only"
    )


def _mps_pool(c: _Inputs, mig_nodes: dict[int, int], why: list[str]) -> dict[int, int]:
    """The MPS pool for the shared fractional demand: nodes taken per group, outside the MIG pool's."""
    groups, demand = c.groups, c.demand
    est = pack_estimate(scaled_counts(c.mps_frac, c.scale))
    want = math.ceil(est * c.knobs.frac_factor * HEADROOM)
    # many GPUs per node (shares pack inside a node); enough CPUs per GPU; then the tightest ('fit') or the
    # most CPUs per GPU ('cpus')
    sign = -1 if c.knobs.frac_nodes == "cpus" else 1
    order = sorted(
        (g for g in groups),
        key=lambda g: (-g.gpus, -(g.cpus_per_gpu >= demand.cpus_per_gpu()), sign * g.cpus_per_gpu, g.index),
    )
    poor = cpu_rich(groups, demand, mig_nodes)
    rich_first = [g for g in order if g.index not in poor]
    leftover = {g.index: len(g.nodes) - mig_nodes.get(g.index, 0) for g in groups}
    frac_nodes: dict[int, int] = {}
    frac_gpus = _take_nodes(frac_nodes, groups, [g for g in rich_first if leftover[g.index] > 0], want) if want else 0
    frac_nodes = {i: min(n, leftover[i]) for i, n in frac_nodes.items()}
    share = sum(m * n for m, n in c.mps_frac.items()) / GPU_MILLI
    why.append(
        f"MPS ({c.units} units per GPU): {sum(c.mps_frac.values())} fractional jobs asking {share:.1f} GPUs pack into "
        f"about {est} GPUs (first fit, arrival order); pool 'frac' gets {frac_gpus} GPUs"
    )
    return frac_nodes


def _cpu_pools(c: _Inputs, pools: _Pools, why: list[str]) -> None:
    """The CPU-rich groups (pool 'cpu') and the CPU-poor ones (pool 'lean'), with their CPU bounds."""
    groups, demand, knobs = c.groups, c.demand, c.knobs
    pools.rich = cpu_rich(groups, demand, pools.mig_nodes)
    if knobs.heavy_cpus is not None:
        pools.heavy = knobs.heavy_cpus
    elif knobs.heavy_per_gpu is not None:
        pools.heavy = max(1, math.floor(knobs.heavy_per_gpu * bulk_cpus_per_gpu(groups)))
    else:
        pools.heavy = heavy_threshold(demand, groups, pools.rich)
    if pools.rich:
        why.append(
            f"CPU-rich nodes ({', '.join(g.name for g in groups if g.index in pools.rich)}: >= {CPU_RICH:g} x the "
            f"{demand.cpus_per_gpu():.1f} CPUs per GPU that GPU jobs ask): pool 'cpu' takes CPU-only jobs and "
            f"single-GPU jobs asking more than {pools.heavy} CPUs"
        )
    if knobs.lean:
        pools.lean, pools.light = lean_groups(groups, demand, pools.rich, pools.mig_nodes, pools.frac_nodes)
    if pools.lean:
        why.append(
            f"CPU-poor nodes ({', '.join(g.name for g in groups if g.index in pools.lean)}: fewer than the "
            f"{demand.cpus_per_gpu():.1f} CPUs per GPU that GPU jobs ask): pool 'lean' takes single-GPU jobs asking "
            f"at most {pools.light} CPUs first, other GPU jobs only when their own pools are full"
        )


def _add_groups(b: Builder, c: _Inputs, pools: _Pools, specs: dict[str, dict]) -> None:
    """Each group's nodes in slurm.conf order: its MIG-pool nodes (split by layout), MPS-pool nodes, the rest."""
    layout_iter = iter(pools.layouts_by_gpu)
    for g in c.groups:
        spec = specs[g.name]
        names = list(g.nodes)
        n_mig, n_frac = pools.mig_nodes.get(g.index, 0), pools.frac_nodes.get(g.index, 0)
        mig_part, frac_part, rest = names[:n_mig], names[n_mig : n_mig + n_frac], names[n_mig + n_frac :]
        if mig_part and c.knobs.mig_per_job:
            for part in split_group(spec, [("mig", mig_part, per_job_sharing(g.gpus))]):
                b.add(part, "mig", 10, len(mig_part), g.model)
        elif mig_part:
            _add_mig_part(b, c.site, g, spec, mig_part, layout_iter)
        mode = mps_sharing(c.units, g.gpus) if c.mps_frac else [{"gpus": gpu_range(g.gpus), **Share().to_entry()}]
        tier = "cpu" if g.index in pools.rich else "lean" if g.index in pools.lean else "gpu"
        if c.knobs.frac_weights == "node" and frac_part:
            # one weight per node: Slurm then fills the pool node by node (first fit), not best fit on idle CPUs
            for k, node in enumerate(frac_part):
                for part in split_group(spec, [(f"frac{k}", [node], mode)]):
                    b.add(part, "frac", 20 + len(b.out_groups), 1, g.model)
        else:
            for part in split_group(spec, [("frac", frac_part, mode)]):
                b.add(part, "frac", 20, len(frac_part), g.model)
        for part in split_group(spec, [("", rest, mode)]):
            b.add(part, tier, _weight(g, c.knobs.weights), len(rest), g.model)


def _add_mig_part(b: Builder, site: Site, g: GroupInfo, spec: dict, mig_part: list[str], layout_iter) -> None:
    """A group's MIG-pool nodes: nodes of one group share one sharing list, so they are split by node when
    layouts differ (a GPU the packed layouts did not fill gets the whole-GPU slice)."""
    by_layout: dict[tuple, list[str]] = {}
    for node in mig_part:
        lay = tuple(next(layout_iter, _whole(site, g)) for _ in range(g.gpus))
        by_layout.setdefault(lay, []).append(node)
    for k, (lay, nodes) in enumerate(by_layout.items()):
        for part in split_group(spec, [(f"mig{k}", nodes, mig_sharing(list(lay), g.gpus))]):
            b.add(part, "mig", 10, len(nodes), g.model)


def _cpu_job_order(b: Builder, c: _Inputs, pools: _Pools, why: list[str]) -> list[str]:
    """The pools CPU-only jobs start in, in order (the CPUs the GPU jobs leave them), and the CPU-heavy shares'."""
    demand, knobs, lean = c.demand, c.knobs, pools.lean
    how = knobs.cpu_jobs
    if how == "auto":
        # with a MIG pool (on CPU-rich nodes), CPU-only jobs that take a MIG node's CPUs strand its free slices: the
        # CPU-rich pool goes first when it can hold a third of their CPUs, else the pools by CPUs left
        left = dict(spare_cpus(b.cpus, demand, c.scale, c.mig_frac, pools.heavy, bool(pools.rich), "spare", b.gpus))
        need = demand.cpus_by_kind()["cpu"] * c.scale
        how = "rich" if "mig" not in b.members else "first" if 3 * left.get("cpu", 0) >= need else "spare"
    spare = spare_cpus(b.cpus, demand, c.scale, c.mig_frac, pools.heavy, bool(pools.rich), how, b.gpus)
    spare = [x for x in spare if x[0] != "lean"]
    if spare:
        why.append(
            "CPU-only jobs go to these pools in this order (the CPUs their GPU jobs leave): "
            + ", ".join(f"{t} ({n:.0f} CPUs)" for t, n in spare)
            + (", then lean" if lean else "")
        )
    # CPU-only jobs would take the CPUs that keep a CPU-poor node's GPUs usable: pool 'lean' last
    cpu_order = [t for t, _ in spare] + (["lean"] if lean and spare else [])
    if knobs.cpu_order:
        cpu_order = [t for t in knobs.cpu_order if t in b.members]
        why.append(
            f"CPU-only jobs start only in pool(s) {', '.join(cpu_order)}: when those are full they wait "
            f"rather than take the CPUs the GPU pools' jobs need"
        )
    if knobs.frac_heavy is not None and "cpu" in b.members and "frac" in b.members:
        why.append(
            f"fractional jobs asking more than {knobs.frac_heavy} CPUs start in pool 'cpu' (its spare CPUs), "
            f"so the shares of the other nodes keep CPUs to run on"
        )
    return cpu_order


def _whole(site: Site, g: GroupInfo) -> tuple[str, ...]:
    """The layout of a MIG-pool GPU the packed layouts did not fill: one slice of the whole GPU."""
    whole = whole_profile(site.groups[g.index].model)
    return (whole.name,) if whole else ()


def _weight(g: GroupInfo, scheme: str) -> int:
    """'gpus': fewer GPUs per node first, so whole-GPU jobs fill small nodes and leave the big ones for
    multi-GPU jobs; 'cpus': fewer CPUs per GPU first, so jobs that ask few CPUs use the CPU-poor nodes
    that others cannot; 'flat': one weight (slurm.conf order, best fit on idle CPUs)."""
    if scheme == "gpus":
        return 100 + g.gpus
    if scheme == "cpus":
        return 100 + min(int(g.cpus_per_gpu), 900)
    return 100


def _routes(
    members: dict[str, list[str]],
    heavy: int,
    isolate,
    mig_all: bool,
    overflow: bool,
    cpu_order: Sequence[str] = (),
    light: int = 0,
    frac_heavy: int | None = None,
) -> list[dict]:
    has = set(members)

    def tiers(*names: str) -> list[str]:
        got = [n for n in names if n in has]
        return got if overflow else got[:1]

    routes: list[dict] = []
    if "mig" in has:
        # a share no slice covers is rounded to a whole GPU: the whole-GPU tier must be on the route
        match = {"gres": "mps"} if mig_all else {"gres": "mps", "qos": list(isolate)}
        # isolated: every share has a slice (up to the whole-GPU one), the class stays on MIG; all shares on MIG:
        # a share no partial slice covers is rounded to a whole GPU of the whole-GPU pool
        whole = [] if not mig_all else [n for n in ("gpu", "frac", "cpu") if n in has][:1]
        routes.append({"match": match, "tiers": ["mig", *whole], "round_to": "mig"})
    if frac_heavy is not None and "cpu" in has and "frac" in has:
        routes.append({"match": {"gres": "mps", "min_cpus": frac_heavy + 1}, "tiers": tiers("cpu", "frac", "gpu")})
    if "frac" in has:
        routes.append({"match": {"gres": "mps"}, "tiers": tiers("frac", "gpu", "cpu")})
    if cpu_order:
        routes.append({"match": {"gres": "none"}, "tiers": list(cpu_order) if overflow else list(cpu_order)[:1]})
    if "cpu" in has:
        routes.append(
            {
                "match": {"gres": "gpu", "max_gpus": 1, "min_cpus": heavy + 1},
                "tiers": tiers("cpu", "gpu", "frac", "lean"),
            }
        )
    if "lean" in has:
        # single-GPU jobs that fit a CPU-poor node's CPUs per GPU go there first; heavier ones last
        routes.append(
            {
                "match": {"gres": "gpu", "max_gpus": 1, "min_cpus": light + 1},
                "tiers": tiers("gpu", "cpu", "frac", "lean"),
            }
        )
        routes.append({"match": {"gres": "gpu", "max_gpus": 1}, "tiers": tiers("lean", "gpu", "cpu", "frac")})
    routes.append({"match": {"gres": "gpu"}, "tiers": tiers("gpu", "cpu", "frac", "lean")})
    return [r for r in routes if r["tiers"]]
