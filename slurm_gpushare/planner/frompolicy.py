"""A validated site as the simulator sees it, and pods routed through the real submission decision. Pure.

``sim_cluster`` gives the nodes in slurm.conf order with the Weight,
partitions and GRES that ``gpushare render`` writes for them. ``SubmitRouter``
(a ``sim.cluster.Router``) turns a trace pod into what a user would submit (``--gres=mps:47``,
``--gres=gpu:2``, CPUs, memory, QoS) and lets ``submit.decide`` (the code
job_submit.lua is generated beside) accept, route, round or reject it, so a
simulated Slurm places exactly what the product would let through. Where the
filter refuses an untyped request (``UNTYPED``: no one whole GPU to give it),
the modelled user does what the refusal says and names the type it gives
(``SubmitRouter.submitted``), as a user would resubmit. On a site whose shares
have no MPS GPU but a per-job MIG tier, a share is asked as the per-job slice
that covers it, on that tier (the submission filter rounds mps shares to fixed
slices only): ``--partition=<tier> --gres=gpu:<slice>:1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..hardware import GpuModel
from ..hardware.packing import covering
from ..policy import Site
from ..sim.cluster import GPU_MILLI, Pod, SimCluster, SimGpu, SimNode, SlurmRequest
from ..submit import Decision, Tables, build_tables, decide, parse_field
from ..submit.parse import Gres
from ..submit.tables import RECORD_PREFIX
from .demand import cpus_of, spec_models

# What the rendered slurm-gpushare.conf sets (templates/slurm-gpushare.conf.j2).
SELECT_FLAGS = frozenset({"CR_Core_Memory"})


def sim_gpus(group) -> tuple[SimGpu, ...]:
    out = []
    for slot in group.gpus:
        share = slot.share
        mig = slot.mig_types() if share.is_mig else ()
        slices = tuple(zip(share.profiles, share.weights, strict=True)) if share.is_per_job_mig else ()
        out.append(SimGpu(share.mode, slot.model.name, slot.slurm_type, share.shared_count, mig, slices))
    return tuple(out)


def sim_cluster(site: Site, cpu_milli: Mapping[str, int] | None = None) -> SimCluster:
    """Every node of the site in slurm.conf order (groups as listed, hostlist order within).

    ``cpu_milli``: the trace's own millicores per node name, kept for the
    paper's baselines (Slurm itself counts whole CPUs).
    """
    cpu_milli = cpu_milli or {}
    nodes = []
    for g in site.groups:
        gpus = sim_gpus(g)
        parts = tuple(t.name for t in site.tiers if any(m.name == g.name for m in t.groups))
        weight = g.spec.weight if g.spec.weight is not None else 1
        for name in g.nodes:
            nodes.append(
                SimNode(name, g.spec.cpus, g.spec.memory_mb, gpus, weight, parts, cpu_milli.get(name, 0), g.features)
            )
    tiers = tuple((t.name, t.spec.priority) for t in site.tiers)
    return SimCluster(tuple(nodes), SELECT_FLAGS, tiers)


def mps_percent_units(tables: Tables) -> int:
    """The MPS count that means one whole GPU to a user of this site (the largest mps Count; 100 without MPS)."""
    return tables.shared.get("mps", {}).get("", 0) or 100


@dataclass
class SubmitRouter:
    """Pod -> SlurmRequest through ``submit.decide``; None when the product refuses the job.

    ``refused`` counts refused jobs by violation code (a job with two
    violations counts under each) and in all ('total'), for the report.
    """

    site: Site
    tables: Tables = field(init=False)
    units: int = field(init=False)
    refused: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tables = build_tables(self.site)
        self.units = mps_percent_units(self.tables)
        self._cache: dict[tuple, tuple[SlurmRequest | None, tuple[str, ...]]] = {}
        self._per_job = None if "mps" in self.tables.shared else per_job_tier(self.site)

    def slice_of(self, pod: Pod) -> tuple[str, str] | None:
        """(tier, per-job slice type) a share is asked as on this site; None: it is asked as mps (or whole)."""
        if self._per_job is None or not pod.num_gpu or pod.gpu_milli >= GPU_MILLI:
            return None
        tier, model, profiles = self._per_job
        profile = covering(model, pod.gpu_milli, profiles)
        return (tier, model.mig_slurm_type(profile)) if profile in profiles else None

    def job(self, pod: Pod) -> dict[str, str | None]:
        """The job_submit fields a user's sbatch would send for this pod.

        A ``gpu_spec`` naming GPU models becomes ``--constraint`` over the models' node features
        ('V100M16|V100M32' -> 'v100m16|v100m32'), for whole GPUs and shares alike. A whole-GPU pod whose spec is
        one GRES type of the site (a model's type, or a MIG slice's) asks for that type, ``--gres=gpu:<type>:N``.
        """
        gres, features, partition = None, None, None
        models = spec_models(pod.gpu_spec)
        sliced = self.slice_of(pod)
        if sliced is not None:
            partition, slice_type = sliced
            gres = f"{self.tables.prefix}gpu:{slice_type}:1"
        elif pod.num_gpu and pod.gpu_milli < GPU_MILLI and self._per_job is not None:
            gres = f"{self.tables.prefix}gpu:1"  # no per-job slice covers it: a whole GPU
            features = "|".join(models) or None
        elif pod.num_gpu and pod.gpu_milli < GPU_MILLI:
            gres = f"{self.tables.prefix}mps:{math.ceil(pod.gpu_milli * self.units / GPU_MILLI)}"
            features = "|".join(models) or None
        elif pod.num_gpu and len(models) == 1 and models[0] in self.tables.gpu_types:
            gres = f"{self.tables.prefix}gpu:{models[0]}:{pod.num_gpu}"
        elif pod.num_gpu:
            gres = f"{self.tables.prefix}gpu:{pod.num_gpu}"
            features = "|".join(models) or None
        return {
            "tres_per_node": gres,
            "partition": partition,
            "qos": pod.qos.lower() or None,
            "min_cpus": str(cpus_of(pod.cpu_milli)),
            "features": features,
        }

    def __call__(self, pod: Pod) -> SlurmRequest | None:
        key = self._key(pod)
        if key not in self._cache:
            self._cache[key] = self._route(pod)
        found, codes = self._cache[key]
        if found is None:
            for code in (*codes, "total"):
                self.refused[code] = self.refused.get(code, 0) + 1
        return found

    def refusal(self, pod: Pod) -> tuple[str, ...]:
        """Why the product refuses this pod's job at submission: its violation codes (() when accepted)."""
        key = self._key(pod)
        if key not in self._cache:
            self._cache[key] = self._route(pod)
        return self._cache[key][1]

    @staticmethod
    def _key(pod: Pod) -> tuple:
        return (pod.num_gpu, pod.gpu_milli if pod.num_gpu else 0, pod.cpu_milli, pod.memory_mib, pod.qos, pod.gpu_spec)

    def submitted(self, pod: Pod) -> dict[str, str | None]:
        """What the modelled user finally submits: ``job(pod)``, or where the filter refuses its untyped request
        (UNTYPED), the same request with the GPU type the refusal names (``--gres=gpu:<type>:N``, the constraint
        kept), as the user resubmits it."""
        return self._decided(pod)[0]

    def _decided(self, pod: Pod) -> tuple[dict[str, str | None], Decision]:
        job = self.job(pod)
        decision = decide(self.tables, job)
        named = {v.typed for v in decision.violations}
        if decision.accepted or len(named) != 1 or not named <= set(self.tables.gpu_types):
            return job, decision
        job = {**job, "tres_per_node": f"{self.tables.prefix}gpu:{named.pop()}:{pod.num_gpu}"}
        return job, decide(self.tables, job)

    def _route(self, pod: Pod) -> tuple[SlurmRequest | None, tuple[str, ...]]:
        job, decision = self._decided(pod)
        if not decision.accepted:
            return None, tuple(decision.codes)
        partitions = tuple((decision.partition or job["partition"] or self.tables.default_tier.name).split(","))
        text = decision.fields.get("tres_per_node", job["tres_per_node"])
        gres = [e for e in parse_field("tres_per_node", text) if isinstance(e, Gres)] if text else []
        cpus, mem = cpus_of(pod.cpu_milli), pod.memory_mib
        if not gres:
            return SlurmRequest(partitions, cpus, mem), ()
        g = gres[0]
        profile = decision.extra[len(RECORD_PREFIX) :] if decision.extra else ""
        return SlurmRequest(partitions, cpus, mem, g.name, g.type, g.count, job["features"] or "", profile), ()


def per_job_tier(site: Site) -> tuple[str, GpuModel, tuple[str, ...]] | None:
    """The first tier with per-job MIG GPUs, their model and profiles (None: the site has none)."""
    for tier in site.tiers:
        for g in tier.groups:
            for slot in g.gpus:
                if slot.share.is_per_job_mig:
                    return tier.name, slot.model, slot.share.profiles
    return None
