"""What the placement simulator places and where: plain, frozen data. Pure.

Shared by the planner (which builds a ``SimCluster`` from a validated site
policy), the Slurm placement model and the paper's baseline policies (FGD,
BestFit, Random), so every policy in one run sees the same cluster and the
same arrivals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# one whole GPU, as the trace counts it (the catalogue's unit for a share: hardware/packing.py)
from ..hardware.packing import GPU_MILLI as GPU_MILLI
from ..policy.share import Mode


@dataclass(frozen=True)
class SimGpu:
    """One physical GPU of a node, as the rendered gres.conf declares it.

    ``mode`` is the policy's sharing mode. ``gres_type`` is the Slurm GRES type
    of the whole GPU ('' when untyped). ``units`` is the mps Count or shard
    replicas of this GPU (0 otherwise). ``mig`` lists the MIG instances' GRES
    types in gres.conf line order, which is Slurm's GRES index order.
    ``slices``: a per-job MIG GPU's profiles and their carrier weights
    (profile, shards), ``units`` its shard Count: Slurm sees the whole GPU
    and its shards, the prolog makes an instance per job (``sim.perjob``).
    """

    mode: Mode
    model: str
    gres_type: str = ""
    units: int = 0
    mig: tuple[str, ...] = ()
    slices: tuple[tuple[str, int], ...] = ()

    @property
    def per_job(self) -> bool:
        return bool(self.slices)


@dataclass(frozen=True)
class SimNode:
    """One Slurm node: CPUs and RealMemory as slurm.conf declares them, its Weight and partitions."""

    name: str
    cpus: int
    memory_mib: int
    gpus: tuple[SimGpu, ...]
    weight: int = 1
    partitions: tuple[str, ...] = ()
    cpu_milli: int = 0  # the trace's own millicores, for the paper's baselines (0: cpus * 1000)
    features: tuple[str, ...] = ()  # slurm.conf Features: the GPU model's feature, then the policy's own

    @property
    def milli(self) -> int:
        return self.cpu_milli or self.cpus * 1000


@dataclass(frozen=True)
class SimCluster:
    """Nodes in slurm.conf order, the SelectTypeParameters flags that change GRES choice, partitions' PriorityTier.

    slurmctld 24.11 does not keep slurm.conf's order: it sorts its node table
    by name in natural order (``strnatcmp``) unless a topology plugin ranks
    the nodes (src/slurmctld/read_config.c ``_sort_node_record_table_ptr``);
    the Slurm model applies that sort. ``partition_tiers`` gives each
    partition's PriorityTier (1 when absent): a job listing several
    partitions is tried in them by PriorityTier, highest first
    (src/slurmctld/partition_mgr.c ``get_part_list`` sorts the job's list with
    ``priority_sort_part_tier``).
    """

    nodes: tuple[SimNode, ...]
    select_flags: frozenset[str] = frozenset()
    partition_tiers: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


@dataclass(frozen=True)
class Pod:
    """One arrival as the trace (openb format) gives it. ``gpu_milli`` is per GPU; 1000 is whole."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    qos: str = ""
    gpu_spec: str = ""

    @property
    def gpu_demand_milli(self) -> int:
        """What the paper's metric counts for this pod when placed: num_gpu x gpu_milli."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True)
class SlurmRequest:
    """What reaches slurmctld for one pod after sbatch and job_submit: partitions, CPUs, memory, one GRES.

    ``gres`` is 'gpu', 'mps', 'shard' or '' (no GRES); ``gres_type`` '' when untyped;
    ``count`` per node (the jobs here are single-node); ``constraint`` the job's
    --constraint over node features ('' for none), e.g. 'v100m16|v100m32';
    ``mig_profile`` the per-job MIG profile the submission filter recorded for
    the prolog (its shards are ``count``), '' for none.
    """

    partitions: tuple[str, ...]
    cpus: int
    memory_mib: int
    gres: str = ""
    gres_type: str = ""
    count: int = 0
    constraint: str = ""
    mig_profile: str = ""


Router = Callable[[Pod], "SlurmRequest | None"]
"""The submission step: what sbatch + job_submit make of a pod (None: rejected at submission).

The placement simulator's Slurm policy (slurmmodel.SlurmPolicy) takes one; the
stand-in for S1 is slurmmodel.uniform_router, the planner supplies the
product's real submission decision.
"""
