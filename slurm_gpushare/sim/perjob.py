"""Per-job MIG GPUs in the simulator: the slice the prolog places on the GPU Slurm picked. Pure.

A per-job MIG GPU is declared to Slurm as one gpu record and ``capacity``
carrier shards (``policy.perjob``); a job asking for a slice of profile p
takes ``weight(p)`` shards of one GPU, the GPU Slurm's own pick gives it
(first fit, or least loaded with LL_SHARED_GRES: ``slurmmodel``). Slurm never
sees the instances: the prolog then places the slice on that GPU
(``hardware.migplace.choose``, its default rule unless told otherwise, no reuse:
the epilog destroys each instance), and a slice with no legal placement there
is refused and the job requeued. ``Carrier`` is one per-job GPU kind (model,
profiles, weights, count, placement rule); ``Slices`` holds the instances of
each per-job GPU of a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..hardware import get_model
from ..hardware.migplace import DEFAULT_RULE, Instance, choose

GpuKey = tuple  # a per-job GPU: (node index, GPU index) in the Slurm model, (node name, GPU index) in a churn replay


@dataclass(frozen=True)
class Carrier:
    """A per-job GPU kind: ``slices`` are (profile, carrier weight) in the policy's order, ``capacity`` the
    shard Count per GPU, ``rule`` the prolog's placement rule (hardware.migplace.RULES)."""

    model: str
    slices: tuple[tuple[str, int], ...]
    capacity: int
    rule: str = DEFAULT_RULE

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.slices)

    def weight(self, profile: str) -> int:
        """The shards a slice of ``profile`` takes; KeyError naming the allowed profiles for any other."""
        for name, w in self.slices:
            if name == profile:
                return w
        raise KeyError(f"{profile} is not a per-job profile of this {self.model} ({', '.join(self.profiles)})")

    def place(self, instances: tuple[Instance, ...], profile: str) -> int | None:
        """The start the prolog gives a new ``profile`` slice beside ``instances`` (sorted); None: nowhere."""
        return _start(self.model, profile, instances, self.profiles, self.rule)


@lru_cache(maxsize=100_000)
def _start(model: str, profile: str, instances: tuple[Instance, ...], allowed: tuple[str, ...], rule: str):
    got = choose(get_model(model), profile, list(instances), allowed=allowed, rule=rule)
    return None if got is None else got.start


@dataclass
class Slices:
    """The instances on each per-job GPU (by ``GpuKey``) and how many
    slices were refused for want of a legal placement."""

    on: dict[GpuKey, list[Instance]] = field(default_factory=dict)
    refused: int = 0

    def place(self, carrier: Carrier, gpu: GpuKey, profile: str) -> Instance | None:
        """Place a ``profile`` slice on ``gpu``; None (and counted) when it has no legal placement there."""
        held = self.on.setdefault(gpu, [])
        start = carrier.place(tuple(sorted(held)), profile)
        if start is None:
            self.refused += 1
            return None
        instance = (profile, start)
        held.append(instance)
        return instance

    def release(self, gpu: GpuKey, instance: Instance) -> None:
        """The epilog destroyed ``instance`` on ``gpu``."""
        self.on[gpu].remove(instance)
