"""The fake NVML: pynvml's API shape, the MIG rules as NVML errors, shared state across processes."""

from __future__ import annotations

import ctypes
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from slurm_gpushare.gpu import fakenvml as fk
from slurm_gpushare.gpu.fakenvml import FakeNvml, FakeNvmlError
from slurm_gpushare.gpu.migminors import parse_mig_minors
from slurm_gpushare.records import fields
from tests.conftest import ROOT


@pytest.fixture
def a100(tmp_path):
    """Two A100-40GB: GPU 0 in MIG mode, GPU 1 not; initialised."""
    nv = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[0], seed="t")
    nv.nvmlInit()
    return nv


def code(excinfo) -> int:
    return excinfo.value.value


def placement(start: int, size: int):
    p = fk.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return ctypes.byref(p)


def create(nv, index: int, profile_id: int, start: int, size: int):
    return nv.nvmlDeviceCreateGpuInstanceWithPlacement(
        nv.nvmlDeviceGetHandleByIndex(index), profile_id, placement(start, size)
    )


# ---- errors ------------------------------------------------------------------------


def test_error_classes_are_pynvml_shaped():
    err = fk.NVMLError(23)
    assert type(err) is fk.NVMLError_InsufficientResources and err.value == 23
    assert isinstance(fk.NVMLError_InUse(), fk.NVMLError) and fk.NVMLError_InUse().value == 19
    assert str(fk.NVMLError(3)) == "NVML_ERROR_NOT_SUPPORTED"
    assert FakeNvml.NVMLError_NotFound is fk.NVMLError_NotFound


def test_uninitialized_before_init_and_after_shutdown(tmp_path):
    nv = FakeNvml.build(tmp_path / "s.json", model="L40S", count=1, mig_enabled=[])
    with pytest.raises(fk.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 1
    nv.nvmlShutdown()
    with pytest.raises(fk.NVMLError) as exc:
        nv.nvmlDeviceGetHandleByIndex(0)
    assert code(exc) == fk.NVML_ERROR_UNINITIALIZED == 1


def test_init_without_state_is_driver_not_loaded(tmp_path):
    with pytest.raises(fk.NVMLError_DriverNotLoaded):
        FakeNvml(tmp_path / "missing.json").nvmlInit()


def test_unknown_function_is_loud(a100):
    with pytest.raises(NotImplementedError, match="nvmlDeviceSetMigMode"):
        a100.nvmlDeviceSetMigMode(a100.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(NotImplementedError, match="nvmlDeviceGetClockInfo"):
        a100.nvmlDeviceGetClockInfo  # noqa: B018 - the attribute lookup itself must raise
    with pytest.raises(NotImplementedError, match="driver-chosen placement"):
        a100.nvmlDeviceCreateGpuInstance(a100.nvmlDeviceGetHandleByIndex(0), 9)


def test_invalid_argument_for_bad_index_and_constant(a100):
    with pytest.raises(fk.NVMLError_InvalidArgument):
        a100.nvmlDeviceGetHandleByIndex(2)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fk.NVMLError_InvalidArgument):
        a100.nvmlDeviceGetGpuInstanceProfileInfo(dev, fk.NVML_GPU_INSTANCE_PROFILE_COUNT)
    with pytest.raises(fk.NVMLError_InvalidArgument):  # profile ID 4 does not exist (IDs are not constants)
        create(a100, 0, 4, 0, 4)


# ---- MIG mode / NOT_SUPPORTED -------------------------------------------------------


def test_mig_mode_query(a100):
    assert a100.nvmlDeviceGetMigMode(a100.nvmlDeviceGetHandleByIndex(0)) == [1, 1]
    assert a100.nvmlDeviceGetMigMode(a100.nvmlDeviceGetHandleByIndex(1)) == [0, 0]


def test_mig_calls_not_supported_when_mig_disabled(a100):
    dev = a100.nvmlDeviceGetHandleByIndex(1)
    for call in (
        lambda: a100.nvmlDeviceGetGpuInstanceProfileInfo(dev, 0),
        lambda: create(a100, 1, 9, 0, 4),
        lambda: a100.nvmlDeviceGetGpuInstanceById(dev, 1),
        lambda: a100.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0),
    ):
        with pytest.raises(fk.NVMLError) as exc:
            call()
        assert code(exc) == fk.NVML_ERROR_NOT_SUPPORTED == 3
    assert a100.nvmlDeviceGetMaxMigDeviceCount(dev) == 0


def test_mig_not_supported_on_non_mig_gpu(tmp_path):
    nv = FakeNvml.build(tmp_path / "s.json", model="L40S", count=1, mig_enabled=[])
    nv.nvmlInit()
    with pytest.raises(fk.NVMLError_NotSupported):
        nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(FakeNvmlError, match="does not support MIG"):
        FakeNvml.build(tmp_path / "t.json", model="L40S", count=1, mig_enabled=[0])


def test_profile_not_on_this_gpu_is_not_supported(a100):
    with pytest.raises(fk.NVMLError_NotSupported):  # 8_SLICE: no such profile on A100
        a100.nvmlDeviceGetGpuInstanceProfileInfo(
            a100.nvmlDeviceGetHandleByIndex(0), fk.NVML_GPU_INSTANCE_PROFILE_8_SLICE
        )


def test_profile_info_struct(a100):
    info = a100.nvmlDeviceGetGpuInstanceProfileInfo(
        a100.nvmlDeviceGetHandleByIndex(0), fk.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    )
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (0, 7, 1, 40192)
    assert info.version == fk.nvmlGpuInstanceProfileInfo_v2 and info.name == "MIG 7g.40gb"


# ---- placements, INSUFFICIENT_RESOURCES ----------------------------------------------


def test_possible_placements_out_parameters(a100):
    dev, count = a100.nvmlDeviceGetHandleByIndex(0), ctypes.c_uint(0)
    assert a100.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 19, None, ctypes.byref(count)) == fk.NVML_SUCCESS
    assert count.value == 7
    array = (fk.c_nvmlGpuInstancePlacement_t * count.value)()
    a100.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 19, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array] == [(s, 1) for s in range(7)]


def test_too_small_array_is_insufficient_size(a100):
    dev, count = a100.nvmlDeviceGetHandleByIndex(0), ctypes.c_uint(0)
    with pytest.raises(fk.NVMLError) as exc:
        a100.nvmlDeviceGetGpuInstancePossiblePlacements(
            dev, 19, (fk.c_nvmlGpuInstancePlacement_t * 3)(), ctypes.byref(count)
        )
    assert code(exc) == fk.NVML_ERROR_INSUFFICIENT_SIZE == 7 and count.value == 7


def test_out_parameters_must_be_by_reference(a100):
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(TypeError, match="byref"):
        a100.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 19, None, ctypes.c_uint(0))
    with pytest.raises(TypeError, match="byref"):  # the C API takes a pointer; pynvml passes it through
        a100.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 9, fk.c_nvmlGpuInstancePlacement_t(0, 4))


@pytest.mark.parametrize(
    "existing, profile_id, start, size, why",
    [
        ([(9, 0, 4)], 9, 0, 4, "the same placement, taken: not ALREADY_EXISTS (NVML has no such code)"),
        ([(9, 0, 4)], 14, 2, 2, "overlaps the 3g at 0-3"),
        ([(9, 0, 4), (9, 4, 4)], 19, 6, 1, "GPU is full"),
        ([(20, 0, 1)], 20, 1, 1, "1g.5gb+me: at most one"),
        ([(9, 0, 4)], 19, 2, 1, "a 1g inside the 3g's slices"),
    ],
)
def test_create_rules_insufficient_resources(a100, existing, profile_id, start, size, why):
    for pid, s, sz in existing:
        create(a100, 0, pid, s, sz)
    with pytest.raises(fk.NVMLError) as exc:
        create(a100, 0, profile_id, start, size)
    assert code(exc) == fk.NVML_ERROR_INSUFFICIENT_RESOURCES == 23, why


def test_max_instances(a100):
    for start in range(7):
        create(a100, 0, 19, start, 1)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    assert a100.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 19) == 0
    with pytest.raises(fk.NVMLError_InsufficientResources):
        create(a100, 0, 15, 6, 2)


@pytest.mark.parametrize(
    "profile_id, start, size",
    [(9, 2, 4), (19, 7, 1), (9, 0, 2), (14, 1, 2)],
    ids=["3g at slice 2", "1g at slice 7", "3g with size 2", "2g at slice 1"],
)
def test_placement_outside_the_table_is_an_invalid_argument(a100, profile_id, start, size):
    """nvml.h allows INVALID_ARGUMENT or INSUFFICIENT_RESOURCES and no transcript shows which (per-job-mig.md, open
    question 6): the fake raises INVALID_ARGUMENT, as NVML does for an invalid placement, and changes nothing."""
    before = a100.state_path.read_text()
    with pytest.raises(fk.NVMLError) as exc:
        create(a100, 0, profile_id, start, size)
    assert exc.value.value == fk.NVML_ERROR_INVALID_ARGUMENT
    assert a100.state_path.read_text() == before


def test_failed_create_leaves_state_unchanged(a100):
    create(a100, 0, 14, 2, 2)
    before = a100.state_path.read_text()
    with pytest.raises(fk.NVMLError_InsufficientResources):
        create(a100, 0, 9, 0, 4)
    assert a100.state_path.read_text() == before


# ---- ids ---------------------------------------------------------------------------------


def gi_id(nv, handle) -> int:
    return nv.nvmlGpuInstanceGetInfo(handle).id


def test_gi_ids_are_driver_like_but_depend_on_history(a100):
    # One memory slice: ids 7-14; four: 1-2; eight: 0 (the driver's ranges, reference 1.5).
    assert gi_id(a100, create(a100, 0, 19, 3, 1)) == 7  # not 7 + start: callers must ask
    assert gi_id(a100, create(a100, 0, 19, 0, 1)) == 8
    assert gi_id(a100, create(a100, 0, 9, 4, 4)) == 1


def test_get_gpu_instances_and_by_id(a100):
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    first, second = create(a100, 0, 9, 0, 4), create(a100, 0, 9, 4, 4)
    array, count = (fk.c_nvmlGpuInstance_t * 2)(), ctypes.c_uint(0)
    a100.nvmlDeviceGetGpuInstances(dev, 9, array, ctypes.byref(count))
    assert count.value == 2 and {gi_id(a100, array[i]) for i in range(2)} == {gi_id(a100, first), gi_id(a100, second)}
    info = a100.nvmlGpuInstanceGetInfo(a100.nvmlDeviceGetGpuInstanceById(dev, gi_id(a100, second)))
    assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
    with pytest.raises(fk.NVMLError) as exc:
        a100.nvmlDeviceGetGpuInstanceById(dev, 13)
    assert code(exc) == fk.NVML_ERROR_NOT_FOUND == 6


def test_stale_handle_is_invalid(a100):
    gi = create(a100, 0, 9, 0, 4)
    a100.nvmlGpuInstanceDestroy(gi)
    create(a100, 0, 9, 0, 4)  # same id again, but a new instance
    with pytest.raises(fk.NVMLError_InvalidArgument):
        a100.nvmlGpuInstanceGetInfo(gi)


# ---- compute instances, IN_USE ------------------------------------------------------------


def full_ci(nv, gi, constant=fk.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE):
    info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, constant, fk.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    return nv.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def test_compute_instances(a100):
    gi = create(a100, 0, 9, 0, 4)
    info = a100.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (0, 1, 3, "MIG 1c.3g.20gb")
    with pytest.raises(fk.NVMLError_NotSupported):  # a 4-slice CI in a 3g GI
        a100.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, fk.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, 0)
    ci = full_ci(a100, gi)
    cinfo = a100.nvmlComputeInstanceGetInfo(ci)
    assert (cinfo.id, cinfo.profileId, cinfo.placement.start, cinfo.placement.size) == (0, 2, 0, 3)
    with pytest.raises(fk.NVMLError_InsufficientResources):  # the full CI took every compute slice
        a100.nvmlGpuInstanceCreateComputeInstance(gi, 0)


def test_destroy_gi_with_ci_is_in_use(a100):
    gi = create(a100, 0, 9, 0, 4)
    ci = full_ci(a100, gi)
    with pytest.raises(fk.NVMLError) as exc:
        a100.nvmlGpuInstanceDestroy(gi)
    assert code(exc) == fk.NVML_ERROR_IN_USE == 19
    a100.nvmlComputeInstanceDestroy(ci)
    a100.nvmlGpuInstanceDestroy(gi)


def test_destroy_ci_with_process_is_in_use(a100):
    gi = create(a100, 0, 9, 0, 4)
    ci = full_ci(a100, gi)
    a100.add_process(0, 777, gi=gi_id(a100, gi), ci=0, used_mib=512)
    with pytest.raises(fk.NVMLError_InUse):
        a100.nvmlComputeInstanceDestroy(ci)
    a100.remove_process(777)
    a100.nvmlComputeInstanceDestroy(ci)


def test_process_helpers_check_their_target(a100):
    with pytest.raises(FakeNvmlError, match="name an existing GI and CI"):
        a100.add_process(0, 1)
    with pytest.raises(FakeNvmlError, match="not in MIG mode"):
        a100.add_process(1, 1, gi=1, ci=0)
    with pytest.raises(FakeNvmlError, match="no process 5"):
        a100.remove_process(5)


# ---- MIG devices ------------------------------------------------------------------------


def test_mig_device_handles(a100):
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    gi = create(a100, 0, 9, 4, 4)
    full_ci(a100, gi)
    assert a100.nvmlDeviceGetMaxMigDeviceCount(dev) == 7
    mig = a100.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    assert a100.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert a100.nvmlDeviceGetGpuInstanceId(mig) == gi_id(a100, gi) and a100.nvmlDeviceGetComputeInstanceId(mig) == 0
    assert a100.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert a100.nvmlDeviceGetMemoryInfo(mig).total == 19968 << 20
    uuid = a100.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and a100.nvmlDeviceGetHandleByUUID(uuid) == mig
    assert a100.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) == dev
    with pytest.raises(fk.NVMLError_NotFound):
        a100.nvmlDeviceGetMigDeviceHandleByIndex(dev, 1)
    with pytest.raises(fk.NVMLError_InvalidArgument):
        a100.nvmlDeviceGetMigDeviceHandleByIndex(dev, 7)


def test_processes_on_mig_parent_are_listed_per_mig_device(a100):
    gi = create(a100, 0, 9, 0, 4)
    full_ci(a100, gi)
    a100.add_process(0, 99, gi=gi_id(a100, gi), ci=0, used_mib=100)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    assert a100.nvmlDeviceGetComputeRunningProcesses(dev) == []  # unprivileged view of the parent
    [proc] = a100.nvmlDeviceGetComputeRunningProcesses(a100.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0))
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId, proc.computeInstanceId) == (
        99,
        100 << 20,
        gi_id(a100, gi),
        0,
    )


def test_processes_on_whole_gpu(a100):
    a100.add_process(1, 5, used_mib=2048)
    [proc] = a100.nvmlDeviceGetComputeRunningProcesses(a100.nvmlDeviceGetHandleByIndex(1))
    assert (proc.pid, proc.gpuInstanceId, proc.computeInstanceId) == (5, 0xFFFFFFFF, 0xFFFFFFFF)
    mem = a100.nvmlDeviceGetMemoryInfo(a100.nvmlDeviceGetHandleByIndex(1))
    assert (mem.total, mem.used, mem.free) == (40960 << 20, 2048 << 20, (40960 - 2048) << 20)


# ---- identity, builder, mig-minors ----------------------------------------------------------


def test_identity(tmp_path):
    nv = FakeNvml.build(
        tmp_path / "s.json", model="H100-SXM5-80GB", count=3, mig_enabled=[], minors=[4, 0, 9], seed="n1"
    )
    nv.nvmlInit()
    dev = nv.nvmlDeviceGetHandleByIndex(2)
    assert nv.nvmlDeviceGetName(dev) == "NVIDIA H100 80GB HBM3"
    assert nv.nvmlDeviceGetMinorNumber(dev) == 9
    assert (
        nv.nvmlDeviceGetUUID(dev).startswith("GPU-") and nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(dev)) == dev
    )
    assert nv.nvmlDeviceGetPciInfo(dev).busId == "00000000:12:00.0"
    again = FakeNvml.build(tmp_path / "t.json", model="H100-SXM5-80GB", count=3, mig_enabled=[], seed="n1")
    assert json.loads(again.state_path.read_text())["gpus"][2]["uuid"] == nv.nvmlDeviceGetUUID(dev)  # deterministic


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"count": 0}, "1 to 32"),
        ({"mig_enabled": [9]}, "not among"),
        ({"minors": [0, 0]}, "distinct"),
        ({"model": "nope"}, "unknown GPU model"),
    ],
)
def test_builder_refuses_impossible_nodes(tmp_path, kwargs, match):
    args = {"model": "A100-SXM4-40GB", "count": 2, "mig_enabled": [], **kwargs}
    with pytest.raises(FakeNvmlError, match=match):
        FakeNvml.build(tmp_path / "s.json", **args)


def test_mig_minors_file_is_the_full_static_table(a100):
    text = a100.mig_minors_path.read_text()
    lines = text.splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert len(lines) == 2 + 32 * 15 * 9 and lines[-1] == "gpu31/gi14/ci7/access 4322"
    table = parse_mig_minors(text)
    assert table[(0, 1, None)] == 12 and table[(0, 1, 0)] == 13 and table[(0, 1, 2)] == 15  # reference 3 example
    assert a100.mig_minors_path.parent == a100.state_path.parent


def test_set_mig_mode_helper(a100):
    a100.set_mig_mode(1, current=False, pending=True)
    assert a100.nvmlDeviceGetMigMode(a100.nvmlDeviceGetHandleByIndex(1)) == [0, 1]
    create(a100, 0, 9, 0, 4)
    with pytest.raises(FakeNvmlError, match="still has MIG instances"):
        a100.set_mig_mode(0, current=False)


# ---- shared state ----------------------------------------------------------------------


def test_two_instances_share_one_state(a100):
    other = FakeNvml(a100.state_path)
    other.nvmlInit()
    gi = create(other, 0, 9, 4, 4)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    assert a100.nvmlGpuInstanceGetInfo(a100.nvmlDeviceGetGpuInstanceById(dev, gi_id(other, gi))).placement.start == 4
    with pytest.raises(fk.NVMLError_InsufficientResources):  # the other process's GI is seen
        create(a100, 0, 9, 4, 4)


_WORKER = textwrap.dedent(
    """
    import sys
    from slurm_gpushare.gpu.fakenvml import FakeNvml
    fake = FakeNvml(sys.argv[1])
    for i in range(int(sys.argv[3])):
        fake.add_process(1, int(sys.argv[2]) * 1000 + i)
    """
)


def test_processes_sharing_state_do_not_lose_updates(a100):
    """Read-modify-write under the lock: concurrent writers never overwrite each other."""
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(a100.state_path), str(w), "25"], cwd=ROOT)
        for w in range(4)
    ]
    assert [p.wait(timeout=60) for p in workers] == [0, 0, 0, 0]
    pids = {p.pid for p in a100.nvmlDeviceGetComputeRunningProcesses(a100.nvmlDeviceGetHandleByIndex(1))}
    assert len(pids) == 100


def test_subprocess_creates_instance_parent_sees_it(a100):
    script = textwrap.dedent(
        f"""
        import ctypes
        from slurm_gpushare.gpu.fakenvml import FakeNvml, c_nvmlGpuInstancePlacement_t
        nv = FakeNvml({str(a100.state_path)!r}); nv.nvmlInit()
        p = c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 8
        nv.nvmlDeviceCreateGpuInstanceWithPlacement(nv.nvmlDeviceGetHandleByIndex(0), 0, ctypes.byref(p))
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    assert a100.nvmlGpuInstanceGetInfo(a100.nvmlDeviceGetGpuInstanceById(dev, 0)).profileId == 0


# ---- fidelity with the real pynvml (when installed) ----------------------------------------


def _fake_api() -> list[str]:
    return sorted(n for n, v in vars(FakeNvml).items() if n.startswith("nvml") and inspect.isfunction(v))


def test_api_names_and_parameters_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name in _fake_api():
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters.values())[1:]
        real_params = list(inspect.signature(real).parameters.values())
        assert [(p.name, p.default) for p in fake_params] == [(p.name, p.default) for p in real_params], name


def test_constants_and_error_classes_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name, value in vars(fk).items():
        if name.startswith("NVML_") or name.startswith("nvml") and isinstance(value, int):
            assert getattr(pynvml, name) == value, name
        if name.startswith("NVMLError_"):
            assert getattr(pynvml, name)().value == value().value, name


@pytest.mark.parametrize(
    "name",
    [
        "c_nvmlGpuInstancePlacement_t",
        "c_nvmlComputeInstancePlacement_t",
        "c_nvmlGpuInstanceProfileInfo_t",
        "c_nvmlGpuInstanceProfileInfo_v2_t",
        "c_nvmlComputeInstanceProfileInfo_t",
        "c_nvmlComputeInstanceProfileInfo_v2_t",
        "c_nvmlMemory_t",
        "nvmlPciInfo_t",
        "c_nvmlSetMemoryLimits_v1_t",
        "c_nvmlGetMemoryLimits_v1_t",
    ],
)
def test_structures_match_pynvml(name):
    pynvml = pytest.importorskip("pynvml")

    def shape(cls):
        return [(f[0], ctypes.sizeof(f[1])) for f in cls._fields_]

    assert shape(getattr(fk, name)) == shape(getattr(pynvml, name))


def test_info_objects_have_pynvml_attribute_names():
    pynvml = pytest.importorskip("pynvml")
    for fake_cls, real_cls in (
        (fk._GpuInstanceInfo, pynvml.c_nvmlGpuInstanceInfo_t),
        (fk._ComputeInstanceInfo, pynvml.c_nvmlComputeInstanceInfo_t),
    ):
        assert [f.name for f in fields(fake_cls)] == [f[0] for f in real_cls._fields_]
    assert [f[0] for f in pynvml.c_nvmlProcessInfo_t._fields_] == [
        "pid",
        "usedGpuMemory",
        "gpuInstanceId",
        "computeInstanceId",
    ]


def test_state_is_readable_by_other_users(a100):
    """The task prolog runs as the job's user: state and mig-minors are world-readable."""
    create(a100, 0, 9, 0, 4)
    assert a100.state_path.stat().st_mode & 0o777 == 0o644
    assert a100.mig_minors_path.stat().st_mode & 0o444 == 0o444
