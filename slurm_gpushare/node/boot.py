"""`gpushare node boot`: a node's GPUs made as the policy says before slurmd starts (gpushare-node-boot.service).

A reboot takes from the GPUs what the policy needs of them: MIG instances do not survive it (MIG-GS), Hopper
and later GPUs lose MIG mode with the driver's unload (A100 and A30 keep it: MIG-DC), compute modes are
DEFAULT again (NVML-H nvmlDeviceSetComputeMode: not persistent across reboots). A slurmd started on such a
node registers GRES the gres include no longer backs, or is drained for it. Boot puts them back:

- observe (``observe_boot``): each GPU of the policy (``mig.observe``: MIG mode, instances, processes), the
  compute mode of its MPS GPUs, and the journals (a per-job instance a job's journal names is that job's);
- plan (``plan_boot``, pure): MIG mode turned on where the policy shares a GPU with MIG, on GPUs that change
  it without a reset (``GpuModel.mig_mode_reset`` false) while nothing runs on them; a GPU that needs a
  reset is refused, naming it and what holds a GPU (the reset is the admin's: it takes the GPU from every
  client); the MIG layout as `gpushare node mig apply` plans it (``mig.plan_mig``); the instances on per-job
  MIG GPUs that no journal names (``perjob.unjournaled``: none survive a reboot, a driver reload may leave
  some); the MPS GPUs' compute modes (``Share.wanted_compute_mode``);
- execute (``execute_boot``), then observe and plan again: the layout of a GPU whose MIG mode was just turned
  on is planned on what NVML offers once it is on. A round that plans nothing ends it: the node is as the
  policy says, and the gres include is written from the live state (``gresconf.live_gres_conf``).

Anything refused stops the boot before it changes anything (``BootRefused``, every reason listed): the unit
fails and slurmd, which requires it, stays down with the reason in the journal, instead of registering GRES
the GPUs do not have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import GpushareError
from ..policy.share import Mode
from ..policy.site import GpuSlot
from .journal import Device, Journal, JournalStore
from .mig import Action, GpuState, MigRefused, apply_actions, model_mismatch, observe, plan_mig

ROUNDS = 3  # MIG mode, then the layouts; a third round must find nothing left to do


class BootRefused(GpushareError):
    """The node cannot be made as the policy says; slurmd must not start on it. Every reason is listed."""

    exit_code = 1

    def __init__(self, node: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"node {node} is not ready for slurmd:\n  " + "\n  ".join(reasons))


@dataclass(frozen=True)
class EnableMig:
    index: int
    uuid: str

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.uuid}): enable MIG mode"


@dataclass(frozen=True)
class SetComputeMode:
    index: int
    uuid: str
    have: str
    want: str

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.uuid}): compute mode {self.have} -> {self.want}"


@dataclass(frozen=True)
class SweepInstance:
    """An instance on a per-job MIG GPU that no job's journal names."""

    device: Device

    def __str__(self) -> str:
        d = self.device
        return f"GPU {d.gpu_index}: destroy GPU instance {d.gi} at memory slice {d.start} (no job's)"


BootAction = EnableMig | SetComputeMode | SweepInstance | Action


@dataclass
class BootPlan:
    actions: list[BootAction] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def again(self) -> bool:
        """MIG mode changes: the layouts of those GPUs are planned once NVML shows them in MIG mode."""
        return any(isinstance(a, EnableMig) for a in self.actions)


@dataclass(frozen=True)
class BootState:
    """What one look at the node found."""

    gpus: Mapping[int, GpuState]
    compute_modes: Mapping[int, str]  # MPS GPUs only
    journals: Mapping[int, Journal]
    set_aside: tuple[str, ...] = ()  # journals that could not be read: some job's instances are in doubt


# ---- observe ---------------------------------------------------------------------------------------


def observe_boot(backend, slots: Iterable[GpuSlot], store: JournalStore) -> BootState:
    slots = list(slots)
    gpus = observe(backend, [s.index for s in slots])
    modes = {s.index: backend.compute_mode(s.index) for s in slots if s.share.wanted_compute_mode and s.index in gpus}
    with store.locked():
        journals = store.all()
        aside = tuple(q.path for q in store.set_aside())
    return BootState(gpus, modes, journals, aside)


# ---- plan (pure) -----------------------------------------------------------------------------------


def plan_boot(slots: Iterable[GpuSlot], seen: BootState) -> BootPlan:
    """What brings the node to the policy now (see the module docstring); blockers refuse the whole boot."""
    plan = BootPlan()
    slots = sorted(slots, key=lambda s: s.index)
    waiting = set()
    for slot in slots:
        gpu = seen.gpus.get(slot.index)
        if gpu is not None and slot.mode is Mode.MIG and not gpu.mig_current:
            waiting.add(slot.index)
            _plan_mig_mode(slot, gpu, plan)
    try:
        plan.actions += plan_mig([s for s in slots if s.index not in waiting], seen.gpus)
    except MigRefused as exc:
        plan.blockers += exc.reasons
    for slot in slots:
        if slot.share.is_per_job_mig and slot.index not in waiting and slot.index in seen.gpus:
            _plan_sweep(seen.gpus[slot.index], seen, plan)
    plan.actions += _compute_modes(slots, seen)
    return plan


def _plan_mig_mode(slot: GpuSlot, gpu: GpuState, plan: BootPlan) -> None:
    mismatch = model_mismatch(slot, gpu)
    if mismatch:
        plan.blockers.append(mismatch)
    elif slot.model.mig_mode_reset:
        pending = " (enabling is pending a reset)" if gpu.mig_pending else ""
        plan.blockers.append(
            f"{gpu.label}: MIG mode is off{pending}, but the policy shares it with MIG; a {slot.model.name} "
            "turns MIG mode on only with a GPU reset, which gpushare leaves to you: stop what holds the GPU "
            "(nvidia-persistenced, DCGM or dcgm-exporter, a display through nvidia_drm), then "
            f"`nvidia-smi -i {gpu.index} -mig 1` and `nvidia-smi -i {gpu.index} -r`, or reboot (it keeps the mode)"
        )
    elif gpu.processes:
        pids = ", ".join(str(p) for p in sorted({p.pid for p in gpu.processes}))
        plan.blockers.append(
            f"{gpu.label}: MIG mode is off and processes use the GPU (PIDs {pids}); MIG mode is turned on only "
            "on an idle GPU"
        )
    else:
        plan.actions.append(EnableMig(gpu.index, gpu.uuid))


def _plan_sweep(gpu: GpuState, seen: BootState, plan: BootPlan) -> None:
    from .perjob import unjournaled

    if not gpu.instances:
        return
    if seen.set_aside:
        plan.notes.append(
            f"GPU {gpu.index}: its {len(gpu.instances)} GPU instance(s) left for `gpushare node reconcile`: "
            f"journals set aside ({', '.join(seen.set_aside)}) may name them"
        )
        return
    found, notes = unjournaled(dict(seen.journals), gpu.index, gpu.uuid, [s.gi for s in gpu.instances], gpu.processes)
    plan.actions += [SweepInstance(d) for d in found]
    plan.notes += notes


def _compute_modes(slots: list[GpuSlot], seen: BootState) -> list[BootAction]:
    out: list[BootAction] = []
    for slot in slots:
        want, have = slot.share.wanted_compute_mode, seen.compute_modes.get(slot.index)
        if want and have is not None and have != want:
            out.append(SetComputeMode(slot.index, seen.gpus[slot.index].uuid, have, want))
    return out


# ---- execute ---------------------------------------------------------------------------------------


def execute_boot(plan: BootPlan, backend, state_dir: str, say: Callable[[str], None]) -> None:
    """Carry out a plan in order, saying each step first; the first failure stops it (GpuError names the GPU)."""
    from .perjob import destroy_unjournaled

    for action in plan.actions:
        say(str(action))
        match action:
            case EnableMig(index, _):
                backend.set_mig_mode(index, True)
            case SetComputeMode(index, _, _, want):
                backend.set_compute_mode(index, want)
            case SweepInstance(device):
                held: list[str] = []  # a process or another NVML client on it: said, and slurmd still starts
                why = destroy_unjournaled(backend, device, state_dir, held)
                for note in held:
                    say(f"note: {note}")
                if why:
                    raise GpushareError(why)
            case _:
                apply_actions(backend, [action])


def run_boot(
    node: str,
    slots: Iterable[GpuSlot],
    backend,
    store: JournalStore,
    state_dir: str,
    say: Callable[[str], None],
    dry_run: bool = False,
) -> int:
    """Observe, plan, execute until a round plans nothing; the number of changes made (a dry run: planned in
    its first round). BootRefused when something blocks, or when the node still differs after ``ROUNDS``."""
    slots, done = list(slots), 0
    for _ in range(ROUNDS):
        plan = plan_boot(slots, observe_boot(backend, slots, store))
        if plan.blockers:
            raise BootRefused(node, plan.blockers)
        for note in plan.notes:
            say(f"note: {note}")
        if dry_run:
            for action in plan.actions:
                say(f"would: {action}")
            if plan.again:
                say("would then plan the MIG layout of those GPUs once MIG mode is on")
            return len(plan.actions)
        if not plan.actions:
            return done
        execute_boot(plan, backend, state_dir, say)
        done += len(plan.actions)
    raise BootRefused(node, [f"the GPUs still differ from the policy after {ROUNDS} rounds of changes"])


def write_gres_include(
    node: str, slots: Iterable[GpuSlot], backend, path: str, say: Callable[[str], None], dry_run: bool = False
) -> None:
    """The node's gres include from the live MIG state (as `gpushare node gres-conf` writes it)."""
    from pathlib import Path

    from ..atomic import atomic_write
    from .gresconf import live_gres_conf

    text, target = live_gres_conf(node, slots, backend), Path(path)
    devices = sum(1 for line in text.splitlines() if line.startswith("NodeName="))
    try:
        same = target.read_text(encoding="utf-8") == text
    except OSError:
        same = False
    if same:
        say(f"gres include {target}: unchanged ({devices} MIG devices)")
    elif dry_run:
        say(f"would: write the gres include {target} ({devices} MIG devices)")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text)
        say(f"wrote the gres include {target} ({devices} MIG devices)")
