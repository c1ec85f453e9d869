"""A fake NVML with pynvml's names, argument orders, return shapes and error codes.

Why a fake and not mocks: the node runtime's real code (``NvmlBackend``) has
to run unchanged against it, in unit tests and on the docker test cluster's
MIG node, where the prolog, task prolog, epilog and `gpushare` commands are
separate processes that must see one GPU. So:

- every function takes the arguments pynvml's takes, in the same order, with
  the same out-parameters (``ctypes.byref(c_uint())`` counts, ctypes arrays
  the caller allocates, a placement passed by reference);
- results have pynvml's attribute names (``.id``, ``.sliceCount``,
  ``.memorySizeMB``, ``.placement.start``, ``c_nvmlMemory_t.total``);
- failures raise ``NVMLError`` subclasses named and numbered as pynvml's,
  decided by the MIG rules in the hardware catalogue (placements, overlap,
  max instances, in-use), never by what a test would like;
- state is a JSON file changed under an fcntl lock, read-modify-write per
  call, so several processes share one GPU state;
- anything it does not model raises ``NotImplementedError`` by name;
- test-side controls stand in for what happens outside NVML: processes
  starting and exiting, an admin's ``nvidia-smi -mig``, another client
  holding a GPU instance, the node rebooting (every instance lost), and
  per-call latencies (kept in the state, slept in the calling process).

pynvml is not needed: the constants and error classes are defined here with
the values of nvidia-ml-py 13.615.71 (tests compare them when it is installed).
Parts of NVML whose real behaviour neither NVIDIA's documentation nor a
transcript confirms raise NotImplementedError instead of guessing.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import sys
from contextlib import contextmanager

from ..atomic import atomic_write
from ..errors import GpushareError
from ..hardware import CatalogueError, GpuModel, MigProfile, get_model
from ..records import record
from .migminors import mig_minors_path, mig_minors_text

TYPE_CHECKING = False  # typing costs every node hook a few ms at start-up: for type checkers only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import ClassVar, NoReturn

# ---- constants: names and values as in pynvml (NVML-H) ----------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1

NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1  # support removed (NVML-H: "Support Removed")
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_COMPUTEMODE_COUNT = 4

NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX = 0xC
NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME = 0xD
NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME = 0xE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME = 0xF
NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME = 0x10
NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX = 0x11
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL = 0x8
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9

NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT = 0x1

NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16

NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # hardLimit meaning "no limit" (nvmlSetMemoryLimits_v1_t)

nvmlGpuInstanceProfileInfo_v2 = 0x02000098
nvmlComputeInstanceProfileInfo_v2 = 0x02000088

# Per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1, "MPS v3 memory partitioning") come with driver
# r615 / CUDA 13.4 (NVIDIA's MPS documentation); an older libnvidia-ml has no such symbol, which pynvml
# reports as NVML_ERROR_FUNCTION_NOT_FOUND. The fake's driver is r580 unless built or set otherwise.
DEFAULT_DRIVER = "580.65.06"
MEMORY_LIMITS_DRIVER = 615
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
_NOT_MIG = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG (NVML-H)
_MIB = 1 << 20

# The calls a test (or the docker test cluster) can slow down with ``FakeNvml.set_latency``: the ones NVIDIA's own
# code says can be slow. Each is slept once per call, in the calling process, after the call's effect is made.
LATENCY_CALLS = (
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceGetMigDeviceHandleByIndex",
)
# Orders of magnitude from the author comments in NVIDIA's DRA driver (k8s-dra-driver-gpu @22407113,
# cmd/gpu-kubelet-plugin/nvlib.go; comments, not benchmarks): a device handle by UUID "O(10 s)" uncached or
# concurrent (118, 932); "walking all MIG devices" O(10 s) under load (1019-1024), here spread over the 7
# MIG-device indexes a 7-slice GPU walks; a GPU instance destroy O(1 s) (1137). No public figure exists for
# creating a GPU or compute instance or destroying a compute instance: those stay 0.
DRA_OBSERVED_LATENCIES = {
    "nvmlDeviceGetHandleByUUID": 10.0,
    "nvmlGpuInstanceDestroy": 1.0,
    "nvmlDeviceGetMigDeviceHandleByIndex": 10.0 / 7,
}


# ---- errors: pynvml's class layout (NVMLError(value) returns the subclass) ---


class NVMLError(Exception):
    """pynvml's error base: ``.value`` is the NVML_ERROR_* code."""

    _valClassMapping: ClassVar[dict[int, type]] = {}

    def __new__(typ, value):
        if typ is NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __init__(self, value=None):
        super().__init__(self.value)

    def __str__(self):
        return _ERROR_NAMES.get(self.value, f"NVML Error with code {self.value}")


def _error_names() -> dict[int, str]:
    return {v: k for k, v in globals().items() if k.startswith("NVML_ERROR_")}


def _make_error_classes() -> None:
    """NVMLError_<CamelCase> per code, named exactly as pynvml's _extractNVMLErrorsAsClasses does."""
    module = sys.modules[__name__]
    for name, value in list(vars(module).items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + "".join(w.capitalize() for w in name.replace("NVML_ERROR_", "").split("_"))

        def new(typ, *args, _value=value):
            return NVMLError.__new__(typ, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_ERROR_NAMES = _error_names()
_make_error_classes()


class FakeNvmlError(GpushareError):
    """Misuse of the fake's own builder or test helpers (not an NVML failure)."""


# ---- structures: pynvml's field names and ctypes layouts ----------------------


class _Printable(ctypes.Structure):
    """Like pynvml's _PrintableStructure: char arrays read back as str."""

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        return value.decode() if isinstance(value, bytes) else value


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlComputeInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


_GI_PROFILE_FIELDS = [
    ("id", ctypes.c_uint),
    ("isP2pSupported", ctypes.c_uint),
    ("sliceCount", ctypes.c_uint),
    ("instanceCount", ctypes.c_uint),
    ("multiprocessorCount", ctypes.c_uint),
    ("copyEngineCount", ctypes.c_uint),
    ("decoderCount", ctypes.c_uint),
    ("encoderCount", ctypes.c_uint),
    ("jpegCount", ctypes.c_uint),
    ("ofaCount", ctypes.c_uint),
    ("memorySizeMB", ctypes.c_ulonglong),
]


class c_nvmlGpuInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = _GI_PROFILE_FIELDS


class c_nvmlGpuInstanceProfileInfo_v2_t(_Printable):
    _fields_ = [
        ("version", ctypes.c_uint),
        *_GI_PROFILE_FIELDS,
        ("name", ctypes.c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self):
        super().__init__(version=nvmlGpuInstanceProfileInfo_v2)


_CI_PROFILE_FIELDS = [
    ("id", ctypes.c_uint),
    ("sliceCount", ctypes.c_uint),
    ("instanceCount", ctypes.c_uint),
    ("multiprocessorCount", ctypes.c_uint),
    ("sharedCopyEngineCount", ctypes.c_uint),
    ("sharedDecoderCount", ctypes.c_uint),
    ("sharedEncoderCount", ctypes.c_uint),
    ("sharedJpegCount", ctypes.c_uint),
    ("sharedOfaCount", ctypes.c_uint),
]


class c_nvmlComputeInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = _CI_PROFILE_FIELDS


class c_nvmlComputeInstanceProfileInfo_v2_t(_Printable):
    _fields_ = [
        ("version", ctypes.c_uint),
        *_CI_PROFILE_FIELDS,
        ("name", ctypes.c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self):
        super().__init__(version=nvmlComputeInstanceProfileInfo_v2)


class c_nvmlMemory_t(_Printable):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlSetMemoryLimits_v1_t(_Printable):
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong), ("hardLimit", ctypes.c_ulonglong)]


class c_nvmlGetMemoryLimits_v1_t(_Printable):
    _fields_ = [
        ("nameSpace", ctypes.c_char_p),
        ("softLimit", ctypes.c_ulonglong),
        ("hardLimit", ctypes.c_ulonglong),
        ("currentUsed", ctypes.c_ulonglong),
    ]


class nvmlPciInfo_t(_Printable):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


# Handle types. pynvml's are opaque ctypes pointers; callers only allocate
# arrays of them and pass elements back, so py_object arrays carry the fake's
# handle objects through the same code.
c_nvmlDevice_t = ctypes.py_object
c_nvmlGpuInstance_t = ctypes.py_object
c_nvmlComputeInstance_t = ctypes.py_object


class nvmlFriendlyObject:
    """pynvml's plain-attribute object (what process queries return)."""

    def __init__(self, dictionary):
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self):
        return str(self.__dict__)


@record
class _GpuInstanceInfo:
    """nvmlGpuInstanceInfo_t's attributes (device, id, profileId, placement)."""

    device: object
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


@record
class _ComputeInstanceInfo:
    """nvmlComputeInstanceInfo_t's attributes."""

    device: object
    gpuInstance: object
    id: int
    profileId: int
    placement: c_nvmlComputeInstancePlacement_t


# ---- handles: what the fake hands out; ``serial`` makes stale handles fail ----


@record
class _Device:
    index: int


@record
class _Gi:
    index: int
    gi: int
    serial: int


@record
class _Ci:
    index: int
    gi: int
    ci: int
    serial: int


@record
class _Mig:
    index: int
    gi: int
    ci: int
    serial: int


def _fail(code: int) -> NoReturn:
    raise NVMLError(code)


def _unconfirmed(what: str):
    raise NotImplementedError(f"fake NVML does not implement {what}: real behaviour unconfirmed")


# ---- out-parameters, checked as strictly as C would need them ----------------


def _out_uint(ref) -> ctypes.c_uint:
    """The c_uint behind ``ctypes.byref(c_uint())`` (or a pointer to one)."""
    target = getattr(ref, "_obj", None) if type(ref).__name__ == "CArgObject" else None
    if target is None and isinstance(ref, ctypes._Pointer):
        target = ref.contents
    if not isinstance(target, ctypes.c_uint):
        raise TypeError(f"count must be ctypes.byref(ctypes.c_uint()), got {ref!r}")
    return target


def _by_ref(ref, cls):
    """A structure passed by reference: the C API takes a pointer, and pynvml passes the argument straight through."""
    target = getattr(ref, "_obj", None) if type(ref).__name__ == "CArgObject" else None
    if target is None and isinstance(ref, ctypes._Pointer):
        target = ref.contents
    if not isinstance(target, cls):
        raise TypeError(f"pass ctypes.byref({cls.__name__}()): the C function takes a pointer, got {ref!r}")
    return target


def _array(ref, elem_type):
    if ref is not None and not (isinstance(ref, ctypes.Array) and ref._type_ is elem_type):
        raise TypeError(f"expected None or a ctypes array of {elem_type.__name__}, got {ref!r}")
    return ref


def _fill(array, items, count_ref) -> None:
    """Write ``items`` into the caller's array: too small is INSUFFICIENT_SIZE, as in NVML."""
    count = _out_uint(count_ref)
    if array is not None and len(array) < len(items):
        count.value = len(items)
        _fail(NVML_ERROR_INSUFFICIENT_SIZE)
    count.value = len(items)
    for i, item in enumerate(items if array is not None else ()):
        array[i] = item


# ---- derived values ------------------------------------------------------------


def _uuid(prefix: str, *parts: object) -> str:
    """A uuid4-shaped id derived from ``parts``: deterministic, so state files diff cleanly."""
    import hashlib  # here: building a fake only, not every hook's open
    import uuid as uuidlib

    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:16]

    return f"{prefix}-{uuidlib.UUID(bytes=digest, version=4)}"


def _gi_id_range(model: GpuModel, profile: MigProfile) -> range:
    """GI ids the driver uses for this instance size: 0 for the whole GPU, 1-2 for
    halves, 3-6 quarters, 7-14 eighths (matches the GI ids in the MIG User Guide's
    "Getting Started with MIG" transcripts).
    Which one an instance gets depends on what exists, so callers must ask."""
    parts = model.memory_slices // profile.memory_slices
    if parts < 1 or parts & (parts - 1):
        return range(15)
    level = parts.bit_length() - 1
    return range(2**level - 1, 2 ** (level + 1) - 1)


def _ci_profiles(profile: MigProfile) -> dict[int, tuple[str, int]]:
    """{CI profile constant: (CI name, compute slices)} allowed inside a GI of ``profile``."""
    out = {}
    for name, constant in profile.compute_profiles:
        slices = profile.compute_slices if name == profile.name else int(name.split("c.", 1)[0])
        out[constant] = (name, slices)
    return out


def _profile_by_id(model: GpuModel, profile_id: int) -> MigProfile:
    try:
        return model.profile_for_id(profile_id)
    except CatalogueError:
        _fail(NVML_ERROR_INVALID_ARGUMENT)


def _ci_by_serial(gi: dict, ci_id: int, serial: int | None = None) -> dict:
    for ci in gi["cis"]:
        if ci["id"] == ci_id and serial in (None, ci["serial"]):
            return ci
    _fail(NVML_ERROR_INVALID_ARGUMENT if serial is not None else NVML_ERROR_NOT_FOUND)


def _mig_devices(gpu: dict) -> list[tuple[dict, dict]]:
    """(GI, CI) pairs in MIG-device index order: by GI id, then CI id."""
    return [
        (gi, ci)
        for gi in sorted(gpu["instances"], key=lambda g: g["id"])
        for ci in sorted(gi["cis"], key=lambda c: c["id"])
    ]


def _process_object(proc: dict, gi: int, ci: int):
    return nvmlFriendlyObject(
        {"pid": proc["pid"], "usedGpuMemory": proc["used_mib"] * _MIB, "gpuInstanceId": gi, "computeInstanceId": ci}
    )


def _write_json(path: str | os.PathLike[str], data: dict) -> None:
    # 0644: other users' processes (task prolog, jobs) read GPU state too.
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True), 0o644)


# ---- the fake ------------------------------------------------------------------

# /2 adds "latencies" and a GPU instance's "held" (another client holds it); /1 states are read as /2 with
# neither, and written back as /2.
STATE_FORMAT = "gpushare-fake-nvml/2"
STATE_FORMAT_1 = "gpushare-fake-nvml/1"
READ_FORMATS = (STATE_FORMAT, STATE_FORMAT_1)


class FakeNvml:
    """A pynvml-like object over one JSON state file (see the module docstring).

    Give it to ``NvmlBackend`` where the real ``pynvml`` module would go. The
    methods whose names start with ``nvml`` are the NVML API; ``build``,
    ``add_process``, ``remove_process``, ``set_mig_mode``,
    ``hold_gpu_instance``, ``reboot``, ``unload_driver`` and ``set_latency``
    are test-side helpers standing in for things outside NVML (installing
    GPUs, a CUDA application starting, an admin running ``nvidia-smi -mig``,
    another NVML client, the node restarting, a slow driver).
    """

    NVMLError = NVMLError

    def __init__(self, state_path: str | os.PathLike, euid: int | None = None, sleep=None):
        """``euid``: the effective uid root-only calls are judged by (default: this process's, read per call).
        ``sleep``: what waits out a call's latency (default ``time.sleep``; tests pass a recorder)."""
        self.state_file = os.fspath(state_path)  # str, and pathlib imported only when asked: the hooks open a fake
        self.mig_minors_file = mig_minors_path(self.state_file)  # on every job, and pathlib costs them ~17 M
        self._lock_path = self.state_file + ".lock"
        self._inits = 0
        self._euid = euid
        self._sleep = sleep

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"fake NVML does not implement {name}")

    @property
    def state_path(self) -> Path:
        from pathlib import Path

        return Path(self.state_file)

    @property
    def mig_minors_path(self) -> Path:
        """Where this fake's /proc/driver/nvidia-caps/mig-minors lives (next to the state)."""
        from pathlib import Path

        return Path(self.mig_minors_file)

    # ---- builder and helpers -------------------------------------------------

    @classmethod
    def build(
        cls,
        state_path,
        model: str = "H100-SXM5-80GB",
        count: int = 8,
        mig_enabled=(4, 5),
        minors=None,
        seed: str = "",
        driver: str = DEFAULT_DRIVER,
        cgroup_root: str = DEFAULT_CGROUP_ROOT,
    ) -> FakeNvml:
        """Write a fresh state: ``count`` GPUs of ``model``, MIG mode on for ``mig_enabled``
        (no instances yet), device minors ``minors`` (default: equal to the index), driver version
        ``driver`` (r615+ offers per-cgroup memory limits), cgroup v2 mounted at ``cgroup_root``.
        Replacing a fake state carries its serial on, so no MIG UUID is issued twice on one path (the docker
        test cluster builds its nodes' states again at every container start, a reboot there)."""
        gpu_model = _builder_model(model)
        minors = list(range(count)) if minors is None else list(minors)
        _check_build(gpu_model, count, list(mig_enabled), minors)
        _driver_major(driver)
        fake = cls(state_path)
        gpus = [_new_gpu(gpu_model, i, minors[i], i in set(mig_enabled), seed) for i in range(count)]
        fake.state_path.parent.mkdir(parents=True, exist_ok=True)
        with fake._locked(write=True, fresh=True) as state:
            state.update(
                {
                    "format": STATE_FORMAT,
                    "serial": _carried_serial(fake.state_file),
                    "gpus": gpus,
                    "driver_version": driver,
                    "cgroup_root": str(cgroup_root),
                }
            )
        _write_text(fake.mig_minors_path, mig_minors_text())
        return fake

    def add_process(
        self, index: int, pid: int, gi: int | None = None, ci: int | None = None, used_mib: int = 0
    ) -> None:
        """A CUDA process appears on GPU ``index`` (on MIG GPUs: on compute instance ``gi``/``ci``)."""
        with self._locked(write=True) as state:
            gpu = _helper_gpu(state, index)
            _check_process_target(gpu, gi, ci)
            gpu["processes"].append({"pid": pid, "used_mib": used_mib, "gi": gi, "ci": ci})

    def remove_process(self, pid: int) -> None:
        """Process ``pid`` exits (from every GPU it used)."""
        with self._locked(write=True) as state:
            found = False
            for gpu in state["gpus"]:
                before = len(gpu["processes"])
                gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != pid]
                found = found or len(gpu["processes"]) != before
            if not found:
                raise FakeNvmlError(f"fake NVML {self.state_file}: no process {pid} on any GPU")

    def set_mig_mode(self, index: int, current: bool, pending: bool | None = None) -> None:
        """What an admin's `nvidia-smi -mig` would leave behind (the suite never does this)."""
        with self._locked(write=True) as state:
            gpu = _helper_gpu(state, index)
            if not get_model(gpu["model"]).mig_capable:
                raise FakeNvmlError(f"fake GPU {index} ({gpu['model']}) does not support MIG")
            if not current and gpu["instances"]:
                raise FakeNvmlError(f"fake GPU {index} still has MIG instances; destroy them before disabling MIG")
            if current and gpu.get("compute_mode") == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                raise FakeNvmlError(
                    f"fake GPU {index} is in compute mode EXCLUSIVE_PROCESS, which MIG mode does not "
                    "support; set DEFAULT first"
                )
            gpu["mig_current"] = int(current)
            gpu["mig_pending"] = int(current if pending is None else pending)

    def set_driver(self, version: str) -> None:
        """An admin installs another driver (its version as nvidia-smi prints it, e.g. 615.20.01)."""
        _driver_major(version)
        with self._locked(write=True) as state:
            state["driver_version"] = version

    def mount_cgroup2(self, root: str | os.PathLike) -> None:
        """The node's cgroup v2 hierarchy is at ``root`` (a test's directory tree instead of /sys/fs/cgroup)."""
        with self._locked(write=True) as state:
            state["cgroup_root"] = str(root)

    def hold_gpu_instance(self, index: int, gi_id: int, held: bool = True) -> None:
        """Another NVML client (a monitoring agent, an admin's nvidia-smi) holds GPU instance ``gi_id`` on GPU
        ``index``: destroying it gives IN_USE ("In use by another client") until ``held=False``, while its compute
        instances can still be destroyed: the partial cleanup NVIDIA's DRA driver reports "seen in practice"
        (nvlib.go 1116-1137). When real drivers do this is not documented, so the fake never does it by itself."""
        with self._locked(write=True) as state:
            gpu = _helper_gpu(state, index)
            gi = next((g for g in gpu["instances"] if g["id"] == gi_id), None)
            if gi is None:
                raise FakeNvmlError(f"fake GPU {index} has no GPU instance {gi_id}")
            if held:
                gi["held"] = True
            else:
                gi.pop("held", None)

    def reboot(self) -> None:
        """The node restarts. Every GPU and compute instance is gone (MIG-GS: MIG devices do not survive a reboot
        or GPU reset), every process is killed, compute modes are DEFAULT again (NVML-H nvmlDeviceSetComputeMode:
        on Linux "not persistent across reboots"), per-cgroup memory limits go with their cgroups. GPU UUIDs stay;
        instances made afterwards get new MIG UUIDs (the serial goes on), GI ids start over. A100/A30
        (catalogue ``mig_mode_reset``) keep MIG mode across reboots, and a pending mode becomes current (the reboot
        resets the GPU; MIG-DC); Hopper and later lose it with the driver's unload (MIG-GS): `gpushare node boot`
        enables it again before slurmd starts. ``unload_driver`` is the unload alone."""
        with self._locked(write=True) as state:
            for gpu in state["gpus"]:
                _clear_driver_state(gpu)
                gpu["compute_mode"] = NVML_COMPUTEMODE_DEFAULT
                gpu.pop("memory_limits", None)
                model = get_model(gpu["model"])
                if model.mig_capable:
                    gpu["mig_current"] = gpu["mig_pending"] if model.mig_mode_reset else 0
                    gpu["mig_pending"] = gpu["mig_current"]

    def gpu_models(self) -> list[str]:
        """The catalogue model of each fake GPU, in index order (what ``build`` was given)."""
        with self._locked(write=False) as state:
            return [gpu["model"] for gpu in state["gpus"]]

    def unload_driver(self) -> None:
        """The NVIDIA kernel module is unloaded and loaded again on a Hopper node: MIG mode is lost (MIG-GS), and
        with it every GPU and compute instance. Refused while processes use the GPUs (the module is in use).
        Only Hopper GPUs with default compute mode and no memory limits: what an unload does to Ampere's
        instances, or to those settings, no source says (NotImplementedError)."""
        with self._locked(write=True) as state:
            _check_unload(state["gpus"])
            for gpu in state["gpus"]:
                _clear_driver_state(gpu)
                gpu["mig_current"] = gpu["mig_pending"] = 0

    def set_latency(self, call: str, seconds: float) -> None:
        """Every later ``call`` (one of LATENCY_CALLS) takes ``seconds`` longer, in every process on this state
        (the docker test cluster's hooks too). The calling process sleeps it after the call's effect is made, so
        a caller killed meanwhile leaves the change made and unreported. 0 removes it."""
        if call not in LATENCY_CALLS:
            raise FakeNvmlError(f"no latency for {call!r}; settable: {', '.join(LATENCY_CALLS)}")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < float("inf"):
            raise FakeNvmlError(f"latency of {call} must be a finite number of seconds >= 0, not {seconds!r}")
        with self._locked(write=True) as state:
            latencies = state.setdefault("latencies", {})
            if seconds:
                latencies[call] = float(seconds)
            else:
                latencies.pop(call, None)

    def latencies(self) -> dict[str, float]:
        """Seconds each of LATENCY_CALLS takes now (0.0 where none is set)."""
        with self._locked(write=False) as state:
            return {call: float(state.get("latencies", {}).get(call, 0.0)) for call in LATENCY_CALLS}

    # ---- state file ----------------------------------------------------------

    @contextmanager
    def _locked(self, write: bool, fresh: bool = False):
        """Hold the lock for one whole read-modify-write; an exception leaves the file untouched."""
        with self._open_lock(write) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            state = {} if fresh else self._load()
            yield state
            if write:
                _write_json(self.state_file, state)

    def _open_lock(self, write: bool):
        """Readers open the lock read-only, so an unprivileged process (a task
        prolog) can share a root-written state; flock does not need write access."""
        if write or not os.path.exists(self._lock_path):
            fd = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            return os.fdopen(fd, "a", encoding="utf-8")
        return open(self._lock_path, encoding="utf-8")

    def _load(self) -> dict:
        try:
            with open(self.state_file, encoding="utf-8") as fh:
                state = json.loads(fh.read())
        except FileNotFoundError:
            raise FakeNvmlError(
                f"fake NVML state {self.state_file} does not exist; create it with `gpushare node fake-nvml init`"
            ) from None
        if not isinstance(state, dict) or state.get("format") not in READ_FORMATS:
            raise FakeNvmlError(f"{self.state_file} is not a fake NVML state ({' or '.join(READ_FORMATS)})")
        state["format"] = STATE_FORMAT  # a /1 state is a /2 state without latencies or held instances
        return state

    @contextmanager
    def _nvml(self, write: bool = False, timed: str | None = None):
        """An NVML call: initialised first (UNINITIALIZED otherwise), then locked state. ``timed``: the call's
        name in LATENCY_CALLS; its latency is slept after the lock is released, whether the call succeeded or
        failed (a call that reached the driver took its time either way)."""
        if not self._inits:
            _fail(NVML_ERROR_UNINITIALIZED)
        delay = 0.0
        try:
            with self._locked(write) as state:
                delay = state.get("latencies", {}).get(timed, 0.0) if timed else 0.0
                yield state
        finally:
            if delay:
                self._wait(delay)

    def _wait(self, seconds: float) -> None:
        if self._sleep is None:
            import time  # here: only a fake given latencies sleeps

            self._sleep = time.sleep
        self._sleep(seconds)

    # ---- handle resolution ---------------------------------------------------

    def _gpu(self, state: dict, handle) -> dict:
        if not isinstance(handle, _Device) or not 0 <= handle.index < len(state["gpus"]):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        return state["gpus"][handle.index]

    def _mig_gpu(self, state: dict, handle) -> dict:
        """A parent GPU on which MIG calls are allowed: MIG-capable and MIG mode on."""
        gpu = self._gpu(state, handle)
        if not get_model(gpu["model"]).mig_capable or not gpu["mig_current"]:
            _fail(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, state: dict, handle) -> tuple[dict, dict]:
        if not isinstance(handle, _Gi):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._mig_gpu(state, _Device(handle.index))
        for gi in gpu["instances"]:
            if gi["id"] == handle.gi and gi["serial"] == handle.serial:
                return gpu, gi
        _fail(NVML_ERROR_INVALID_ARGUMENT)  # destroyed since: the handle is stale

    def _ci(self, state: dict, handle) -> tuple[dict, dict, dict]:
        if not isinstance(handle, _Ci):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._mig_gpu(state, _Device(handle.index))
        for gi in gpu["instances"]:
            if gi["id"] == handle.gi:
                return gpu, gi, _ci_by_serial(gi, handle.ci, handle.serial)
        _fail(NVML_ERROR_INVALID_ARGUMENT)

    def _mig(self, state: dict, handle) -> tuple[dict, dict, dict]:
        gpu, gi, ci = self._ci(state, _Ci(handle.index, handle.gi, handle.ci, handle.serial))
        return gpu, gi, ci

    def _any_device(self, state: dict, handle) -> tuple[dict, tuple[dict, dict] | None]:
        """A parent or a MIG device handle: (GPU, (GI, CI) or None)."""
        if isinstance(handle, _Mig):
            gpu, gi, ci = self._mig(state, handle)
            return gpu, (gi, ci)
        return self._gpu(state, handle), None

    # ---- init, identity --------------------------------------------------------

    def nvmlInit(self):
        return self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags):
        if not os.path.exists(self.state_file):
            _fail(NVML_ERROR_DRIVER_NOT_LOADED)
        self._inits += 1

    def nvmlShutdown(self):
        if not self._inits:
            _fail(NVML_ERROR_UNINITIALIZED)
        self._inits -= 1

    def nvmlErrorString(self, result):
        return _ERROR_NAMES.get(result, f"NVML Error with code {result}")

    def nvmlDeviceGetCount(self):
        with self._nvml() as state:
            return len(state["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index):
        with self._nvml() as state:
            self._gpu(state, _Device(index))
        return _Device(index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        with self._nvml(timed="nvmlDeviceGetHandleByUUID") as state:
            for gpu in state["gpus"]:
                if gpu["uuid"] == wanted:
                    return _Device(gpu["index"])
                for gi, ci in _mig_devices(gpu):
                    if ci["uuid"] == wanted:
                        return _Mig(gpu["index"], gi["id"], ci["id"], ci["serial"])
            _fail(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle):
        with self._nvml() as state:
            gpu, mig = self._any_device(state, handle)
            model = get_model(gpu["model"])
            if mig is None:
                return model.nvml_names[0]
            gi, ci = mig
            ci_name = _ci_profiles(model.profile_for_id(gi["profile_id"]))[ci["profile_id"]][0]
            return f"{model.nvml_names[0]} MIG {ci_name}"

    def nvmlDeviceGetUUID(self, handle):
        with self._nvml() as state:
            gpu, mig = self._any_device(state, handle)
            return gpu["uuid"] if mig is None else mig[1]["uuid"]

    def nvmlDeviceGetMinorNumber(self, handle):
        if isinstance(handle, _Mig):
            _unconfirmed("nvmlDeviceGetMinorNumber on a MIG device handle")
        with self._nvml() as state:
            return self._gpu(state, handle)["minor"]

    def nvmlDeviceGetPciInfo(self, handle):
        if isinstance(handle, _Mig):
            _unconfirmed("nvmlDeviceGetPciInfo on a MIG device handle")
        with self._nvml() as state:
            gpu = self._gpu(state, handle)
        info = nvmlPciInfo_t()
        info.domain, info.bus, info.device = 0, gpu["pci_bus"], 0
        info.pciDeviceId = gpu["pci_device_id"]
        info.busId = b"%08X:%02X:%02X.0" % (0, gpu["pci_bus"], 0)
        info.busIdLegacy = b"%04X:%02X:%02X.0" % (0, gpu["pci_bus"], 0)
        return info

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version:
            raise NotImplementedError("fake NVML does not implement nvmlDeviceGetMemoryInfo version 2")
        with self._nvml() as state:
            gpu, mig = self._any_device(state, handle)
            model = get_model(gpu["model"])
            if mig is None:
                total, procs = model.memory_mib, gpu["processes"]
            else:
                gi, ci = mig
                total = model.profile_for_id(gi["profile_id"]).memory_mib
                procs = [p for p in gpu["processes"] if (p["gi"], p["ci"]) == (gi["id"], ci["id"])]
        used = min(total, sum(p["used_mib"] for p in procs))
        return c_nvmlMemory_t(total * _MIB, (total - used) * _MIB, used * _MIB)

    # ---- MIG mode and GPU-instance profiles ------------------------------------

    def nvmlDeviceGetMigMode(self, device):
        with self._nvml() as state:
            gpu = self._gpu(state, device)
            if not get_model(gpu["model"]).mig_capable:
                _fail(NVML_ERROR_NOT_SUPPORTED)
            return [gpu["mig_current"], gpu["mig_pending"]]

    def nvmlDeviceSetMigMode(self, device, mode):
        """Hopper and later (catalogue ``mig_mode_reset`` false): the mode changes at once, without a reset, and
        the call returns the activation status: NVML_SUCCESS, or NVML_ERROR_IN_USE while processes use the GPU
        ("if device unbind fails because the device isn't idle", NVML-H), the mode then unchanged. What an A100 or
        A30 does (a pending mode, a reset the caller must make) and disabling the mode under live instances no
        source shows as NVML returns it: NotImplementedError. Root only on real GPUs: not modelled."""
        if isinstance(device, _Mig):
            _unconfirmed("nvmlDeviceSetMigMode on a MIG device handle")
        if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        with self._nvml(write=True) as state:
            gpu = self._gpu(state, device)
            model = get_model(gpu["model"])
            if not model.mig_capable:
                _fail(NVML_ERROR_NOT_SUPPORTED)
            if model.mig_mode_reset:
                _unconfirmed(f"nvmlDeviceSetMigMode on a {model.name} (MIG mode takes a GPU reset there)")
            if mode == NVML_DEVICE_MIG_DISABLE and gpu["instances"]:
                _unconfirmed("nvmlDeviceSetMigMode disabling MIG mode while GPU instances exist")
            if mode == NVML_DEVICE_MIG_ENABLE and gpu.get("compute_mode") == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                _unconfirmed("nvmlDeviceSetMigMode enabling MIG mode in compute mode EXCLUSIVE_PROCESS")
            if gpu["processes"]:
                return NVML_ERROR_IN_USE
            gpu["mig_current"] = gpu["mig_pending"] = mode
            return NVML_SUCCESS

    # ---- driver, per-cgroup memory limits (MPS v3 memory partitioning) ------------------

    def nvmlSystemGetDriverVersion(self):
        with self._nvml() as state:
            return _driver(state)

    def nvmlDeviceSetMemoryLimits_v1(self, device, limits):
        """Root sets the memory a cgroup's processes may allocate on a non-MIG GPU (r615+): softLimit
        (guaranteed; dmem.min) and hardLimit (allocations beyond fail; dmem.max), in bytes; softLimit 0 with
        hardLimit NVML_DEVICE_MEMORY_LIMIT_MAX clears them (nvmlSetMemoryLimits_v1_t). ``limits`` is the
        structure itself: pynvml passes it by reference. What NVIDIA does not document is refused loudly."""
        target = _limits_struct(limits, c_nvmlSetMemoryLimits_v1_t)
        with self._nvml(write=True) as state:
            gpu = self._limits_gpu(state, device)
            if (os.geteuid() if self._euid is None else self._euid) != 0:
                _fail(NVML_ERROR_NO_PERMISSION)
            path = _cgroup_path(state, target.nameSpace)
            soft, hard = target.softLimit, target.hardLimit
            limits_of = gpu.setdefault("memory_limits", {})
            if soft == 0 and hard == NVML_DEVICE_MEMORY_LIMIT_MAX:
                limits_of.pop(path, None)
                return
            if hard == 0 or soft > hard or hard > get_model(gpu["model"]).memory_mib * _MIB:
                _unconfirmed(
                    f"nvmlDeviceSetMemoryLimits_v1 with softLimit {soft}, hardLimit {hard} (zero, soft above "
                    "hard, or above the GPU's memory)"
                )
            limits_of[path] = {"soft": soft, "hard": hard}

    def nvmlDeviceGetMemoryLimits_v1(self, device, limits):
        """The limits set for ``limits.nameSpace`` (none: softLimit 0, hardLimit NVML_DEVICE_MEMORY_LIMIT_MAX).
        currentUsed is 0: the fake does not place processes in cgroups."""
        target = _limits_struct(limits, c_nvmlGetMemoryLimits_v1_t)
        with self._nvml() as state:
            gpu = self._limits_gpu(state, device)
            found = gpu.get("memory_limits", {}).get(_cgroup_path(state, target.nameSpace))
        target.softLimit = found["soft"] if found else 0
        target.hardLimit = found["hard"] if found else NVML_DEVICE_MEMORY_LIMIT_MAX
        target.currentUsed = 0

    def _limits_gpu(self, state: dict, device) -> dict:
        """A GPU memory limits apply to: the driver has the function (r615+), the handle is a whole GPU, MIG is off
        ("MIG handles are not supported"; MIG is "explicitly unsupported")."""
        if _driver_major(_driver(state)) < MEMORY_LIMITS_DRIVER:
            _fail(NVML_ERROR_FUNCTION_NOT_FOUND)
        if isinstance(device, _Mig):
            _fail(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(state, device)
        if gpu["mig_current"]:
            _fail(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # ---- compute mode --------------------------------------------------------------

    def nvmlDeviceGetComputeMode(self, handle):
        if isinstance(handle, _Mig):
            _unconfirmed("nvmlDeviceGetComputeMode on a MIG device handle")
        with self._nvml() as state:
            return self._gpu(state, handle).get("compute_mode", NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceSetComputeMode(self, handle, mode):
        """EXCLUSIVE_THREAD's support was removed (NOT_SUPPORTED); EXCLUSIVE_PROCESS is not supported
        while MIG mode is on (MIG user guide, MPS on MIG). Root only on real GPUs: not modelled."""
        if isinstance(handle, _Mig):
            _unconfirmed("nvmlDeviceSetComputeMode on a MIG device handle")
        if mode not in (
            NVML_COMPUTEMODE_DEFAULT,
            NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
            NVML_COMPUTEMODE_PROHIBITED,
            NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        with self._nvml(write=True) as state:
            gpu = self._gpu(state, handle)
            if mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD:
                _fail(NVML_ERROR_NOT_SUPPORTED)
            if mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS and gpu["mig_current"]:
                _fail(NVML_ERROR_NOT_SUPPORTED)
            gpu["compute_mode"] = mode

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile, version=2):
        if version not in (1, 2):
            _fail(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        with self._nvml() as state:
            model = get_model(self._mig_gpu(state, device)["model"])
        try:
            found = model.profile_for_constant(profile)
        except CatalogueError:
            _fail(NVML_ERROR_NOT_SUPPORTED)
        return _gi_profile_info(found, version)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device, profileId, placementsRef, countRef):
        """The profile's whole placement table, occupied or not, and with MIG mode on or off (NVML-H: "all the
        possible placements for the given profile regardless of whether MIG is enabled or not"): what is free
        now is for the caller to work out (``nvmlDeviceGetGpuInstanceRemainingCapacity`` counts it)."""
        array = _array(placementsRef, c_nvmlGpuInstancePlacement_t)
        with self._nvml() as state:
            model = get_model(self._gpu(state, device)["model"])
            if not model.mig_capable:
                _fail(NVML_ERROR_NOT_SUPPORTED)
            profile = _profile_by_id(model, profileId)
        _fill(array, [c_nvmlGpuInstancePlacement_t(s, profile.memory_slices) for s in profile.placements], countRef)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device, profileId):
        with self._nvml() as state:
            gpu = self._mig_gpu(state, device)
            model = get_model(gpu["model"])
            profile = _profile_by_id(model, profileId)
            return _remaining(model, gpu, profile)

    # ---- GPU instances -----------------------------------------------------------

    def nvmlDeviceCreateGpuInstance(self, device, profileId):
        raise NotImplementedError(
            "fake NVML does not implement nvmlDeviceCreateGpuInstance (driver-chosen placement); "
            "use nvmlDeviceCreateGpuInstanceWithPlacement"
        )

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId, placement):
        want = _by_ref(placement, c_nvmlGpuInstancePlacement_t)
        with self._nvml(write=True, timed="nvmlDeviceCreateGpuInstanceWithPlacement") as state:
            gpu = self._mig_gpu(state, device)
            model = get_model(gpu["model"])
            profile = _profile_by_id(model, profileId)
            if _fit_problem(model, gpu, profile, want.start, want.size) is not None:
                _fail(NVML_ERROR_INSUFFICIENT_RESOURCES)
            record = _new_gi(state, gpu, model, profile, want.start)
            return _Gi(gpu["index"], record["id"], record["serial"])

    def nvmlDeviceGetGpuInstances(self, device, profileId, gpuInstancesRef, countRef):
        array = _array(gpuInstancesRef, c_nvmlGpuInstance_t)
        with self._nvml() as state:
            gpu = self._mig_gpu(state, device)
            _profile_by_id(get_model(gpu["model"]), profileId)
            found = [
                _Gi(gpu["index"], g["id"], g["serial"])
                for g in sorted(gpu["instances"], key=lambda g: g["id"])
                if g["profile_id"] == profileId
            ]
        _fill(array, found, countRef)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId):
        with self._nvml() as state:
            gpu = self._mig_gpu(state, device)
            for gi in gpu["instances"]:
                if gi["id"] == gpuInstanceId:
                    return _Gi(gpu["index"], gi["id"], gi["serial"])
            _fail(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        with self._nvml() as state:
            gpu, gi = self._gi(state, gpuInstance)
        return _GpuInstanceInfo(
            _Device(gpu["index"]), gi["id"], gi["profile_id"], c_nvmlGpuInstancePlacement_t(gi["start"], gi["size"])
        )

    def nvmlGpuInstanceDestroy(self, gpuInstance):
        """IN_USE while compute instances or processes are on it (NVML-H), or while another client holds it
        (``hold_gpu_instance``): then its compute instances may already be gone, a partial cleanup."""
        with self._nvml(write=True, timed="nvmlGpuInstanceDestroy") as state:
            gpu, gi = self._gi(state, gpuInstance)
            if gi["cis"] or gi.get("held") or any(p["gi"] == gi["id"] for p in gpu["processes"]):
                _fail(NVML_ERROR_IN_USE)
            gpu["instances"].remove(gi)
        return NVML_SUCCESS

    # ---- compute instances -------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device, profile, engProfile, version=2):
        if version not in (1, 2):
            _fail(NVML_ERROR_FUNCTION_NOT_FOUND)
        with self._nvml() as state:
            gpu, gi = self._gi(state, device)
        if (
            not 0 <= profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT
            or not 0 <= engProfile < NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT
        ):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        gi_profile = get_model(gpu["model"]).profile_for_id(gi["profile_id"])
        allowed = _ci_profiles(gi_profile)
        if profile not in allowed:
            _fail(NVML_ERROR_NOT_SUPPORTED)
        return _ci_profile_info(gi_profile, profile, *allowed[profile], version)

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId):
        with self._nvml(write=True, timed="nvmlGpuInstanceCreateComputeInstance") as state:
            gpu, gi = self._gi(state, gpuInstance)
            gi_profile = get_model(gpu["model"]).profile_for_id(gi["profile_id"])
            start = _ci_start(gi, gi_profile, profileId)
            if start is None:
                _fail(NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci = _new_ci(state, gpu, gi, gi_profile, profileId, start)
            return _Ci(gpu["index"], gi["id"], ci["id"], ci["serial"])

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance, profileId, computeInstancesRef, countRef):
        array = _array(computeInstancesRef, c_nvmlComputeInstance_t)
        with self._nvml() as state:
            gpu, gi = self._gi(state, gpuInstance)
            if profileId not in _ci_profiles(get_model(gpu["model"]).profile_for_id(gi["profile_id"])):
                _fail(NVML_ERROR_NOT_SUPPORTED)
            found = [
                _Ci(gpu["index"], gi["id"], c["id"], c["serial"])
                for c in sorted(gi["cis"], key=lambda c: c["id"])
                if c["profile_id"] == profileId
            ]
        _fill(array, found, countRef)
        return NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance, computeInstanceId):
        with self._nvml() as state:
            gpu, gi = self._gi(state, gpuInstance)
            ci = _ci_by_serial(gi, computeInstanceId)
            return _Ci(gpu["index"], gi["id"], ci["id"], ci["serial"])

    def nvmlComputeInstanceGetInfo(self, computeInstance):
        with self._nvml() as state:
            gpu, gi, ci = self._ci(state, computeInstance)
        return _ComputeInstanceInfo(
            _Device(gpu["index"]),
            _Gi(gpu["index"], gi["id"], gi["serial"]),
            ci["id"],
            ci["profile_id"],
            c_nvmlComputeInstancePlacement_t(ci["start"], ci["size"]),
        )

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlComputeInstanceDestroy(self, computeInstance):
        with self._nvml(write=True, timed="nvmlComputeInstanceDestroy") as state:
            gpu, gi, ci = self._ci(state, computeInstance)
            if any((p["gi"], p["ci"]) == (gi["id"], ci["id"]) for p in gpu["processes"]):
                _fail(NVML_ERROR_IN_USE)
            gi["cis"].remove(ci)
        return NVML_SUCCESS

    # ---- MIG devices ---------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        with self._nvml() as state:
            gpu = self._gpu(state, device)
            model = get_model(gpu["model"])
            return model.compute_slices if model.mig_capable and gpu["mig_current"] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        with self._nvml(timed="nvmlDeviceGetMigDeviceHandleByIndex") as state:
            gpu = self._mig_gpu(state, device)
            if not 0 <= index < get_model(gpu["model"]).compute_slices:
                _fail(NVML_ERROR_INVALID_ARGUMENT)
            devices = _mig_devices(gpu)
            if index >= len(devices):
                _fail(NVML_ERROR_NOT_FOUND)
            gi, ci = devices[index]
            return _Mig(gpu["index"], gi["id"], ci["id"], ci["serial"])

    def nvmlDeviceIsMigDeviceHandle(self, device):
        with self._nvml() as state:
            self._any_device(state, device)
        return ctypes.c_uint(int(isinstance(device, _Mig)))  # pynvml returns the c_uint itself

    def nvmlDeviceGetGpuInstanceId(self, device):
        if not isinstance(device, _Mig):
            _unconfirmed("nvmlDeviceGetGpuInstanceId on a non-MIG handle")
        with self._nvml() as state:
            return self._mig(state, device)[1]["id"]

    def nvmlDeviceGetComputeInstanceId(self, device):
        if not isinstance(device, _Mig):
            _unconfirmed("nvmlDeviceGetComputeInstanceId on a non-MIG handle")
        with self._nvml() as state:
            return self._mig(state, device)[2]["id"]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice):
        if not isinstance(migDevice, _Mig):
            _fail(NVML_ERROR_INVALID_ARGUMENT)
        with self._nvml() as state:
            return _Device(self._mig(state, migDevice)[0]["index"])

    # ---- processes -------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        """On a MIG-enabled parent this returns [], as NVML does for a caller without
        the privilege to aggregate (NVML API Reference, nvmlDeviceGetComputeRunningProcesses):
        ask each MIG device instead."""
        with self._nvml() as state:
            gpu, mig = self._any_device(state, handle)
            if mig is not None:
                gi, ci = mig
                return [
                    _process_object(p, gi["id"], ci["id"])
                    for p in gpu["processes"]
                    if (p["gi"], p["ci"]) == (gi["id"], ci["id"])
                ]
            if gpu["mig_current"]:
                return []
            return [_process_object(p, _NOT_MIG, _NOT_MIG) for p in gpu["processes"]]


# ---- rules -------------------------------------------------------------------------------


def _fit_problem(model: GpuModel, gpu: dict, profile: MigProfile, start: int, size: int) -> str | None:
    """Why this GI cannot be created (None if it can): what NVML reports as INSUFFICIENT_RESOURCES.

    A placement outside the profile's table (a start it does not list, or a size that is not the profile's) raises
    NVML_ERROR_INVALID_ARGUMENT. Unverified: NVML-H allows INVALID_ARGUMENT ("placement ... invalid") and
    INSUFFICIENT_RESOURCES ("could not be created"), the check is in GSP firmware (the open kernel module passes
    the span on), and no transcript shows which (per-job-mig.md, open question 6). The fake picks
    INVALID_ARGUMENT, the code nvml.h gives for an invalid placement; callers must take starts from the table and
    treat either code as "not made"."""
    if start not in profile.placements or size != profile.memory_slices:
        _fail(NVML_ERROR_INVALID_ARGUMENT)
    same = [g for g in gpu["instances"] if g["profile_id"] == profile.profile_id]
    if len(same) >= profile.max_instances:
        return f"{profile.name} already has its maximum of {profile.max_instances}"
    taken = {s for g in gpu["instances"] for s in range(g["start"], g["start"] + g["size"])}
    if taken & set(range(start, start + size)):
        return "memory slices overlap an existing GPU instance"
    used = sum(model.profile_for_id(g["profile_id"]).compute_slices for g in gpu["instances"])
    if used + profile.compute_slices > model.compute_slices:
        return "not enough free compute slices"
    return None


def _remaining(model: GpuModel, gpu: dict, profile: MigProfile) -> int:
    """How many more GIs of ``profile`` fit now: free placements, capped by the
    profile's maximum and the compute slices left."""
    free = sum(1 for s in profile.placements if _fit_problem(model, gpu, profile, s, profile.memory_slices) is None)
    same = sum(1 for g in gpu["instances"] if g["profile_id"] == profile.profile_id)
    used = sum(model.profile_for_id(g["profile_id"]).compute_slices for g in gpu["instances"])
    return max(0, min(free, profile.max_instances - same, (model.compute_slices - used) // profile.compute_slices))


def _ci_start(gi: dict, gi_profile: MigProfile, ci_constant: int) -> int | None:
    """Lowest free compute-slice start for a CI of this profile, or None if it does not fit."""
    allowed = _ci_profiles(gi_profile)
    if ci_constant not in allowed:
        _fail(
            NVML_ERROR_NOT_SUPPORTED
            if 0 <= ci_constant < NVML_COMPUTE_INSTANCE_PROFILE_COUNT
            else NVML_ERROR_INVALID_ARGUMENT
        )
    slices = allowed[ci_constant][1]
    if sum(1 for c in gi["cis"] if c["profile_id"] == ci_constant) >= gi_profile.compute_slices // slices:
        return None
    taken = {s for c in gi["cis"] for s in range(c["start"], c["start"] + c["size"])}
    for start in range(gi_profile.compute_slices - slices + 1):
        if not taken & set(range(start, start + slices)):
            return start
    return None


def _new_gi(state: dict, gpu: dict, model: GpuModel, profile: MigProfile, start: int) -> dict:
    used = {g["id"] for g in gpu["instances"]}
    gi_id = next((i for i in _gi_id_range(model, profile) if i not in used), None)
    if gi_id is None:
        _fail(NVML_ERROR_INSUFFICIENT_RESOURCES)
    state["serial"] += 1
    record = {
        "id": gi_id,
        "profile_id": profile.profile_id,
        "start": start,
        "size": profile.memory_slices,
        "serial": state["serial"],
        "cis": [],
    }
    gpu["instances"].append(record)
    gpu["instances"].sort(key=lambda g: g["id"])
    return record


def _new_ci(state: dict, gpu: dict, gi: dict, gi_profile: MigProfile, ci_constant: int, start: int) -> dict:
    used = {c["id"] for c in gi["cis"]}
    ci_id = next(i for i in range(8) if i not in used)
    state["serial"] += 1
    record = {
        "id": ci_id,
        "profile_id": ci_constant,
        "start": start,
        "size": _ci_profiles(gi_profile)[ci_constant][1],
        "serial": state["serial"],
        "uuid": _uuid("MIG", gpu["uuid"], state["serial"]),
    }
    gi["cis"].append(record)
    gi["cis"].sort(key=lambda c: c["id"])
    return record


def _gi_profile_info(profile: MigProfile, version: int):
    info = c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else c_nvmlGpuInstanceProfileInfo_t()
    info.id = profile.profile_id
    info.sliceCount = profile.compute_slices
    info.instanceCount = profile.max_instances
    info.multiprocessorCount = profile.multiprocessors or 0
    info.memorySizeMB = profile.memory_mib
    if version == 2:
        info.name = f"MIG {profile.name}".encode()
    return info


def _ci_profile_info(gi_profile: MigProfile, constant: int, name: str, slices: int, version: int):
    info = c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2 else c_nvmlComputeInstanceProfileInfo_t()
    info.id = constant  # CI profile IDs equal the constants (MIG User Guide `nvidia-smi mig -lcip` transcripts)
    info.sliceCount = slices
    info.instanceCount = gi_profile.compute_slices // slices
    info.multiprocessorCount = (gi_profile.multiprocessors or 0) * slices // gi_profile.compute_slices
    if version == 2:
        info.name = f"MIG {name}".encode()
    return info


# ---- builder helpers -----------------------------------------------------------------------


def _builder_model(name: str) -> GpuModel:
    try:
        return get_model(name)
    except CatalogueError as exc:
        raise FakeNvmlError(str(exc)) from None


def _check_build(model: GpuModel, count: int, mig_enabled: list[int], minors: list[int]) -> None:
    if not 1 <= count <= 32:
        raise FakeNvmlError(f"a fake node has 1 to 32 GPUs (mig-minors covers gpu0-gpu31), not {count}")
    bad = [i for i in mig_enabled if not 0 <= i < count]
    if bad:
        raise FakeNvmlError(f"MIG GPU indexes {bad} are not among the {count} GPUs (0-{count - 1})")
    if mig_enabled and not model.mig_capable:
        raise FakeNvmlError(f"{model.name} does not support MIG; MIG GPUs requested: {mig_enabled}")
    if len(minors) != count or len(set(minors)) != count or not all(0 <= m <= 31 for m in minors):
        raise FakeNvmlError(f"minors must be {count} distinct numbers in 0-31, got {minors}")


def _new_gpu(model: GpuModel, index: int, minor: int, mig: bool, seed: str) -> dict:
    return {
        "index": index,
        "model": model.name,
        "uuid": _uuid("GPU", seed, model.name, index),
        "minor": minor,
        "pci_bus": 0x10 + index,
        "pci_device_id": model.pci_device_ids[0] if model.pci_device_ids else 0,
        "mig_current": int(mig),
        "mig_pending": int(mig),
        "instances": [],
        "processes": [],
        "compute_mode": NVML_COMPUTEMODE_DEFAULT,
    }


def _helper_gpu(state: dict, index: int) -> dict:
    if not 0 <= index < len(state["gpus"]):
        raise FakeNvmlError(f"fake node has GPUs 0-{len(state['gpus']) - 1}, not {index}")
    return state["gpus"][index]


def _check_process_target(gpu: dict, gi: int | None, ci: int | None) -> None:
    """Processes run on a whole GPU, or (MIG mode) on one existing compute instance."""
    if not gpu["mig_current"]:
        if gi is not None or ci is not None:
            raise FakeNvmlError(f"fake GPU {gpu['index']} is not in MIG mode: a process there has no GI/CI")
        return
    if not any(g["id"] == gi and any(c["id"] == ci for c in g["cis"]) for g in gpu["instances"]):
        raise FakeNvmlError(f"fake GPU {gpu['index']} is in MIG mode: name an existing GI and CI, not gi={gi} ci={ci}")


def _carried_serial(path: str) -> int:
    """The serial of the fake state at ``path`` (0 if none is there, or something else is)."""
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.loads(fh.read())
    except (OSError, ValueError):
        return 0
    ok = isinstance(old, dict) and old.get("format") in READ_FORMATS and isinstance(old.get("serial"), int)
    return old["serial"] if ok else 0


def _clear_driver_state(gpu: dict) -> None:
    """What the driver kept for a GPU and loses when it goes: GPU and compute instances, and the processes."""
    gpu["instances"] = []
    gpu["processes"] = []


def _check_unload(gpus: list[dict]) -> None:
    running = sorted({p["pid"] for gpu in gpus for p in gpu["processes"]})
    if running:
        raise FakeNvmlError(f"processes {running} use the GPUs: the NVIDIA module cannot be unloaded")
    for gpu in gpus:
        if get_model(gpu["model"]).mig_mode_reset:
            _unconfirmed(f"a driver unload on a {gpu['model']} (GPU {gpu['index']}); use reboot()")
        if gpu.get("compute_mode", NVML_COMPUTEMODE_DEFAULT) != NVML_COMPUTEMODE_DEFAULT or gpu.get("memory_limits"):
            _unconfirmed(f"what a driver unload does to GPU {gpu['index']}'s compute mode or memory limits")


def _driver(state: dict) -> str:
    """The state's driver version; states written before it was kept are r580."""
    return state.get("driver_version", DEFAULT_DRIVER)


def _driver_major(version: str) -> int:
    head = version.split(".", 1)[0]
    if not head.isdigit() or not version.replace(".", "").isdigit():
        raise FakeNvmlError(f"driver version {version!r} is not as nvidia-smi prints it, e.g. 615.20.01")
    return int(head)


def _limits_struct(limits, cls):
    if not isinstance(limits, cls):
        raise TypeError(f"pass a {cls.__name__} (pynvml passes it by reference itself), got {limits!r}")
    return limits


def _cgroup_path(state: dict, name) -> str:
    """nameSpace: the full path of a cgroup directory under the cgroup v2 mount; anything else INVALID_ARGUMENT."""
    from pathlib import Path

    root = Path(state.get("cgroup_root", DEFAULT_CGROUP_ROOT))
    path = Path(name) if isinstance(name, str) and name else None
    if path is None or not path.is_absolute() or ".." in path.parts or root not in (path, *path.parents):
        _fail(NVML_ERROR_INVALID_ARGUMENT)
    if path.is_symlink() or not path.is_dir():
        _fail(NVML_ERROR_INVALID_ARGUMENT)
    return str(path)


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text, 0o444)  # as the driver's mig-minors: world-readable


def _export_module_names() -> None:
    """Constants, error classes and struct types are read off the NVML object, as off
    the pynvml module: give the class the module's pynvml-named attributes."""
    prefixes = (
        "NVML_",
        "NVMLError",
        "c_nvml",
        "nvmlPciInfo_t",
        "nvmlFriendlyObject",
        "nvmlGpuInstanceProfileInfo_v2",
        "nvmlComputeInstanceProfileInfo_v2",
    )
    for name, value in list(globals().items()):
        if name.startswith(prefixes) and name not in vars(FakeNvml):
            setattr(FakeNvml, name, value)


_export_module_names()
