"""The fake NVML for per-job (dynamic) MIG: instances made and destroyed one at a time on a GPU that keeps running
its others, destroys refused while in use, partial cleanup, instances lost at reboot, per-call latencies.

Latencies are checked with a recording ``sleep``: no test waits, none asserts on time."""

from __future__ import annotations

import ctypes
import json

import pytest

from slurm_gpushare.gpu import NvmlBackend
from slurm_gpushare.gpu import fakenvml as fk
from slurm_gpushare.gpu.fakenvml import FakeNvml, FakeNvmlError
from slurm_gpushare.hardware import get_model


class Sleeps(list):
    """A ``sleep`` that records what it was asked to wait, and may look at the state meanwhile."""

    def __init__(self, during=None):
        super().__init__()
        self.during = during

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        if self.during is not None:
            self.during()


def node(tmp_path, model="A100-SXM4-40GB", count=2, mig=(0,), sleep=None) -> FakeNvml:
    FakeNvml.build(tmp_path / "nvml.json", model=model, count=count, mig_enabled=list(mig), seed="d")
    nv = FakeNvml(tmp_path / "nvml.json", sleep=sleep)
    nv.nvmlInit()
    return nv


@pytest.fixture
def a100(tmp_path):
    """Two A100-SXM4-40GB: GPU 0 in MIG mode, GPU 1 not."""
    return node(tmp_path)


def pid_of(nv, gpu: int, name: str) -> int:
    return get_model(json.loads(nv.state_path.read_text())["gpus"][gpu]["model"]).profile(name).profile_id


def create(nv, gpu: int, name: str, start: int):
    """A GI of profile ``name`` at ``start`` and its full-size CI: (GI handle, CI handle)."""
    profile = get_model(json.loads(nv.state_path.read_text())["gpus"][gpu]["model"]).profile(name)
    p = fk.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, profile.memory_slices
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(
        nv.nvmlDeviceGetHandleByIndex(gpu), profile.profile_id, ctypes.byref(p)
    )
    ci_constant = dict(profile.compute_profiles)[profile.name]
    info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_constant, 0)
    return gi, nv.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def mig_uuids(nv, gpu: int = 0) -> list[str]:
    dev = nv.nvmlDeviceGetHandleByIndex(gpu)
    found = []
    for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(dev)):
        try:
            found.append(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, j)))
        except fk.NVMLError_NotFound:
            break
    return found


def gi_id(nv, gi) -> int:
    return nv.nvmlGpuInstanceGetInfo(gi).id


# ---- creation at a placement, beside running instances ---------------------------------------


def test_create_beside_a_running_instance_leaves_it_alone(a100):
    gi, _ = create(a100, 0, "3g.20gb", 4)
    a100.add_process(0, 41, gi=gi_id(a100, gi), ci=0, used_mib=1000)
    [before] = mig_uuids(a100)
    create(a100, 0, "2g.10gb", 0)
    create(a100, 0, "1g.5gb", 2)
    assert before in mig_uuids(a100) and len(mig_uuids(a100)) == 3
    mig = a100.nvmlDeviceGetHandleByUUID(before)
    [proc] = a100.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (proc.pid, proc.usedGpuMemory) == (41, 1000 << 20)


@pytest.mark.parametrize(
    "model, existing, name, start",
    [
        ("A100-SXM4-40GB", [("1g.5gb", 3)], "1g.5gb", 3),  # the same placement, taken
        ("A100-SXM4-40GB", [("1g.5gb", 3)], "2g.10gb", 2),  # memory 2-3 overlaps slice 3
        ("A100-SXM4-40GB", [("1g.10gb", 6)], "3g.20gb", 4),  # the double-memory 1g holds 6-7
        ("H100-SXM5-80GB", [("1g.20gb", 0), ("1g.20gb", 2)], "2g.20gb", 2),
        ("A30-24GB", [("2g.12gb", 2)], "1g.6gb", 3),
        ("A30-24GB", [("1g.6gb", 0)], "4g.24gb", 0),
    ],
)
def test_occupied_placement_is_insufficient_resources(tmp_path, model, existing, name, start):
    """An occupied or overlapping placement: NVML_ERROR_INSUFFICIENT_RESOURCES (DRA nvlib.go 982-995), never an
    "already exists" (NVML has no such code)."""
    nv = node(tmp_path, model=model, count=1)
    for other, at in existing:
        create(nv, 0, other, at)
    with pytest.raises(fk.NVMLError) as exc:
        create(nv, 0, name, start)
    assert exc.value.value == fk.NVML_ERROR_INSUFFICIENT_RESOURCES == 23
    assert not hasattr(fk, "NVML_ERROR_ALREADY_EXISTS")


@pytest.mark.parametrize(
    "model, name, start",
    [("A30-24GB", "2g.12gb", 1), ("H100-SXM5-80GB", "1g.20gb", 1), ("A100-SXM4-80GB", "3g.40gb", 2)],
)
def test_start_outside_the_table_is_an_invalid_argument(tmp_path, model, name, start):
    nv = node(tmp_path, model=model, count=1)
    with pytest.raises(fk.NVMLError) as exc:
        create(nv, 0, name, start)
    assert exc.value.value == fk.NVML_ERROR_INVALID_ARGUMENT
    assert all(not g["instances"] for g in json.loads(nv.state_path.read_text())["gpus"])


def placements(nv, gpu: int, name: str) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    dev = nv.nvmlDeviceGetHandleByIndex(gpu)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, pid_of(nv, gpu, name), None, ctypes.byref(count))
    array = (fk.c_nvmlGpuInstancePlacement_t * count.value)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, pid_of(nv, gpu, name), array, ctypes.byref(count))
    return [(p.start, p.size) for p in array]


def test_possible_placements_are_the_table_occupied_or_not_mig_on_or_off(a100):
    """nvml.h: "all the possible placements for the given profile regardless of whether MIG is enabled or not"."""
    empty = placements(a100, 0, "1g.5gb")
    create(a100, 0, "3g.20gb", 0)
    assert placements(a100, 0, "1g.5gb") == empty == [(s, 1) for s in range(7)]
    assert placements(a100, 1, "3g.20gb") == [(0, 4), (4, 4)]  # GPU 1: MIG mode off
    with pytest.raises(fk.NVMLError_NotSupported):  # remaining capacity needs MIG mode on (nvml.h)
        a100.nvmlDeviceGetGpuInstanceRemainingCapacity(a100.nvmlDeviceGetHandleByIndex(1), 9)


def test_possible_placements_not_supported_without_mig(tmp_path):
    nv = node(tmp_path, model="L40S", count=1, mig=())
    with pytest.raises(fk.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(
            nv.nvmlDeviceGetHandleByIndex(0), 19, None, ctypes.byref(ctypes.c_uint())
        )


A100 = ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


@pytest.mark.parametrize(
    "model, existing, remaining",
    [
        ("A100-SXM4-40GB", [], dict(zip(A100, (7, 1, 4, 3, 2, 1, 1), strict=True))),
        ("A100-SXM4-40GB", [("3g.20gb", 0)], dict(zip(A100, (3, 1, 2, 1, 1, 0, 0), strict=True))),
        ("A100-SXM4-40GB", [("1g.5gb", 6)], dict(zip(A100, (6, 1, 3, 3, 1, 1, 0), strict=True))),
        ("A100-SXM4-40GB", [("4g.20gb", 0)], dict(zip(A100, (3, 1, 2, 1, 1, 0, 0), strict=True))),
        ("A100-SXM4-40GB", [("1g.5gb+me", 0)], dict(zip(A100, (6, 0, 3, 2, 1, 0, 0), strict=True))),
        # 2g at 0 and 2, 1g at 4: compute 5 of 7 used, memory 6-7 and slice 5 free
        (
            "A100-SXM4-40GB",
            [("2g.10gb", 0), ("2g.10gb", 2), ("1g.5gb", 4)],
            dict(zip(A100, (2, 1, 1, 0, 0, 0, 0), strict=True)),
        ),
        ("A30-24GB", [("2g.12gb", 0)], {"1g.6gb": 2, "1g.6gb+me": 1, "2g.12gb": 1, "2g.12gb+me": 1, "4g.24gb": 0}),
        ("H100-SXM5-80GB", [("1g.20gb", 2)], {"1g.10gb": 5, "1g.20gb": 3, "2g.20gb": 2, "3g.40gb": 1, "7g.80gb": 0}),
    ],
)
def test_remaining_capacity_follows_what_is_occupied(tmp_path, model, existing, remaining):
    nv = node(tmp_path, model=model, count=1)
    for name, start in existing:
        create(nv, 0, name, start)
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    got = {name: nv.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, pid_of(nv, 0, name)) for name in remaining}
    assert got == remaining


# ---- destroy: in use, partial cleanup ------------------------------------------------------------


def test_destroy_refused_while_a_process_runs(a100):
    gi, ci = create(a100, 0, "2g.10gb", 2)
    a100.add_process(0, 7, gi=gi_id(a100, gi), ci=0)
    for destroy, handle in ((a100.nvmlComputeInstanceDestroy, ci), (a100.nvmlGpuInstanceDestroy, gi)):
        with pytest.raises(fk.NVMLError) as exc:
            destroy(handle)
        assert exc.value.value == fk.NVML_ERROR_IN_USE == 19 and type(exc.value) is fk.NVMLError_InUse
    assert len(mig_uuids(a100)) == 1  # nothing was destroyed
    a100.remove_process(7)
    a100.nvmlComputeInstanceDestroy(ci)
    a100.nvmlGpuInstanceDestroy(gi)
    assert mig_uuids(a100) == []


def test_partial_cleanup_leaves_the_gpu_instance(a100):
    """CI destroyed, GI destroy "in use by another client": the GI stays, holds its placement, shows no MIG device."""
    gi, ci = create(a100, 0, "3g.20gb", 0)
    a100.hold_gpu_instance(0, gi_id(a100, gi))
    a100.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(fk.NVMLError_InUse):
        a100.nvmlGpuInstanceDestroy(gi)
    backend = NvmlBackend(a100, mig_minors_path=a100.mig_minors_file)
    [left] = backend.gpu_instances(0)
    assert (left.start, left.size) == (0, 4) and backend.compute_instances(0, left.id) == []
    assert backend.mig_devices(0) == []
    with pytest.raises(fk.NVMLError_InsufficientResources):
        create(a100, 0, "3g.20gb", 0)
    dev = a100.nvmlDeviceGetHandleByIndex(0)
    assert a100.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 9) == 1
    a100.hold_gpu_instance(0, left.id, held=False)
    backend.destroy_gpu_instance(0, left.id)
    assert backend.gpu_instances(0) == []


def test_gpu_instance_left_without_compute_instance_can_be_reused(a100):
    """A caller killed between the two destroys leaves the same state: a later one gives the GI a new CI."""
    gi, ci = create(a100, 0, "1g.5gb", 5)
    [old] = mig_uuids(a100)
    a100.nvmlComputeInstanceDestroy(ci)
    again = a100.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    assert a100.nvmlComputeInstanceGetInfo(again).id == 0 and mig_uuids(a100) != [old]


def test_hold_needs_an_existing_gpu_instance(a100):
    with pytest.raises(FakeNvmlError, match="no GPU instance 3"):
        a100.hold_gpu_instance(0, 3)


# ---- reboot and driver unload --------------------------------------------------------------------


def test_reboot_loses_instances_and_processes_keeps_gpus_and_mig_mode(a100):
    gpu_uuids = [a100.nvmlDeviceGetUUID(a100.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1)]
    gi, _ = create(a100, 0, "3g.20gb", 4)
    first_id, [old_mig] = gi_id(a100, gi), mig_uuids(a100)
    a100.add_process(0, 5, gi=first_id, ci=0)
    a100.add_process(1, 6)
    a100.nvmlDeviceSetComputeMode(a100.nvmlDeviceGetHandleByIndex(1), fk.NVML_COMPUTEMODE_PROHIBITED)
    a100.hold_gpu_instance(0, first_id)
    a100.reboot()
    assert [a100.nvmlDeviceGetUUID(a100.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1)] == gpu_uuids
    assert [a100.nvmlDeviceGetMigMode(a100.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1)] == [[1, 1], [0, 0]]
    assert mig_uuids(a100) == [] and a100.nvmlDeviceGetComputeRunningProcesses(a100.nvmlDeviceGetHandleByIndex(1)) == []
    assert a100.nvmlDeviceGetComputeMode(a100.nvmlDeviceGetHandleByIndex(1)) == fk.NVML_COMPUTEMODE_DEFAULT
    with pytest.raises(fk.NVMLError_InvalidArgument):  # a handle from before the reboot
        a100.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(fk.NVMLError_NotFound):
        a100.nvmlDeviceGetHandleByUUID(old_mig)
    again, _ = create(a100, 0, "3g.20gb", 4)
    assert gi_id(a100, again) == first_id and mig_uuids(a100) != [old_mig]  # same GI id, new MIG UUID
    with pytest.raises(FakeNvmlError, match="no process 5"):
        a100.remove_process(5)


def test_building_the_state_again_issues_no_mig_uuid_twice(tmp_path):
    """The docker test cluster's container start builds the state again: a reboot, as far as UUIDs go."""
    nv = node(tmp_path)
    gpu = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0))
    create(nv, 0, "7g.40gb", 0)
    before = mig_uuids(nv)
    again = node(tmp_path)
    create(again, 0, "7g.40gb", 0)
    assert again.nvmlDeviceGetUUID(again.nvmlDeviceGetHandleByIndex(0)) == gpu and mig_uuids(again) != before
    (tmp_path / "nvml.json").write_text("not json")
    assert json.loads(node(tmp_path).state_path.read_text())["serial"] == 0


def test_reboot_makes_a_pending_mig_mode_current(a100):
    a100.set_mig_mode(1, current=False, pending=True)
    a100.reboot()
    assert a100.nvmlDeviceGetMigMode(a100.nvmlDeviceGetHandleByIndex(1)) == [1, 1]


def test_reboot_drops_memory_limits(tmp_path):
    cgroup = tmp_path / "cgroup" / "job_1"
    cgroup.mkdir(parents=True)
    FakeNvml.build(
        tmp_path / "s.json", model="L40S", count=1, mig_enabled=[], driver="615.20.01", cgroup_root=str(cgroup.parent)
    )
    nv = FakeNvml(tmp_path / "s.json", euid=0)
    nv.nvmlInit()
    backend = NvmlBackend(nv, mig_minors_path=nv.mig_minors_file)
    backend.set_memory_limit(0, str(cgroup), 1024)
    nv.reboot()
    assert backend.memory_limit(0, str(cgroup)) is None


def test_driver_unload_on_hopper_loses_mig_mode_and_instances(tmp_path):
    nv = node(tmp_path, model="H100-SXM5-80GB", count=2, mig=(0, 1))
    uuid = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0))
    gi, _ = create(nv, 0, "1g.10gb", 0)
    nv.add_process(0, 9, gi=gi_id(nv, gi), ci=0)
    with pytest.raises(FakeNvmlError, match=r"processes \[9\] use the GPUs"):
        nv.unload_driver()
    nv.remove_process(9)
    nv.unload_driver()
    assert [nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1)] == [[0, 0], [0, 0]]
    assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)) == uuid
    assert nv.nvmlDeviceGetMaxMigDeviceCount(nv.nvmlDeviceGetHandleByIndex(0)) == 0


def test_driver_unload_elsewhere_is_unconfirmed(a100):
    before = a100.state_path.read_text()
    with pytest.raises(NotImplementedError, match="driver unload on a A100-SXM4-40GB"):
        a100.unload_driver()
    assert a100.state_path.read_text() == before


# ---- latencies -------------------------------------------------------------------------------------


def test_no_latency_by_default(tmp_path):
    sleeps = Sleeps()
    nv = node(tmp_path, sleep=sleeps)
    create(nv, 0, "7g.40gb", 0)
    NvmlBackend(nv, mig_minors_path=nv.mig_minors_file).mig_devices(0)
    assert sleeps == [] and set(nv.latencies().values()) == {0.0} and list(nv.latencies()) == list(fk.LATENCY_CALLS)


def _calls(nv):
    """One call of each kind in LATENCY_CALLS, in that order, as the per-job hooks would make them."""
    gi, ci = None, None

    def by_uuid():
        nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)))

    def create_gi():
        nonlocal gi
        p = fk.c_nvmlGpuInstancePlacement_t()
        p.start, p.size = 4, 4
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(nv.nvmlDeviceGetHandleByIndex(0), 9, ctypes.byref(p))

    def create_ci():
        nonlocal ci
        ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, 2)

    def walk():
        nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(0), 0)

    return {
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceCreateGpuInstanceWithPlacement": create_gi,
        "nvmlGpuInstanceCreateComputeInstance": create_ci,
        "nvmlDeviceGetMigDeviceHandleByIndex": walk,
        "nvmlComputeInstanceDestroy": lambda: nv.nvmlComputeInstanceDestroy(ci),
        "nvmlGpuInstanceDestroy": lambda: nv.nvmlGpuInstanceDestroy(gi),
    }


def test_each_latency_applies_to_its_own_call(tmp_path):
    sleeps = Sleeps()
    nv = node(tmp_path, sleep=sleeps)
    values = {call: 0.001 * (i + 1) for i, call in enumerate(fk.LATENCY_CALLS)}
    for call, seconds in values.items():
        nv.set_latency(call, seconds)
    assert nv.latencies() == values
    for call, run in _calls(nv).items():
        del sleeps[:]
        run()
        assert sleeps == [values[call]], call


def test_latency_is_kept_in_the_state_for_every_process(tmp_path):
    setter = node(tmp_path)
    setter.set_latency("nvmlGpuInstanceDestroy", 0.25)
    sleeps = Sleeps()
    other = FakeNvml(setter.state_path, sleep=sleeps)  # another process on the same state
    other.nvmlInit()
    gi, ci = create(other, 0, "4g.20gb", 0)
    other.nvmlComputeInstanceDestroy(ci)
    assert sleeps == []
    other.nvmlGpuInstanceDestroy(gi)
    assert sleeps == [0.25]
    assert json.loads(setter.state_path.read_text())["latencies"] == {"nvmlGpuInstanceDestroy": 0.25}


def test_latency_is_slept_after_the_change_is_made(tmp_path):
    """A caller killed during the wait leaves the instance made but unreported: others see it already."""
    seen = []
    observer = node(tmp_path)
    sleeps = Sleeps(during=lambda: seen.append(len(NvmlBackend(observer).gpu_instances(0))))
    nv = FakeNvml(observer.state_path, sleep=sleeps)
    nv.nvmlInit()
    nv.set_latency("nvmlDeviceCreateGpuInstanceWithPlacement", 0.5)
    create(nv, 0, "1g.5gb", 0)
    assert sleeps == [0.5] and seen == [1]


def test_failed_call_takes_its_latency_too(tmp_path):
    sleeps = Sleeps()
    nv = node(tmp_path, sleep=sleeps)
    gi, _ = create(nv, 0, "2g.10gb", 0)
    nv.set_latency("nvmlGpuInstanceDestroy", 0.01)
    with pytest.raises(fk.NVMLError_InUse):
        nv.nvmlGpuInstanceDestroy(gi)
    assert sleeps == [0.01]


def test_walking_mig_devices_pays_per_index(tmp_path):
    sleeps = Sleeps()
    nv = node(tmp_path, sleep=sleeps)
    for start in (0, 1, 2):
        create(nv, 0, "1g.5gb", start)
    nv.set_latency("nvmlDeviceGetMigDeviceHandleByIndex", 0.002)
    assert len(NvmlBackend(nv).mig_devices(0)) == 3
    assert sleeps == [0.002] * 7  # the backend asks every index up to the max MIG device count


def test_latency_zero_removes_it(a100):
    a100.set_latency("nvmlDeviceGetHandleByUUID", 3)
    a100.set_latency("nvmlDeviceGetHandleByUUID", 0)
    assert "nvmlDeviceGetHandleByUUID" not in json.loads(a100.state_path.read_text()).get("latencies", {})


@pytest.mark.parametrize(
    "call, seconds, match",
    [
        ("nvmlDeviceGetName", 1, "no latency for 'nvmlDeviceGetName'"),
        ("nvmlGpuInstanceDestroy", -1, "finite number of seconds"),
        ("nvmlGpuInstanceDestroy", float("nan"), "finite number of seconds"),
        ("nvmlGpuInstanceDestroy", float("inf"), "finite number of seconds"),
        ("nvmlGpuInstanceDestroy", True, "finite number of seconds"),
        ("nvmlGpuInstanceDestroy", "1", "finite number of seconds"),
    ],
)
def test_bad_latency_is_refused(a100, call, seconds, match):
    with pytest.raises(FakeNvmlError, match=match):
        a100.set_latency(call, seconds)


def test_dra_observed_latencies_are_settable(a100):
    for call, seconds in fk.DRA_OBSERVED_LATENCIES.items():
        a100.set_latency(call, seconds)
    assert {k: v for k, v in a100.latencies().items() if v} == fk.DRA_OBSERVED_LATENCIES
    assert fk.DRA_OBSERVED_LATENCIES["nvmlDeviceGetHandleByUUID"] == 10.0


# ---- state format --------------------------------------------------------------------------------


def test_version_1_state_is_read_and_written_back_as_version_2(a100):
    gi, _ = create(a100, 0, "3g.20gb", 0)
    raw = json.loads(a100.state_path.read_text())
    raw["format"] = fk.STATE_FORMAT_1
    a100.state_path.write_text(json.dumps(raw))
    assert a100.latencies() == dict.fromkeys(fk.LATENCY_CALLS, 0.0)
    assert a100.nvmlGpuInstanceGetInfo(gi).placement.start == 0
    assert json.loads(a100.state_path.read_text())["format"] == fk.STATE_FORMAT_1  # reads do not rewrite
    a100.set_latency("nvmlGpuInstanceDestroy", 1)
    assert json.loads(a100.state_path.read_text())["format"] == fk.STATE_FORMAT == "gpushare-fake-nvml/2"


def test_unknown_state_format_is_refused(a100):
    raw = json.loads(a100.state_path.read_text())
    raw["format"] = "gpushare-fake-nvml/9"
    a100.state_path.write_text(json.dumps(raw))
    with pytest.raises(FakeNvmlError, match="not a fake NVML state"):
        a100.latencies()
