"""The validated, resolved site: what every renderer and later layer reads.

Everything here is derived from the policy and the hardware catalogue; nothing
is typed twice. Built by ``policy.load`` only after every rule has passed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from ..hardware import GpuModel
from ..slurmversion import SlurmVersion
from .model import NodeGroup, Policy, Tier
from .share import Mode, Share


@dataclass(frozen=True)
class GpuSlot:
    """One physical GPU position (index) on every node of a group, its model, and how it is shared."""

    index: int
    model: GpuModel
    share: Share = Share()

    @property
    def mode(self) -> Mode:
        return self.share.mode

    @property
    def layout(self) -> tuple[str, ...]:
        return self.share.layout

    @property
    def replicas(self) -> int:
        return self.share.replicas

    @property
    def units(self) -> int:
        return self.share.units

    @property
    def compute_mode(self) -> str:
        return self.share.compute_mode

    @property
    def slurm_type(self) -> str:
        """The whole GPU's Slurm type (a MIG GPU's: the model's; its instances have their own)."""
        return self.share.gpu_type(self.model.slurm_type)

    @property
    def device(self) -> str:
        # Assumes the GPU's device minor equals its index (true unless a site
        # renumbers devices); the node runtime checks minors against NVML.
        return f"/dev/nvidia{self.index}"

    def mig_types(self) -> tuple[str, ...]:
        return tuple(self.model.mig_slurm_type(p) for p in self.layout)

    def slice_types(self) -> dict[str, int]:
        """Per-job MIG: the slice types users ask for (the fixed MIG types, ``gpu:<type>``) and each one's carrier
        shards; {} for any other GPU."""
        share = self.share
        if not share.is_per_job_mig:
            return {}
        return {self.model.mig_slurm_type(p): w for p, w in zip(share.profiles, share.weights, strict=True)}

    def gres(self) -> tuple[tuple[str, str, int], ...]:
        """(name, type, count) of what this GPU gives its node (``Share.gres``)."""
        return self.share.gres(self.model.slurm_type, self.model.mig_slurm_type)


@dataclass(frozen=True)
class Group:
    spec: NodeGroup
    nodes: tuple[str, ...]
    hostlist: str
    model: GpuModel
    gpus: tuple[GpuSlot, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def model_feature(self) -> str:
        """The node feature that names the group's GPU model: the model's Slurm type (``--constraint=a30|l40s``)."""
        return self.model.slurm_type

    @cached_property
    def features(self) -> tuple[str, ...]:
        """slurm.conf ``Features=``: the GPU model's feature first, then the policy's own, each once."""
        return tuple(dict.fromkeys((self.model_feature, *self.spec.features)))

    @cached_property
    def gres(self) -> dict[tuple[str, str], int]:
        """GRES per node: {(name, type): count}, type '' for untyped shard/mps."""
        counts: Counter[tuple[str, str]] = Counter()
        for slot in self.gpus:
            for name, gres_type, count in slot.gres():
                counts[name, gres_type] += count
        return dict(sorted(counts.items()))

    @cached_property
    def slice_types(self) -> dict[str, int]:
        """Per-job MIG slice types users may ask for here (``gpu:<type>``), and the shards each is carried by."""
        return {t: w for slot in self.gpus for t, w in slot.slice_types().items()}

    def slots(self, mode: Mode) -> tuple[GpuSlot, ...]:
        return tuple(s for s in self.gpus if s.mode == mode)

    @property
    def exclusive_process_mps(self) -> bool:
        """An MPS GPU of the group runs in EXCLUSIVE_PROCESS: one MPS server, so one user, at a time."""
        return any(s.share.exclusive_process for s in self.gpus)


@dataclass(frozen=True)
class TierView:
    spec: Tier
    groups: tuple[Group, ...]
    billing: tuple[tuple[str, float], ...]
    is_default: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def exclusive_user(self) -> bool:
        """Partition ExclusiveUser=YES: its nodes run one user's jobs at a time (EXCLUSIVE_PROCESS MPS GPUs)."""
        return any(g.exclusive_process_mps for g in self.groups)

    @cached_property
    def hostlist(self) -> str:
        from hostlist import collect_hostlist

        return collect_hostlist([n for g in self.groups for n in g.nodes])


@dataclass(frozen=True)
class Site:
    policy: Policy
    version: SlurmVersion
    groups: tuple[Group, ...]
    tiers: tuple[TierView, ...]
    source_name: str = "policy"
    source_sha256: str = ""

    @property
    def cluster(self):
        return self.policy.cluster

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for g in self.groups for (n, t) in g.gres if n == "gpu"}))

    @cached_property
    def model_features(self) -> tuple[str, ...]:
        """The GPU model features of the site's groups, in group order, each once."""
        return tuple(dict.fromkeys(g.model_feature for g in self.groups))

    @cached_property
    def features(self) -> tuple[str, ...]:
        """Every node feature slurm.conf declares: the GPU model features first, then the policy's others."""
        return tuple(dict.fromkeys((*self.model_features, *(f for g in self.groups for f in g.features))))

    @cached_property
    def uses(self) -> frozenset[str]:
        """GRES names in use ('gpu', 'shard', 'mps')."""
        return frozenset(n for g in self.groups for (n, _t) in g.gres)

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)

    @cached_property
    def _node_index(self) -> dict[str, Group]:
        return {n: g for g in self.groups for n in g.nodes}

    def group_for_node(self, node: str) -> Group:
        """The group a Slurm node name belongs to; KeyError names the node if none does."""
        try:
            return self._node_index[node]
        except KeyError:
            raise KeyError(f"node {node!r} is in no node group of this policy") from None
