"""MIG layout on one node: observe, compare with the policy, plan, execute.

``observe`` reads the live state through the backend; ``plan_mig`` and
``differences`` are pure (slots + state in, actions or sentences out), so the
dry run (`assert`) and the real run share one planner; ``apply_actions`` is
the only part that changes GPUs. As mig-parted does: check first, change only
GPUs that differ, and refuse while anything runs on a GPU that would change.

The expected shape of a MIG GPU is the policy's multiset of GPU-instance
profiles, each GI holding exactly one compute instance that spans it (what
Slurm and CUDA see as one MIG device). MIG *mode* is never changed here:
enabling it can reset the GPU, which is an admin's decision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import GpushareError
from ..gpu.backend import ComputeInstance, GiProfile, GpuInstance, GpuProcess
from ..hardware import CatalogueError, GpuModel, MigProfile, model_for_nvml_name, place_layout
from ..policy.site import GpuSlot


class MigRefused(GpushareError):
    """The node cannot be brought to the policy's MIG layout now; every reason is listed."""

    exit_code = 1

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("refusing to change the MIG layout:\n  " + "\n  ".join(reasons))


# ---- live state --------------------------------------------------------------------


@dataclass(frozen=True)
class GiState:
    """One live GPU instance and its compute instances."""

    gi: GpuInstance
    cis: tuple[ComputeInstance, ...]


@dataclass(frozen=True)
class GpuState:
    """What a MIG planner needs to know about one GPU, read once."""

    index: int
    uuid: str
    name: str
    minor: int
    mig_current: bool | None
    mig_pending: bool | None
    profiles: tuple[GiProfile, ...] = ()
    instances: tuple[GiState, ...] = ()
    processes: tuple[GpuProcess, ...] = ()

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


NodeState = Mapping[int, GpuState]


def observe(backend, indexes: Iterable[int] | None = None) -> dict[int, GpuState]:
    """Read every GPU (or those in ``indexes``) with its GIs, CIs and processes."""
    wanted = None if indexes is None else set(indexes)
    return {g.index: _observe_gpu(backend, g) for g in backend.gpus() if wanted is None or g.index in wanted}


def _observe_gpu(backend, info) -> GpuState:
    base = {
        "index": info.index,
        "uuid": info.uuid,
        "name": info.name,
        "minor": info.minor,
        "mig_current": info.mig_current,
        "mig_pending": info.mig_pending,
    }
    processes = tuple(backend.processes(info.index))
    if not info.mig_current:
        return GpuState(**base, processes=processes)
    instances = tuple(
        GiState(gi, tuple(backend.compute_instances(info.index, gi.id))) for gi in backend.gpu_instances(info.index)
    )
    return GpuState(
        **base, profiles=tuple(backend.gpu_instance_profiles(info.index)), instances=instances, processes=processes
    )


# ---- actions -----------------------------------------------------------------------


@dataclass(frozen=True)
class DestroyCi:
    index: int
    gi_id: int
    ci_id: int

    def __str__(self) -> str:
        return f"GPU {self.index}: destroy compute instance {self.ci_id} of GPU instance {self.gi_id}"


@dataclass(frozen=True)
class DestroyGi:
    index: int
    gi_id: int
    profile: str

    def __str__(self) -> str:
        return f"GPU {self.index}: destroy GPU instance {self.gi_id} ({self.profile})"


@dataclass(frozen=True)
class CreateGi:
    """Create a GI at a chosen memory slice, then its one full-size CI."""

    index: int
    profile: str
    profile_id: int
    start: int
    ci_constant: int

    def __str__(self) -> str:
        return f"GPU {self.index}: create {self.profile} at memory slice {self.start} with one full compute instance"


@dataclass(frozen=True)
class CreateCi:
    index: int
    gi_id: int
    profile: str
    ci_constant: int

    def __str__(self) -> str:
        return f"GPU {self.index}: create the full compute instance of GPU instance {self.gi_id} ({self.profile})"


Action = DestroyCi | DestroyGi | CreateGi | CreateCi


# ---- comparison (pure) -------------------------------------------------------------


@dataclass
class _Verdict:
    """One GPU compared with its slot: what differs, what blocks a change, what to do."""

    difference: str | None = None
    blockers: list[str] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)


def full_ci_constant(profile: MigProfile) -> int:
    """NVML_COMPUTE_INSTANCE_PROFILE_* of the CI that spans the whole GI (same name as the GI)."""
    return profile.full_compute_constant


def gi_profile_name(model: GpuModel, gi: GpuInstance) -> str:
    """Catalogue name of a live GI, from the constant NVML listed it under."""
    try:
        return model.profile_for_constant(gi.profile_constant).name
    except CatalogueError:
        return f"unknown profile (NVML constant {gi.profile_constant}, ID {gi.profile_id})"


def is_full_shape(model: GpuModel, state: GiState) -> bool:
    """Exactly one CI, and it is the GI-wide one."""
    try:
        profile = model.profile_for_constant(state.gi.profile_constant)
    except CatalogueError:
        return False
    return len(state.cis) == 1 and state.cis[0].profile_constant == full_ci_constant(profile)


def _multiset(names: Iterable[str], model: GpuModel) -> str:
    """'3g.20gb x2, 1g.5gb x1', largest first; 'no MIG instances' if empty."""
    counts = Counter(names)
    if not counts:
        return "no MIG instances"

    def size(name: str) -> tuple:
        try:
            p = model.profile(name)
            return (-p.memory_slices, -p.compute_slices, name)
        except CatalogueError:
            return (1, 0, name)

    return ", ".join(f"{n} x{counts[n]}" for n in sorted(counts, key=size))


def _wanted(slot: GpuSlot) -> list[str]:
    return [slot.model.profile(n).name for n in slot.layout]


def _compare(slot: GpuSlot, gpu: GpuState | None, present: Iterable[int]) -> _Verdict:
    if gpu is None:
        listed = ", ".join(map(str, sorted(present))) or "none"
        text = f"GPU {slot.index}: not found on this node (NVML lists GPUs: {listed})"
        return _Verdict(text, [text])
    mismatch = model_mismatch(slot, gpu)
    if mismatch:
        return _Verdict(mismatch, [mismatch])
    if slot.share.is_per_job_mig:
        return _compare_per_job(slot, gpu)
    if not slot.share.is_mig:
        return _compare_whole(slot, gpu)
    if not gpu.mig_current:
        return _mig_disabled(slot, gpu)
    return _compare_layout(slot, gpu)


def model_mismatch(slot: GpuSlot, gpu: GpuState) -> str | None:
    try:
        live = model_for_nvml_name(gpu.name)
    except CatalogueError:
        return f"{gpu.label}: NVML name {gpu.name!r} is not in the GPU catalogue; the policy says {slot.model.name}"
    if live != slot.model:
        return f"{gpu.label}: NVML reports {gpu.name!r} ({live.name}), but the policy says {slot.model.name}"
    return None


def _compare_whole(slot: GpuSlot, gpu: GpuState) -> _Verdict:
    if gpu.mig_current:
        text = (
            f"{gpu.label}: MIG mode is enabled, but the policy shares it as {slot.mode}; "
            f"gpushare never changes MIG mode: disable it with `nvidia-smi -i {gpu.index} -mig 0`"
        )
        return _Verdict(text, [text])
    return _Verdict()


def _compare_per_job(slot: GpuSlot, gpu: GpuState) -> _Verdict:
    """A per-job MIG GPU: MIG mode must be on; its instances are its jobs' (node.perjob), never a layout to keep."""
    if gpu.mig_current:
        return _Verdict()
    pending = " (enabling is pending: reset the GPU or reboot)" if gpu.mig_pending else ""
    text = (
        f"{gpu.label}: MIG mode is disabled{pending}, but the policy makes MIG instances per job on it; gpushare "
        f"never changes MIG mode: enable it with `nvidia-smi -i {gpu.index} -mig 1`"
    )
    return _Verdict(f"GPU {gpu.index}: MIG mode is disabled, want instances per job", [text])


def _mig_disabled(slot: GpuSlot, gpu: GpuState) -> _Verdict:
    pending = " (enabling is pending: reset the GPU or reboot)" if gpu.mig_pending else ""
    want = _multiset(_wanted(slot), slot.model)
    text = (
        f"{gpu.label}: MIG mode is disabled{pending}, but the policy wants {want}; gpushare never "
        f"changes MIG mode: enable it with `nvidia-smi -i {gpu.index} -mig 1`"
    )
    return _Verdict(f"GPU {gpu.index}: MIG mode is disabled, want {want}", [text])


def _compare_layout(slot: GpuSlot, gpu: GpuState) -> _Verdict:
    model, wanted = slot.model, _wanted(slot)
    have = [gi_profile_name(model, s.gi) for s in gpu.instances]
    if Counter(have) != Counter(wanted):
        verdict = _Verdict(f"GPU {gpu.index}: have {_multiset(have, model)}, want {_multiset(wanted, model)}")
        verdict.actions = _teardown(gpu, model) + _build(slot, gpu, verdict.blockers)
        return verdict
    bad = [s for s in gpu.instances if not is_full_shape(model, s)]
    if not bad:
        return _Verdict()
    shapes = "; ".join(
        f"GI {s.gi.id} ({gi_profile_name(model, s.gi)}) has {len(s.cis)} compute instance(s)" for s in bad
    )
    verdict = _Verdict(f"GPU {gpu.index}: {shapes}, want one full compute instance per GPU instance")
    for s in bad:
        name = gi_profile_name(model, s.gi)
        verdict.actions += [DestroyCi(gpu.index, s.gi.id, c.id) for c in s.cis]
        verdict.actions.append(CreateCi(gpu.index, s.gi.id, name, full_ci_constant(model.profile(name))))
    return verdict


def _teardown(gpu: GpuState, model: GpuModel) -> list[Action]:
    """Every CI first, then every GI: NVML refuses to destroy a GI that still has CIs."""
    cis: list[Action] = [DestroyCi(gpu.index, s.gi.id, c.id) for s in gpu.instances for c in s.cis]
    return cis + [DestroyGi(gpu.index, s.gi.id, gi_profile_name(model, s.gi)) for s in gpu.instances]


def _build(slot: GpuSlot, gpu: GpuState, blockers: list[str]) -> list[Action]:
    """Create the policy's GIs where ``place_layout`` puts them, largest first."""
    placed = place_layout(slot.model, list(slot.layout))
    if placed is None:
        blockers.append(f"{gpu.label}: the layout {', '.join(slot.layout)} has no valid placement on {slot.model.name}")
        return []
    live_ids = {p.constant: p.id for p in gpu.profiles}
    actions: list[Action] = []
    for name, start in placed:
        profile = slot.model.profile(name)
        if profile.nvml_constant not in live_ids:
            blockers.append(
                f"{gpu.label}: NVML does not offer {name} (profile constant {profile.nvml_constant}) on this GPU"
            )
            continue
        actions.append(CreateGi(gpu.index, name, live_ids[profile.nvml_constant], start, full_ci_constant(profile)))
    return actions


def _change_blockers(gpu: GpuState, busy: frozenset[int]) -> list[str]:
    """Running work on a GPU that would change: its processes would lose their device."""
    reasons = []
    if gpu.processes:
        pids = ", ".join(str(p) for p in sorted({p.pid for p in gpu.processes}))
        reasons.append(
            f"{gpu.label}: processes are running on it (PIDs {pids}); its MIG layout cannot change under them"
        )
    if gpu.index in busy:
        reasons.append(f"{gpu.label}: Slurm jobs are running on it; drain the node and wait for them first")
    return reasons


def _verdicts(slots: Iterable[GpuSlot], state: NodeState) -> list[tuple[GpuSlot, _Verdict]]:
    return [(s, _compare(s, state.get(s.index), state.keys())) for s in sorted(slots, key=lambda s: s.index)]


# ---- public planner ----------------------------------------------------------------


def differences(slots: Iterable[GpuSlot], state: NodeState) -> list[str]:
    """One readable line per GPU that is not as the policy says ([] when in sync)."""
    return [v.difference for _s, v in _verdicts(slots, state) if v.difference]


def plan_mig(slots: Iterable[GpuSlot], state: NodeState, busy: Iterable[int] = frozenset()) -> list[Action]:
    """The minimal actions that bring the node to the policy's MIG layout ([] when in sync).

    A GPU whose profile multiset differs is rebuilt (its CIs, then GIs, then
    the policy's GIs with one full CI each); a GPU whose profiles match but
    whose CIs do not gets only its CIs redone; other GPUs are left alone.
    ``busy``: GPU indexes with running Slurm jobs (the relayout workflow fills it).
    Raises MigRefused listing every reason when the change cannot be made now.
    """
    busy, blockers, actions = frozenset(busy), [], []
    for slot, verdict in _verdicts(slots, state):
        blockers += verdict.blockers
        if verdict.actions:
            blockers += _change_blockers(state[slot.index], busy)
            actions += verdict.actions
    if blockers:
        raise MigRefused(blockers)
    return actions


def apply_actions(backend, actions: Iterable[Action]) -> None:
    """Carry out a plan in order. The first NVML failure stops it (GpuError names the GPU)."""
    for action in actions:
        match action:
            case DestroyCi(index, gi_id, ci_id):
                backend.destroy_compute_instance(index, gi_id, ci_id)
            case DestroyGi(index, gi_id, _):
                backend.destroy_gpu_instance(index, gi_id)
            case CreateGi(index, _, profile_id, start, ci_constant):
                gi = backend.create_gpu_instance(index, profile_id, start)
                backend.create_compute_instance(index, gi.id, ci_constant)
            case CreateCi(index, gi_id, _, ci_constant):
                backend.create_compute_instance(index, gi_id, ci_constant)
            case _:
                raise TypeError(f"not a MIG action: {action!r}")
