"""Per-cgroup GPU memory limits (NVIDIA's MPS v3 memory partitioning, nvmlDeviceSetMemoryLimits_v1) in the
fake NVML and the backend: only where the driver has them (r615+), root only, non-MIG GPUs, on a cgroup
directory; anything NVIDIA does not document is refused loudly."""

from __future__ import annotations

import ctypes

import pytest

from slurm_gpushare.gpu import GpuError, NvmlBackend
from slurm_gpushare.gpu import fakenvml as fk
from slurm_gpushare.gpu.fakenvml import FakeNvml

MIB = 1 << 20


@pytest.fixture
def cgroups(tmp_path):
    """A cgroup v2 tree as Slurm's cgroup/v2 plugin lays out a job: <root>/system.slice/slurmstepd.scope/job_42."""
    job = tmp_path / "cgroup" / "system.slice" / "slurmstepd.scope" / "job_42"
    job.mkdir(parents=True)
    return tmp_path / "cgroup", job


def fake(tmp_path, cgroups, driver="615.20.01", euid=0, mig=()) -> FakeNvml:
    FakeNvml.build(
        tmp_path / "nvml.json",
        model="A100-SXM4-40GB",
        count=2,
        mig_enabled=list(mig),
        seed="m",
        driver=driver,
        cgroup_root=str(cgroups[0]),
    )
    nv = FakeNvml(tmp_path / "nvml.json", euid=euid)
    nv.nvmlInit()
    return nv


def limits(path, soft, hard):
    s = fk.c_nvmlSetMemoryLimits_v1_t()
    s.nameSpace, s.softLimit, s.hardLimit = str(path).encode(), soft, hard
    return s


def read(nv, index, path):
    g = fk.c_nvmlGetMemoryLimits_v1_t()
    g.nameSpace = str(path).encode()
    nv.nvmlDeviceGetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(index), g)
    return g.softLimit, g.hardLimit, g.currentUsed


# ---- the fake -------------------------------------------------------------------------


def test_driver_before_r615_has_no_memory_limits(tmp_path, cgroups):
    nv = fake(tmp_path, cgroups, driver="580.65.06")
    assert nv.nvmlSystemGetDriverVersion() == "580.65.06"
    with pytest.raises(fk.NVMLError_FunctionNotFound):
        nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(0), limits(cgroups[1], 10 * MIB, 10 * MIB))
    with pytest.raises(fk.NVMLError_FunctionNotFound):
        read(nv, 0, cgroups[1])


def test_default_driver_is_r580_and_a_driver_upgrade_brings_them(tmp_path, cgroups):
    FakeNvml.build(tmp_path / "old.json", model="L40S", count=1, mig_enabled=[], cgroup_root=str(cgroups[0]))
    nv = FakeNvml(tmp_path / "old.json", euid=0)
    nv.nvmlInit()
    assert nv.nvmlSystemGetDriverVersion() == fk.DEFAULT_DRIVER
    nv.set_driver("615.20.01")
    nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(0), limits(cgroups[1], MIB, 2 * MIB))
    assert read(nv, 0, cgroups[1]) == (MIB, 2 * MIB, 0)


def test_set_read_and_clear_on_a_cgroup(tmp_path, cgroups):
    nv = fake(tmp_path, cgroups)
    dev = nv.nvmlDeviceGetHandleByIndex(1)
    assert read(nv, 1, cgroups[1]) == (0, fk.NVML_DEVICE_MEMORY_LIMIT_MAX, 0)  # none set
    nv.nvmlDeviceSetMemoryLimits_v1(dev, limits(cgroups[1], 5 * 1024 * MIB, 5 * 1024 * MIB))
    assert read(nv, 1, cgroups[1])[:2] == (5 * 1024 * MIB, 5 * 1024 * MIB)
    assert read(nv, 0, cgroups[1])[1] == fk.NVML_DEVICE_MEMORY_LIMIT_MAX  # per GPU
    other = FakeNvml(tmp_path / "nvml.json")  # another process (the epilog) sees it
    other.nvmlInit()
    assert read(other, 1, cgroups[1])[0] == 5 * 1024 * MIB
    nv.nvmlDeviceSetMemoryLimits_v1(dev, limits(cgroups[1], 0, fk.NVML_DEVICE_MEMORY_LIMIT_MAX))
    assert read(nv, 1, cgroups[1]) == (0, fk.NVML_DEVICE_MEMORY_LIMIT_MAX, 0)


def test_root_only(tmp_path, cgroups):
    nv = fake(tmp_path, cgroups, euid=1000)
    with pytest.raises(fk.NVMLError_NoPermission):
        nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(0), limits(cgroups[1], MIB, MIB))
    assert read(nv, 0, cgroups[1])[1] == fk.NVML_DEVICE_MEMORY_LIMIT_MAX  # reading is allowed, nothing was set


def test_not_on_mig(tmp_path, cgroups):
    nv = fake(tmp_path, cgroups, mig=[0])
    with pytest.raises(fk.NVMLError_NotSupported):
        nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(0), limits(cgroups[1], MIB, MIB))
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    place = fk.c_nvmlGpuInstancePlacement_t()
    place.start, place.size = 0, 1
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 19, ctypes.byref(place))
    nv.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    with pytest.raises(fk.NVMLError_NotSupported):
        nv.nvmlDeviceSetMemoryLimits_v1(mig, limits(cgroups[1], MIB, MIB))


@pytest.mark.parametrize("where", ["missing", "outside", "relative", "dotdot", "link", "none"])
def test_namespace_must_be_a_cgroup_directory(tmp_path, cgroups, where):
    root, job = cgroups
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(job)
    path = {
        "missing": root / "job_7",
        "outside": tmp_path / "elsewhere",
        "relative": "system.slice",
        "dotdot": f"{job}/../job_42",
        "link": root / "link",
        "none": None,
    }[where]
    nv = fake(tmp_path, cgroups)
    s = fk.c_nvmlSetMemoryLimits_v1_t()
    s.nameSpace, s.softLimit, s.hardLimit = (str(path).encode() if path else None), MIB, MIB
    with pytest.raises(fk.NVMLError_InvalidArgument):
        nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByIndex(0), s)


def test_undocumented_values_and_wrong_arguments_are_loud(tmp_path, cgroups):
    nv = fake(tmp_path, cgroups)
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    for soft, hard in ((0, 0), (2 * MIB, MIB), (MIB, 41 * 1024 * 1024 * MIB)):
        with pytest.raises(NotImplementedError, match="nvmlDeviceSetMemoryLimits_v1"):
            nv.nvmlDeviceSetMemoryLimits_v1(dev, limits(cgroups[1], soft, hard))
    with pytest.raises(TypeError, match="by reference itself"):
        nv.nvmlDeviceSetMemoryLimits_v1(dev, ctypes.byref(limits(cgroups[1], MIB, MIB)))
    with pytest.raises(TypeError):
        nv.nvmlDeviceGetMemoryLimits_v1(dev, limits(cgroups[1], MIB, MIB))
    with pytest.raises(fk.FakeNvmlError, match="not as nvidia-smi prints it"):
        nv.set_driver("r615")


# ---- the backend ----------------------------------------------------------------------


def test_backend_capability_follows_the_driver(tmp_path, cgroups):
    assert not NvmlBackend(fake(tmp_path, cgroups, driver="580.65.06")).init().memory_limits_supported()
    assert NvmlBackend(fake(tmp_path, cgroups, driver="615.20.01")).init().memory_limits_supported()


def test_backend_sets_reads_and_clears_in_mib(tmp_path, cgroups):
    b = NvmlBackend(fake(tmp_path, cgroups)).init()
    assert b.memory_limit(0, str(cgroups[1])) is None
    b.set_memory_limit(0, str(cgroups[1]), 20224)
    assert b.memory_limit(0, str(cgroups[1])) == (20224, 20224)
    b.clear_memory_limit(0, str(cgroups[1]))
    assert b.memory_limit(0, str(cgroups[1])) is None


def test_backend_errors_name_gpu_cgroup_and_cause(tmp_path, cgroups):
    b = NvmlBackend(fake(tmp_path, cgroups, euid=1000)).init()
    with pytest.raises(
        GpuError,
        match=r"GPU 0 \(GPU-.*\): set memory limit 100 MiB for cgroup .*job_42: "
        r"NVML_ERROR_NO_PERMISSION \(4\): needs root",
    ):
        b.set_memory_limit(0, str(cgroups[1]), 100)
    old = NvmlBackend(fake(tmp_path, cgroups, driver="580.65.06")).init()
    with pytest.raises(GpuError, match="FUNCTION_NOT_FOUND"):
        old.set_memory_limit(0, str(cgroups[1]), 100)
