"""GPU state as small integer codes with lookup tables, for the paper's policies (FGD, BestFit, Random). Pure.

The paper's scheduler sees a GPU as "milli left" (0..1000). Under MIG a GPU
is instead the set of instances placed on it so far, at fixed memory-slice
starts. Both are encoded as one integer per GPU so a whole cluster is an
``int`` array and every policy decision is a table lookup vectorised with
numpy:

- ``left[s]``: what the GPU still offers, in milli-GPU (the unit of the
  paper's fragmentation measure);
- ``nxt[s, a, o]``: the state after placing one unit of action ``a`` with
  option ``o`` (a milli share has one option; a MIG profile has one option per
  memory-slice start), or -1 where it does not fit;
- ``host[s, a]``: whether any option fits.

``free`` is an unused GPU's code, ``absent`` pads nodes with fewer GPUs than
the widest node (it offers nothing and hosts nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...hardware import get_model
from ...hardware.model import GpuModel, MigProfile
from ..cluster import GPU_MILLI, Pod


@dataclass(frozen=True)
class GpuKind:
    """Tables for one way of sharing a GPU. ``actions`` label the action axis of ``nxt``/``host``."""

    name: str
    actions: tuple[object, ...]
    left: np.ndarray  # [S] int64
    nxt: np.ndarray  # [S, A, O] int64, -1 where it does not fit
    free: int
    absent: int
    whole: int  # the action index that takes a whole GPU
    slices: np.ndarray | None = None  # [S] compute slices in use (MIG only)
    slices_per_gpu: int = 0

    @property
    def host(self) -> np.ndarray:
        return np.any(self.nxt >= 0, axis=2)  # typed as an array (the method's stub adds a scalar np.bool)

    def action(self, pod: Pod) -> int:
        """The action a GPU pod needs on each of its GPUs (-1 for a CPU-only pod)."""
        raise NotImplementedError


@dataclass(frozen=True)
class MilliKind(GpuKind):
    """The paper's model: a GPU is 1000 milli; a share fits where enough milli is left."""

    def action(self, pod: Pod) -> int:
        if not pod.num_gpu:
            return -1
        return self.actions.index(pod.gpu_milli)


def milli_kind(pods: tuple[Pod, ...]) -> MilliKind:
    """States 0..1000 (milli left); one action per distinct per-GPU share in ``pods`` (and 1000)."""
    shares = sorted({p.gpu_milli for p in pods if p.num_gpu} | {GPU_MILLI})
    states = np.arange(GPU_MILLI + 1, dtype=np.int64)
    nxt = np.full((len(states), len(shares), 1), -1, dtype=np.int64)
    for a, m in enumerate(shares):
        nxt[m:, a, 0] = states[m:] - m
    return MilliKind(
        name="milli",
        actions=tuple(shares),
        left=states,
        nxt=nxt,
        free=GPU_MILLI,
        absent=0,
        whole=shares.index(GPU_MILLI),
    )


@dataclass(frozen=True)
class MigKind(GpuKind):
    """A MIG GPU whose layout forms as instances arrive, within the catalogue's placement rules.

    State = occupied memory-slice bit mask | compute slices in use << 8. A
    profile fits at a start listed in its catalogue placements when its memory
    slices there are free and enough compute slices remain. Placed instances
    never move (running jobs hold them). ``left`` counts free compute slices
    as milli-GPU (7 free = 1000).
    """

    model: GpuModel = field(kw_only=True)
    profile_of: Callable[[Pod], str] | None = None  # the submission's rounding; default covering_profile

    def action(self, pod: Pod) -> int:
        if not pod.num_gpu:
            return -1
        if self.profile_of is not None:
            return self.actions.index(self.model.profile(self.profile_of(pod)).name)
        return self.actions.index(covering_profile(self.model, pod.gpu_milli).name)


def mig_profiles(model: GpuModel) -> list[MigProfile]:
    """The model's profiles without '+me' variants, smallest share first (ties: fewer compute slices)."""
    plain = [p for p in model.mig_profiles if not p.media_extensions]
    return sorted(plain, key=lambda p: (p.fraction(model), p.compute_slices, p.memory_slices, p.name))


def covering_profile(model: GpuModel, gpu_milli: int) -> MigProfile:
    """The smallest profile whose share of the GPU (``MigProfile.fraction``) covers ``gpu_milli``/1000."""
    for p in mig_profiles(model):
        if p.fraction(model) * GPU_MILLI >= gpu_milli - 1e-9:
            return p
    raise ValueError(f"no MIG profile of {model.name} covers {gpu_milli} milli-GPU")


def mig_kind(model_name: str = "A100-SXM4-40GB", profile_of: Callable[[Pod], str] | None = None) -> MigKind:
    """MIG tables for ``model_name``; ``profile_of`` rounds a GPU pod to a profile name (default: covering)."""
    model = get_model(model_name)
    profiles = mig_profiles(model)
    mem, comp = model.memory_slices, model.compute_slices
    n_states = (1 << mem) * (comp + 1)
    codes = np.arange(n_states, dtype=np.int64)
    mask, used = codes & ((1 << mem) - 1), codes >> mem
    nxt = np.full((n_states, len(profiles), mem), -1, dtype=np.int64)
    for a, p in enumerate(profiles):
        width = (1 << p.memory_slices) - 1
        for start in p.placements:
            bits = width << start
            ok = ((mask & bits) == 0) & (used + p.compute_slices <= comp)
            nxt[ok, a, start] = (mask[ok] | bits) | ((used[ok] + p.compute_slices) << mem)
    whole = max(range(len(profiles)), key=lambda a: profiles[a].compute_slices)
    left = np.rint((comp - used) * GPU_MILLI / comp).astype(np.int64)
    return MigKind(
        name=f"mig:{model.name}",
        actions=tuple(p.name for p in profiles),
        left=left,
        nxt=nxt,
        free=0,
        absent=int(((1 << mem) - 1) | (comp << mem)),
        whole=whole,
        slices=used,
        slices_per_gpu=comp,
        model=model,
        profile_of=profile_of,
    )
