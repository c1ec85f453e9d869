"""NvmlBackend: the only code in the suite that calls NVML.

It takes a pynvml-like object (the real ``pynvml`` module, or ``FakeNvml``)
and returns frozen dataclasses, so planning code never sees ctypes, handles
or NVML error classes. Every NVML failure is translated here, once, into a
``GpuError`` naming the GPU (index and UUID) and the operation. The real
module is imported only by ``open_backend``, at an entry point.

The call idioms are the driver's and mig-parted's: GI profiles by
enumerating NVML_GPU_INSTANCE_PROFILE_* constants and skipping
NOT_SUPPORTED / INVALID_ARGUMENT; instance lists per profile into
caller-allocated arrays; MIG devices by index up to the max count.
"""

from __future__ import annotations

import ctypes
import os

from ..errors import GpushareError
from ..records import record
from .migminors import MIG_MINORS

TYPE_CHECKING = False  # typing costs every node hook a few ms at start-up: for type checkers only
if TYPE_CHECKING:
    from pathlib import Path  # not at run time: pathlib costs every node hook ~17 M instructions
    from typing import Self

# NVML_ERROR_* codes the backend reacts to or names (values: NVML-H / pynvml).
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND = 1, 2, 3, 4, 6
IN_USE, INSUFFICIENT_RESOURCES = 19, 23
_CODE_NAMES = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    23: "INSUFFICIENT_RESOURCES",
    999: "UNKNOWN",
}
_HINTS = {
    9: "the NVIDIA kernel driver is not loaded",
    12: "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine?",
    4: "needs root",
}
_MIB = 1 << 20

# Per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1; NVIDIA's "MPS v3 memory partitioning"): driver r615+
# (CUDA 13.4), cgroup v2, non-MIG GPUs, root. NVML_DEVICE_MEMORY_LIMIT_MAX as hardLimit means no limit.
MEMORY_LIMITS_DRIVER = 615
MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF

# NVML_COMPUTEMODE_* (NVML-H / pynvml) and the names nvidia-smi -c takes for them
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class GpuError(GpushareError):
    """An NVML operation failed. Names the GPU (index, UUID), the operation and the NVML code."""

    def __init__(
        self,
        operation: str,
        index: int | None = None,
        uuid: str | None = None,
        code: int | None = None,
        detail: str = "",
    ):
        self.operation, self.index, self.uuid, self.code = operation, index, uuid, code
        where = "NVML" if index is None else f"GPU {index} ({uuid or 'UUID unknown'})"
        why = detail or (_describe(code) if code is not None else "failed")
        super().__init__(f"{where}: {operation}: {why}")


def _describe(code: int) -> str:
    text = f"NVML_ERROR_{_CODE_NAMES.get(code, 'code')} ({code})"
    return f"{text}: {_HINTS[code]}" if code in _HINTS else text


@record
class GpuInfo:
    """One GPU as NVML reports it. ``mig_current``/``mig_pending`` are None when the GPU has no MIG."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int
    pci_bus_id: str
    mig_current: bool | None
    mig_pending: bool | None


@record
class GiProfile:
    """A GPU-instance profile as this GPU offers it: ``constant`` is NVML_GPU_INSTANCE_PROFILE_*,
    ``id`` what instance creation takes (they differ: 7g is constant 4, id 0)."""

    constant: int
    id: int
    slice_count: int
    instance_count: int
    memory_mib: int
    name: str


@record
class Placement:
    """Memory-slice start and size of a GPU instance."""

    start: int
    size: int


@record
class GpuInstance:
    id: int
    profile_id: int
    start: int
    size: int
    profile_constant: int  # the NVML_GPU_INSTANCE_PROFILE_* it was listed under


@record
class ComputeInstance:
    id: int
    profile_id: int
    start: int
    size: int
    profile_constant: int  # the NVML_COMPUTE_INSTANCE_PROFILE_* it was listed under


@record
class MigDevice:
    uuid: str
    gi_id: int
    ci_id: int
    name: str
    memory_mib: int


@record
class GpuProcess:
    """A compute process; ``gi_id``/``ci_id`` say which MIG device it runs on (None outside MIG)."""

    pid: int
    used_mib: int | None
    gi_id: int | None
    ci_id: int | None


_SKIP = object()  # what _call returns for a tolerated NVML code


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Read and change GPUs through a pynvml-like object; see the module docstring.

    ``mig_minors_path`` is where this machine's mig-minors table is read from
    (the fake keeps its own next to its state file).
    """

    def __init__(self, nvml, mig_minors_path: str | Path = MIG_MINORS):
        self._nvml = nvml
        self.mig_minors_path = mig_minors_path
        self._handles: dict[int, object] = {}
        self._uuids: dict[int, str] = {}
        self._open = False

    # ---- lifecycle -------------------------------------------------------------

    def init(self) -> Self:
        self._call(None, "initialise", self._nvml.nvmlInit)
        self._open = True
        return self

    def shutdown(self) -> None:
        if self._open:
            self._open = False
            self._call(None, "shut down", self._nvml.nvmlShutdown)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- error translation -----------------------------------------------------

    def _call(self, index: int | None, operation: str, fn, *args, tolerate: frozenset[int] = frozenset()):
        """Call one NVML function; an NVML error becomes GpuError unless its code is tolerated."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if exc.value in tolerate:
                return _SKIP
            raise GpuError(operation, index, self._uuid_for_error(index), exc.value) from None

    def _uuid_for_error(self, index: int | None) -> str | None:
        """The GPU's UUID for an error message, or None when even that cannot be read."""
        if index is None or index in self._uuids:
            return None if index is None else self._uuids[index]
        try:
            return self._uuid(index)
        except GpuError:
            return None

    # ---- handles -----------------------------------------------------------------

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._call(index, "get device handle", self._nvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def _uuid(self, index: int) -> str:
        if index not in self._uuids:
            self._uuids[index] = _text(
                self._call(index, "read UUID", self._nvml.nvmlDeviceGetUUID, self._handle(index))
            )
        return self._uuids[index]

    def _gi(self, index: int, gi_id: int):
        return self._call(
            index, f"find GPU instance {gi_id}", self._nvml.nvmlDeviceGetGpuInstanceById, self._handle(index), gi_id
        )

    # ---- whole GPUs --------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        count = self._call(None, "count GPUs", self._nvml.nvmlDeviceGetCount)
        return [self.gpu(i) for i in range(count)]

    def gpu(self, index: int) -> GpuInfo:
        nvml, handle = self._nvml, self._handle(index)
        memory = self._call(index, "read memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        pci = self._call(index, "read PCI info", nvml.nvmlDeviceGetPciInfo, handle)
        mode = self._call(
            index, "read MIG mode", nvml.nvmlDeviceGetMigMode, handle, tolerate=frozenset({NOT_SUPPORTED})
        )
        current, pending = (None, None) if mode is _SKIP else (bool(mode[0]), bool(mode[1]))
        return GpuInfo(
            index=index,
            uuid=self._uuid(index),
            name=_text(self._call(index, "read name", nvml.nvmlDeviceGetName, handle)),
            memory_mib=memory.total // _MIB,
            minor=self._call(index, "read device minor", nvml.nvmlDeviceGetMinorNumber, handle),
            pci_bus_id=_text(pci.busId),
            mig_current=current,
            mig_pending=pending,
        )

    def compute_mode(self, index: int) -> str:
        """The GPU's compute mode by nvidia-smi's name: DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS
        (EXCLUSIVE_THREAD on old drivers). Read on demand: only the hooks of MPS jobs need it."""
        mode = self._call(index, "read compute mode", self._nvml.nvmlDeviceGetComputeMode, self._handle(index))
        if mode not in COMPUTE_MODES:
            raise GpuError(
                "read compute mode",
                index,
                self._uuid_for_error(index),
                detail=f"NVML returned compute mode {mode}, none of {sorted(COMPUTE_MODES)}",
            )
        return COMPUTE_MODES[mode]

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Set the compute mode by name (root on real GPUs; test clusters set their fake GPUs with it)."""
        codes = {name: code for code, name in COMPUTE_MODES.items()}
        if mode not in codes:
            raise GpuError(
                f"set compute mode {mode}",
                index,
                self._uuid_for_error(index),
                detail=f"unknown compute mode; known: {', '.join(codes)}",
            )
        self._call(
            index, f"set compute mode {mode}", self._nvml.nvmlDeviceSetComputeMode, self._handle(index), codes[mode]
        )

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Turn MIG mode on or off (root; Hopper and later: at once while the GPU is idle). NVML answers with an
        activation status besides its return code: one other than success (IN_USE: a process or another client,
        e.g. nvidia-persistenced or DCGM, holds the GPU; RESET_REQUIRED) is a GpuError with that code. The
        driver may unbind the GPU to do it (NVML-H: its minor may change), so its handle is looked up again."""
        operation = f"{'enable' if enabled else 'disable'} MIG mode"
        handle = self._handle(index)
        status = self._call(index, operation, self._nvml.nvmlDeviceSetMigMode, handle, int(enabled))
        self._handles.pop(index, None)
        if status:
            detail = _describe(status)
            if status == IN_USE:
                detail += (
                    ": the GPU is not idle (a process, or a client such as nvidia-persistenced or DCGM, has it open)"
                )
            raise GpuError(operation, index, self._uuid_for_error(index), status, detail=detail)

    # ---- driver, per-cgroup memory limits --------------------------------------------

    def driver_version(self) -> str:
        return _text(self._call(None, "read driver version", self._nvml.nvmlSystemGetDriverVersion))

    def memory_limits_supported(self) -> bool:
        """Does this driver offer per-cgroup memory limits (r615+)? The GPU must also be out of MIG mode, and
        cgroup v2 mounted: the callers check those."""
        head = self.driver_version().split(".", 1)[0]
        return head.isdigit() and int(head) >= MEMORY_LIMITS_DRIVER

    def set_memory_limit(self, index: int, cgroup: str, mib: int) -> None:
        """Processes of the cgroup ``cgroup`` (a full path) may allocate ``mib`` MiB of the GPU, guaranteed
        (soft limit) and at most (hard limit). Root only."""
        limits = self._nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace, limits.softLimit, limits.hardLimit = cgroup.encode(), mib * _MIB, mib * _MIB
        self._call(
            index,
            f"set memory limit {mib} MiB for cgroup {cgroup}",
            self._nvml.nvmlDeviceSetMemoryLimits_v1,
            self._handle(index),
            limits,
        )

    def clear_memory_limit(self, index: int, cgroup: str) -> None:
        limits = self._nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace, limits.softLimit, limits.hardLimit = cgroup.encode(), 0, MEMORY_LIMIT_MAX
        self._call(
            index,
            f"clear memory limit for cgroup {cgroup}",
            self._nvml.nvmlDeviceSetMemoryLimits_v1,
            self._handle(index),
            limits,
        )

    def memory_limit(self, index: int, cgroup: str) -> tuple[int, int] | None:
        """(soft, hard) MiB set for the cgroup on this GPU, or None when it has no limit."""
        limits = self._nvml.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = cgroup.encode()
        self._call(
            index,
            f"read memory limit for cgroup {cgroup}",
            self._nvml.nvmlDeviceGetMemoryLimits_v1,
            self._handle(index),
            limits,
        )
        if limits.softLimit == 0 and limits.hardLimit == MEMORY_LIMIT_MAX:
            return None
        return limits.softLimit // _MIB, limits.hardLimit // _MIB

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes on the GPU. On a MIG GPU, per MIG device: the parent
        handle lists them only for privileged callers (NVML API Reference,
        nvmlDeviceGetComputeRunningProcesses, MIG notes)."""
        info_mig = self._call(
            index,
            "read MIG mode",
            self._nvml.nvmlDeviceGetMigMode,
            self._handle(index),
            tolerate=frozenset({NOT_SUPPORTED}),
        )
        if info_mig is _SKIP or not info_mig[0]:
            return self._processes_on(index, self._handle(index), None, None)
        found = []
        for mig, gi_id, ci_id in self._mig_handles(index):
            found += self._processes_on(index, mig, gi_id, ci_id)
        return found

    def _processes_on(self, index: int, handle, gi_id: int | None, ci_id: int | None) -> list[GpuProcess]:
        what = "list processes" if gi_id is None else f"list processes on MIG device GI {gi_id} CI {ci_id}"
        procs = self._call(index, what, self._nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return [
            GpuProcess(p.pid, None if p.usedGpuMemory is None else p.usedGpuMemory // _MIB, gi_id, ci_id) for p in procs
        ]

    # ---- GPU-instance profiles and placements -------------------------------------

    def gpu_instance_profiles(self, index: int) -> list[GiProfile]:
        """The GI profiles this GPU offers; [] when MIG mode is off (NVML says NOT_SUPPORTED)."""
        nvml, handle, found = self._nvml, self._handle(index), []
        for constant in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._call(
                index,
                f"read GPU instance profile {constant}",
                nvml.nvmlDeviceGetGpuInstanceProfileInfo,
                handle,
                constant,
                tolerate=frozenset({NOT_SUPPORTED, INVALID_ARGUMENT}),
            )
            if info is not _SKIP:
                found.append(
                    GiProfile(
                        constant, info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, _text(info.name)
                    )
                )
        return found

    def possible_placements(self, index: int, profile_id: int) -> list[Placement]:
        """Every placement the profile allows (occupied or not): ask for the count, then the array."""
        nvml, handle = self._nvml, self._handle(index)
        what = f"list placements of GPU instance profile ID {profile_id}"
        count = ctypes.c_uint(0)
        self._call(
            index, what, nvml.nvmlDeviceGetGpuInstancePossiblePlacements, handle, profile_id, None, ctypes.byref(count)
        )
        array = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(
            index, what, nvml.nvmlDeviceGetGpuInstancePossiblePlacements, handle, profile_id, array, ctypes.byref(count)
        )
        return [Placement(array[i].start, array[i].size) for i in range(count.value)]

    # ---- GPU instances -------------------------------------------------------------

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        """Every GI on the GPU, by memory-slice start."""
        found = []
        for profile in self.gpu_instance_profiles(index):
            for gi in self._gi_handles(index, profile):
                found.append(self._gi_info(index, gi, profile.constant))
        return sorted(found, key=lambda g: (g.start, g.id))

    def _gi_handles(self, index: int, profile: GiProfile) -> list:
        nvml = self._nvml
        array = (nvml.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
        count = ctypes.c_uint(len(array))
        self._call(
            index,
            f"list GPU instances of profile {profile.name or profile.id}",
            nvml.nvmlDeviceGetGpuInstances,
            self._handle(index),
            profile.id,
            array,
            ctypes.byref(count),
        )
        return [array[i] for i in range(count.value)]

    def _gi_info(self, index: int, gi, constant: int) -> GpuInstance:
        info = self._call(index, "read GPU instance info", self._nvml.nvmlGpuInstanceGetInfo, gi)
        return GpuInstance(info.id, info.profileId, info.placement.start, info.placement.size, constant)

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        """Create a GI of ``profile_id`` at memory slice ``start`` (the driver does not choose)."""
        nvml = self._nvml
        constant = self._constant_for(index, profile_id)
        sizes = {p.start: p.size for p in self.possible_placements(index, profile_id)}
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, sizes.get(start, next(iter(sizes.values()), 0))
        gi = self._call(
            index,
            f"create GPU instance (profile ID {profile_id}) at memory slice {start}",
            nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            self._handle(index),
            profile_id,
            ctypes.byref(placement),
        )
        return self._gi_info(index, gi, constant)

    def _constant_for(self, index: int, profile_id: int) -> int:
        for profile in self.gpu_instance_profiles(index):
            if profile.id == profile_id:
                return profile.constant
        raise GpuError(
            f"create GPU instance (profile ID {profile_id})",
            index,
            self._uuid_for_error(index),
            detail="the GPU offers no such profile (is MIG mode on?)",
        )

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call(index, f"destroy GPU instance {gi_id}", self._nvml.nvmlGpuInstanceDestroy, self._gi(index, gi_id))

    # ---- compute instances ----------------------------------------------------------

    def compute_instances(self, index: int, gi_id: int) -> list[ComputeInstance]:
        gi, found = self._gi(index, gi_id), []
        for constant, info in self._ci_profiles(index, gi_id, gi):
            for ci in self._ci_handles(index, gi_id, gi, info):
                found.append(self._ci_info(index, gi_id, ci, constant))
        return sorted(found, key=lambda c: c.id)

    def _ci_profiles(self, index: int, gi_id: int, gi) -> list[tuple[int, object]]:
        nvml, found = self._nvml, []
        for constant in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = self._ci_profile(index, gi_id, gi, constant, frozenset({NOT_SUPPORTED, INVALID_ARGUMENT}))
            if info is not _SKIP:
                found.append((constant, info))
        return found

    def _ci_profile(self, index: int, gi_id: int, gi, constant: int, tolerate: frozenset[int] = frozenset()):
        nvml = self._nvml
        return self._call(
            index,
            f"read compute instance profile {constant} of GPU instance {gi_id}",
            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            constant,
            nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            tolerate=tolerate,
        )

    def _ci_handles(self, index: int, gi_id: int, gi, info) -> list:
        nvml = self._nvml
        array = (nvml.c_nvmlComputeInstance_t * max(info.instanceCount, 1))()
        count = ctypes.c_uint(len(array))
        self._call(
            index,
            f"list compute instances of GPU instance {gi_id}",
            nvml.nvmlGpuInstanceGetComputeInstances,
            gi,
            info.id,
            array,
            ctypes.byref(count),
        )
        return [array[i] for i in range(count.value)]

    def _ci_info(self, index: int, gi_id: int, ci, constant: int) -> ComputeInstance:
        info = self._call(
            index, f"read compute instance info in GPU instance {gi_id}", self._nvml.nvmlComputeInstanceGetInfo, ci
        )
        return ComputeInstance(info.id, info.profileId, info.placement.start, info.placement.size, constant)

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_const: int) -> ComputeInstance:
        """Create a CI of NVML_COMPUTE_INSTANCE_PROFILE_<const> in GI ``gi_id`` (by the id NVML gives it)."""
        gi = self._gi(index, gi_id)
        info = self._ci_profile(index, gi_id, gi, ci_profile_const)
        ci = self._call(
            index,
            f"create compute instance (profile {ci_profile_const}) in GPU instance {gi_id}",
            self._nvml.nvmlGpuInstanceCreateComputeInstance,
            gi,
            info.id,
        )
        return self._ci_info(index, gi_id, ci, ci_profile_const)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        what = f"destroy compute instance {ci_id} in GPU instance {gi_id}"
        ci = self._call(index, what, self._nvml.nvmlGpuInstanceGetComputeInstanceById, self._gi(index, gi_id), ci_id)
        self._call(index, what, self._nvml.nvmlComputeInstanceDestroy, ci)

    # ---- MIG devices ---------------------------------------------------------------

    def mig_devices(self, index: int) -> list[MigDevice]:
        """The MIG devices (one per CI) that CUDA and Slurm see, by GI then CI id."""
        found = []
        for mig, gi_id, ci_id in self._mig_handles(index):
            name = _text(
                self._call(index, f"read name of MIG device GI {gi_id} CI {ci_id}", self._nvml.nvmlDeviceGetName, mig)
            )
            uuid = _text(
                self._call(index, f"read UUID of MIG device GI {gi_id} CI {ci_id}", self._nvml.nvmlDeviceGetUUID, mig)
            )
            memory = self._call(
                index, f"read memory of MIG device GI {gi_id} CI {ci_id}", self._nvml.nvmlDeviceGetMemoryInfo, mig
            )
            found.append(MigDevice(uuid, gi_id, ci_id, name, memory.total // _MIB))
        return sorted(found, key=lambda d: (d.gi_id, d.ci_id))

    def _mig_handles(self, index: int) -> list[tuple[object, int, int]]:
        """(handle, GI id, CI id) for each MIG device. Indexes without a device
        (NOT_FOUND) are skipped rather than ending the walk, as go-nvlib does."""
        nvml, handle = self._nvml, self._handle(index)
        count = self._call(
            index,
            "read max MIG device count",
            nvml.nvmlDeviceGetMaxMigDeviceCount,
            handle,
            tolerate=frozenset({NOT_SUPPORTED}),
        )
        found = []
        for j in range(0 if count is _SKIP else count):
            mig = self._call(
                index,
                f"get MIG device {j}",
                nvml.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                j,
                tolerate=frozenset({NOT_FOUND}),
            )
            if mig is not _SKIP:
                gi_id = self._call(
                    index, f"read GPU instance id of MIG device {j}", nvml.nvmlDeviceGetGpuInstanceId, mig
                )
                ci_id = self._call(
                    index, f"read compute instance id of MIG device {j}", nvml.nvmlDeviceGetComputeInstanceId, mig
                )
                found.append((mig, gi_id, ci_id))
        return found


def open_backend(fake_state: str | Path | None) -> NvmlBackend:
    """The backend an entry point uses: real pynvml when ``fake_state`` is None, else the
    fake NVML on that state file. Initialised; use it as a context manager to shut down."""
    if fake_state is None:
        return NvmlBackend(_import_pynvml()).init()
    from .fakenvml import FakeNvml

    fake = FakeNvml(fake_state)
    if not os.path.isfile(fake.state_file):
        raise GpuError(
            "open fake NVML",
            detail=f"state file {fake.state_file} does not exist; create it with `gpushare node fake-nvml init`",
        )
    return NvmlBackend(fake, mig_minors_path=fake.mig_minors_file).init()


def _import_pynvml():
    """pynvml, imported without ``ctypes.util``: pynvml (nvidia-ml-py 13.x) imports its ``find_library`` at the
    top and never calls it, and ctypes.util brings subprocess, tempfile, shutil and random with it: 32 M
    instructions of every hook on a real node, a fifth of pynvml's import (161 -> 129 M, callgrind). During the
    import a stand-in module gives a ``find_library`` that imports the real one if it is ever called; the
    stand-in is gone from sys.modules once pynvml is imported (a ``ctypes.util`` imported before is used as is)."""
    import sys

    standin = None if "ctypes.util" in sys.modules else _ctypes_util_standin(sys)
    if standin is not None:
        sys.modules["ctypes.util"] = standin
    try:
        import pynvml
    except ImportError:
        raise GpuError("load NVML", detail="the pynvml module is not installed (pip install nvidia-ml-py)") from None
    finally:
        if standin is not None and sys.modules.get("ctypes.util") is standin:
            del sys.modules["ctypes.util"]
    return pynvml


def _ctypes_util_standin(sys):
    module = type(sys)("ctypes.util")

    def find_library(name):
        if sys.modules.get("ctypes.util") is module:
            del sys.modules["ctypes.util"]
        from ctypes.util import find_library as real

        return real(name)

    module.find_library = find_library
    return module
