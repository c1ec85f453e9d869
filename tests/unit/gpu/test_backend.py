"""NvmlBackend over the fake NVML: the same code path the real pynvml takes."""

from __future__ import annotations

import re
import sys

import pytest

from slurm_gpushare.gpu import (
    GpuError,
    MigMinorsError,
    NvmlBackend,
    Placement,
    open_backend,
    parse_mig_minors,
    read_mig_minors,
)
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.gpu.migminors import ci_access_minor, gi_access_minor, mig_minors_text
from slurm_gpushare.hardware import get_model

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@pytest.fixture
def fake(tmp_path):
    return FakeNvml.build(
        tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[0], minors=[3, 1], seed="b"
    )


@pytest.fixture
def backend(fake):
    with open_backend(fake.state_path) as b:
        yield b


def test_gpus(backend):
    gpu0, gpu1 = backend.gpus()
    assert (gpu0.index, gpu0.name, gpu0.memory_mib, gpu0.minor) == (0, "NVIDIA A100-SXM4-40GB", 40960, 3)
    assert gpu0.uuid.startswith("GPU-") and gpu0.uuid != gpu1.uuid
    assert gpu0.pci_bus_id == "00000000:10:00.0"
    assert (gpu0.mig_current, gpu0.mig_pending, gpu1.mig_current, gpu1.mig_pending) == (True, True, False, False)


def test_gpu_without_mig_support(tmp_path):
    FakeNvml.build(tmp_path / "s.json", model="L40S", count=1, mig_enabled=[])
    with open_backend(tmp_path / "s.json") as b:
        [gpu] = b.gpus()
        assert (gpu.mig_current, gpu.mig_pending) == (None, None)
        assert b.mig_devices(0) == [] and b.processes(0) == []


def test_profiles_enumerated_by_constant(backend):
    model = get_model("A100-SXM4-40GB")
    profiles = backend.gpu_instance_profiles(0)
    assert [p.constant for p in profiles] == [0, 1, 2, 3, 4, 7, 9]  # others skipped (NOT_SUPPORTED)
    for p in profiles:
        assert p.id == model.profile_for_constant(p.constant).profile_id
    assert backend.gpu_instance_profiles(1) == []  # MIG off: NVML says NOT_SUPPORTED


def test_possible_placements(backend):
    assert backend.possible_placements(0, 9) == [Placement(0, 4), Placement(4, 4)]
    assert [p.start for p in backend.possible_placements(0, 19)] == list(range(7))


def test_create_and_destroy_with_placements(backend):
    late = backend.create_gpu_instance(0, 9, 4)
    early = backend.create_gpu_instance(0, 14, 0)
    assert (late.profile_id, late.start, late.size, late.profile_constant) == (9, 4, 4, 2)
    assert [g.start for g in backend.gpu_instances(0)] == [0, 4]
    ci = backend.create_compute_instance(0, late.id, 2)
    assert (ci.id, ci.size, ci.profile_constant) == (0, 3, 2)
    assert backend.compute_instances(0, late.id) == [ci] and backend.compute_instances(0, early.id) == []
    backend.destroy_compute_instance(0, late.id, ci.id)
    backend.destroy_gpu_instance(0, late.id)
    backend.destroy_gpu_instance(0, early.id)
    assert backend.gpu_instances(0) == []


def test_errors_name_gpu_operation_and_code(backend):
    uuid = backend.gpus()[0].uuid
    backend.create_gpu_instance(0, 15, 6)  # a 1g.10gb at memory slices 6-7, inside the 3g's 4-7
    with pytest.raises(GpuError) as exc:
        backend.create_gpu_instance(0, 9, 4)
    assert exc.value.code == 23 and exc.value.index == 0 and exc.value.uuid == uuid
    assert (
        str(exc.value) == f"GPU 0 ({uuid}): create GPU instance (profile ID 9) at memory slice 4: "
        "NVML_ERROR_INSUFFICIENT_RESOURCES (23)"
    )
    gi = backend.create_gpu_instance(0, 9, 0)
    backend.create_compute_instance(0, gi.id, 2)
    with pytest.raises(GpuError, match=r"destroy GPU instance 1: NVML_ERROR_IN_USE \(19\)"):
        backend.destroy_gpu_instance(0, gi.id)
    with pytest.raises(GpuError, match=r"find GPU instance 9: NVML_ERROR_NOT_FOUND"):
        backend.destroy_gpu_instance(0, 9)
    with pytest.raises(GpuError, match="GPU 1 .*no such profile"):
        backend.create_gpu_instance(1, 9, 0)
    assert exc.value.exit_code == 2


def test_mig_devices_and_uuids(backend):
    for pid, start in ((9, 0), (19, 4), (19, 5)):
        gi = backend.create_gpu_instance(0, pid, start)
        backend.create_compute_instance(0, gi.id, 2 if pid == 9 else 0)
    devices = backend.mig_devices(0)
    assert [(d.gi_id, d.ci_id) for d in devices] == sorted((g.id, 0) for g in backend.gpu_instances(0))
    assert all(MIG_UUID.match(d.uuid) for d in devices) and len({d.uuid for d in devices}) == 3
    assert {d.name for d in devices} == {"NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA A100-SXM4-40GB MIG 1g.5gb"}
    assert sorted(d.memory_mib for d in devices) == [4864, 4864, 19968]
    assert backend.mig_devices(0) == devices  # stable across reads
    assert backend.mig_devices(1) == []


def test_recreated_instance_gets_a_new_uuid(backend):
    gi = backend.create_gpu_instance(0, 0, 0)
    backend.create_compute_instance(0, gi.id, 4)
    [before] = backend.mig_devices(0)
    backend.destroy_compute_instance(0, gi.id, 0)
    backend.destroy_gpu_instance(0, gi.id)
    gi = backend.create_gpu_instance(0, 0, 0)
    backend.create_compute_instance(0, gi.id, 4)
    [after] = backend.mig_devices(0)
    assert (after.gi_id, after.ci_id) == (before.gi_id, before.ci_id) and after.uuid != before.uuid


def test_processes_aggregate_mig_devices(fake, backend):
    for start in (0, 1):
        gi = backend.create_gpu_instance(0, 19, start)
        backend.create_compute_instance(0, gi.id, 0)
    ids = [g.id for g in backend.gpu_instances(0)]
    fake.add_process(0, 10, gi=ids[0], ci=0, used_mib=300)
    fake.add_process(0, 11, gi=ids[1], ci=0)
    fake.add_process(1, 12, used_mib=50)
    assert sorted((p.pid, p.gi_id, p.ci_id) for p in backend.processes(0)) == [(10, ids[0], 0), (11, ids[1], 0)]
    [whole] = backend.processes(1)
    assert (whole.pid, whole.used_mib, whole.gi_id, whole.ci_id) == (12, 50, None, None)


def test_shutdown_on_exit(fake):
    with open_backend(fake.state_path) as b:
        b.gpus()
    with pytest.raises(GpuError, match="NVML_ERROR_UNINITIALIZED"):
        b.gpu(1)


def test_fake_state_missing(tmp_path):
    with pytest.raises(GpuError, match="fake-nvml init"):
        open_backend(tmp_path / "none.json")


def test_real_nvml_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuError, match="pynvml module is not installed"):
        open_backend(None)


def test_real_nvml_without_driver_is_a_clear_error():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a GPU machine: the gpu tier covers it
        pynvml.nvmlShutdown()
        pytest.skip("NVML is available here")
    with pytest.raises(GpuError, match=r"^NVML: initialise: NVML_ERROR_"):
        open_backend(None)


def test_backend_takes_any_pynvml_like_object(fake):
    backend = NvmlBackend(fake, mig_minors_path=fake.mig_minors_path).init()
    assert len(backend.gpus()) == 2
    backend.shutdown()
    backend.shutdown()  # idempotent


# ---- mig-minors ------------------------------------------------------------------------


def test_mig_minors_closed_form():
    assert gi_access_minor(0, 1) == 12 and ci_access_minor(0, 1, 0) == 13
    assert gi_access_minor(3, 0) == 408 and ci_access_minor(31, 14, 7) == 4322


def test_mig_minors_parse():
    table = parse_mig_minors("config 1\nmonitor 2\ngpu1/gi2/access 156\ngpu1/gi2/ci0/access 157\n\n")
    assert table == {(1, 2, None): 156, (1, 2, 0): 157}


@pytest.mark.parametrize(
    "text, match",
    [
        ("gpu0/gi0/access x\n", r"mig-minors:1: expected"),
        ("config 1\ngpu0/gi0/compute 4\n", r"mig-minors:2: unknown capability 'gpu0/gi0/compute'"),
    ],
)
def test_mig_minors_bad_lines_are_errors(text, match):
    with pytest.raises(MigMinorsError, match=match):
        parse_mig_minors(text)


@pytest.mark.parametrize(
    "text",
    [mig_minors_text(), mig_minors_text().replace("\n", " \n", 5) + "\n"],
    ids=["as the driver writes it", "other spacing"],
)
def test_mig_minors_only_some_minors(text):
    """What the prolog asks for: the entries of its capability minors, as the whole table has them."""
    only = frozenset({1, 13, 4321, 4322, 9999})
    assert parse_mig_minors(text, only=only) == {k: m for k, m in parse_mig_minors(text).items() if m in only}
    assert parse_mig_minors(text, only=only) == {(0, 1, 0): 13, (31, 14, 6): 4321, (31, 14, 7): 4322}


@pytest.mark.parametrize("bad", ["gpu3/gi0/compute 4", "gpu3/gi0/access x", "gpu3/gi0/access 0x13"])
def test_mig_minors_only_still_checks_every_line(bad):
    text = mig_minors_text() + bad + "\n"
    with pytest.raises(MigMinorsError, match="mig-minors:4323: "):
        parse_mig_minors(text, only=frozenset({13}))


def test_mig_minors_missing_file(tmp_path):
    with pytest.raises(MigMinorsError, match="cannot read .*MIG support"):
        read_mig_minors(tmp_path / "mig-minors")
