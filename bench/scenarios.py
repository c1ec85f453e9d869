"""The issue's placement scenarios as policies: what the bench replays for Slurm. Pure.

For a trace cluster (``trace.load_cluster``) and its pods:

- S1: the trace's nodes and GPUs as they are; every GPU runs MPS (100 units)
  so it can be taken whole (``--gres=gpu:N``) or in shares (``--gres=mps:47``).
  ``uniform`` is what an admin writes today (one node group per kind of node,
  equal weights, one tier); ``planned`` is what ``plan.plan`` makes of it
  from the trace's demand.
- S2: the same nodes with every GPU an A100-SXM4-40GB; a fractional request is
  rounded up to the smallest MIG slice covering it (submission.routes,
  ``round_to: mig``); the planner chooses the static layouts.
- S3: as S2, but only latency-sensitive (QoS LS) fractional jobs get MIG
  slices; best-effort ones share GPUs through MPS. The planner chooses how
  many GPUs run each mode and which layouts.

Each builder returns ``(SimCluster, SubmitRouter, Site)``: the cluster as the
rendered slurm.conf/gres.conf declare it, the router that sends every pod
through the product's submission decision, and the validated site (its
policy is what ``gpushare render`` would be given).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hostlist import collect_hostlist, expand_hostlist

from slurm_gpushare.planner.demand import Demand, from_pods
from slurm_gpushare.planner.evaluate import evaluator
from slurm_gpushare.planner.frompolicy import SubmitRouter, sim_cluster
from slurm_gpushare.planner.plan import PlanResult, plan
from slurm_gpushare.planner.search import BUDGET_S
from slurm_gpushare.policy import Site, build_site
from slurm_gpushare.policy.groups import gpus_value
from slurm_gpushare.sim.cluster import Pod, SimCluster

MIG_MODEL = "A100-SXM4-40GB"

# The trace's GPU models are not in the catalogue; their memory is the
# public figure for the model (G2 and G3 are anonymised in the trace: their
# memory is not published, 16 GiB is a placeholder; the metric ignores it).
TRACE_GPU_MEMORY_MB = {
    "A10": 24576,
    "G2": 16384,
    "G3": 16384,
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
}


def node_kinds(cluster: SimCluster, model: str | None = None) -> list[tuple[tuple, list[str]]]:
    """Nodes grouped by (GPU model, GPUs, CPUs, memory), kinds in order of first appearance."""
    kinds: dict[tuple, list[str]] = {}
    for n in cluster.nodes:
        gpu_model = model or (n.gpus[0].model if n.gpus else "")
        kinds.setdefault((gpu_model, len(n.gpus), n.cpus, n.memory_mib), []).append(n.name)
    return list(kinds.items())


def group_name(model: str, gpus: int, cpus: int, memory_mib: int) -> str:
    return f"{model.lower()}-{gpus}g-{cpus}c-{memory_mib // 1024}g".replace("_", "-")


def trace_policy(cluster: SimCluster, *, model: str | None = None, mode: str = "mps", units: int = 100) -> dict:
    """The uniform policy an admin writes for this cluster: one node group per kind of node, every GPU alike.

    ``model`` replaces every GPU's model (S2/S3's A100 what-if). ``mode``
    'mps' gives each GPU ``units`` MPS units; 'exclusive' shares nothing.
    """
    groups = []
    used_models: set[str] = set()
    for (gpu_model, gpus, cpus, mem), names in node_kinds(cluster, model):
        if not gpus:
            continue  # a node without GPUs is not a GPU node group (the trace has none)
        used_models.add(gpu_model)
        sharing = [
            {"gpus": f"0-{gpus - 1}" if gpus > 1 else 0, "mode": mode, **({"units": units} if mode == "mps" else {})}
        ]
        groups.append(
            {
                "name": group_name(gpu_model, gpus, cpus, mem),
                "nodes": collect_hostlist(names),
                "gpu": {"model": gpu_model, "count": gpus},
                "cpus": cpus,
                "memory_mb": mem,
                "sharing": sharing,
            }
        )
    declared = [
        {"name": m, "memory_mb": TRACE_GPU_MEMORY_MB[m]} for m in sorted(used_models) if m in TRACE_GPU_MEMORY_MB
    ]
    raw = {
        "version": 1,
        "cluster": {"name": "openb", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": groups,
        "tiers": [{"name": "main", "node_groups": [g["name"] for g in groups], "default": True}],
    }
    if declared:
        raw["gpu_models"] = declared
    return raw


def cpu_milli_of(cluster: SimCluster) -> dict[str, int]:
    return {n.name: n.cpu_milli for n in cluster.nodes if n.cpu_milli}


def built(raw: dict, cluster: SimCluster, source: str) -> tuple[SimCluster, SubmitRouter, Site]:
    site = build_site(raw, source)
    return sim_cluster(site, cpu_milli_of(cluster)), SubmitRouter(site), site


def uniform(cluster: SimCluster, scenario: str = "S1") -> tuple[SimCluster, SubmitRouter, Site]:
    """The admin's uniform guess for the scenario (``uniform_raw``), as the simulator sees it."""
    return built(uniform_raw(cluster, scenario), cluster, f"uniform-{scenario}")


def uniform_raw(cluster: SimCluster, scenario: str = "S1") -> dict:
    """The admin's uniform guess per scenario, without looking at the workload.

    S1: every GPU mps (100 units), one tier, equal weights. S2: half the nodes
    of each kind (rounded up) run every A100 in the balanced MIG layout
    (3g.20gb, 2g.10gb, 2 x 1g.5gb) in tier 'mig', the others are exclusive in
    the default tier 'gpu'; every mps share is rounded to a slice (a share no
    slice covers takes a whole GPU). S3: the same split, the other half runs
    MPS, and only QoS LS shares are rounded to slices.
    """
    if scenario == "S1":
        return trace_policy(cluster)
    if scenario not in ("S2", "S3"):
        raise ValueError(f"unknown scenario {scenario!r}; accepted: S1, S2, S3")
    raw = trace_policy(cluster, model=MIG_MODEL, mode="exclusive" if scenario == "S2" else "mps")
    groups, mig, whole = [], [], []
    for g in raw["node_groups"]:
        nodes = expand_hostlist(g["nodes"])
        half = (len(nodes) + 1) // 2
        m = {
            **g,
            "name": g["name"] + "-mig",
            "nodes": collect_hostlist(nodes[:half]),
            "sharing": [{"gpus": gpus_value(range(0, g["gpu"]["count"])), "mode": "mig", "layout": "all-balanced"}],
        }
        groups.append(m)
        mig.append(m["name"])
        if nodes[half:]:
            groups.append({**g, "nodes": collect_hostlist(nodes[half:])})
            whole.append(g["name"])
    raw["node_groups"] = groups
    raw["tiers"] = [{"name": "gpu", "node_groups": whole, "default": True}, {"name": "mig", "node_groups": mig}]
    match = {"gres": "mps", **({"qos": ["LS"]} if scenario == "S3" else {})}
    raw["submission"] = {"routes": [{"match": match, "tiers": ["mig", "gpu"], "round_to": "mig"}]}
    return raw


def planned(
    cluster: SimCluster,
    pods: Sequence[Pod],
    scenario: str = "S1",
    evaluate: Callable[[dict], float] | None | str = "auto",
    mig_types: Sequence[str] = (),
) -> tuple[SimCluster, SubmitRouter, Site]:
    """The planner's policy for the scenario, from the demand of ``pods``, as `gpushare plan` makes it.

    ``evaluate`` 'auto': score the candidates as the CLI does (the Slurm model on
    arrivals sampled from the demand, seed 7, never a benchmark seed); None: the
    demand model's sizes, unscored. ``mig_types``: see ``plan.plan``.
    """
    result = plan_for(cluster, pods, scenario, evaluate, mig_types)
    return built(result.policy, cluster, f"planned-{scenario}")


def uniform_mig_types(cluster: SimCluster, scenario: str = "S2") -> tuple[str, ...]:
    """The MIG slice types of the uniform policy's layouts (S2/S3), read off its validated site."""
    _sim, _router, site = uniform(cluster, scenario)
    return tuple(sorted({p for g in site.groups for slot in g.gpus if slot.mode == "mig" for p in slot.layout}))


def plan_for(
    cluster: SimCluster,
    pods: Sequence[Pod],
    scenario: str = "S1",
    evaluate: Callable[[dict], float] | None | str = None,
    mig_types: Sequence[str] = (),
) -> PlanResult:
    demand: Demand = from_pods(pods, "trace")
    if evaluate == "auto":
        evaluate = evaluator(demand)
    base = uniform_raw(cluster, "S1") if scenario == "S1" else trace_policy(cluster, model=MIG_MODEL, mode="exclusive")
    isolate = ("LS",) if scenario == "S3" else ()
    mig_all = scenario == "S2"
    # the budget `gpushare plan` has by default, so the bench measures the plan the command makes
    return plan(
        base,
        demand,
        isolate_qos=isolate,
        mig_fractions=mig_all,
        evaluate=evaluate,
        mig_types=mig_types,
        budget_s=BUDGET_S if evaluate is not None else None,
    )
