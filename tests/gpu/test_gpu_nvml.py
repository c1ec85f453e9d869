"""Real NVML, read-only: the backend's view of this machine's GPUs against the catalogue.

Nothing here changes MIG mode, MIG layout, compute mode, clocks or
persistence: only queries. Differences from the catalogue are failures worth
reading: several catalogue values are inferred (reference sheet section 7).
"""

from __future__ import annotations

import os
import re

import pytest

from slurm_gpushare.gpu import MIG_MINORS, read_mig_minors
from slurm_gpushare.gpu.migminors import ci_access_minor, gi_access_minor
from slurm_gpushare.hardware import CatalogueError, model_for_nvml_name

pytestmark = pytest.mark.gpu

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def known_model(gpu):
    try:
        return model_for_nvml_name(gpu.name)
    except CatalogueError:
        return None


def test_enumerate(gpus):
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for gpu in gpus:
        assert GPU_UUID.match(gpu.uuid), gpu
        assert gpu.memory_mib > 0 and gpu.minor >= 0
        assert re.match(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0$", gpu.pci_bus_id), gpu.pci_bus_id
    assert len({g.uuid for g in gpus}) == len(gpus) and len({g.minor for g in gpus}) == len(gpus)


def test_names_map_to_catalogue_models(gpus):
    known = [(g, known_model(g)) for g in gpus if known_model(g) is not None]
    if not known:
        pytest.skip(f"gpu tier: no catalogued model among {sorted({g.name for g in gpus})}")
    for gpu, model in known:
        assert abs(gpu.memory_mib - model.memory_mib) <= 0.03 * model.memory_mib, (
            gpu.name,
            gpu.memory_mib,
            model.memory_mib,
        )


def test_mig_mode_query(gpus):
    for gpu in gpus:
        model = known_model(gpu)
        assert gpu.mig_current in (None, True, False) and gpu.mig_pending in (None, True, False)
        if model is not None:
            assert (gpu.mig_current is not None) == model.mig_capable, (gpu.name, gpu.mig_current)


def test_processes_can_be_listed(backend, gpus):
    for gpu in gpus:
        assert all(p.pid > 0 for p in backend.processes(gpu.index))


def test_mig_profiles_match_catalogue(backend, mig_gpus):
    for gpu in mig_gpus:
        profiles = backend.gpu_instance_profiles(gpu.index)
        assert profiles, gpu
        model = known_model(gpu)
        if model is None:
            continue
        for live in profiles:
            try:
                want = model.profile_for_constant(live.constant)
            except CatalogueError:
                continue  # a profile the catalogue does not list (e.g. newer drivers' GFX / NO_ME)
            assert (live.id, live.slice_count, live.instance_count) == (
                want.profile_id,
                want.compute_slices,
                want.max_instances,
            ), (want.name, live)
            assert abs(live.memory_mib - want.memory_mib) <= 0.02 * want.memory_mib, (
                want.name,
                live.memory_mib,
                want.memory_mib,
            )
            placements = backend.possible_placements(gpu.index, live.id)
            assert [(p.start, p.size) for p in placements] == [(s, want.memory_slices) for s in want.placements], (
                want.name
            )


def test_mig_devices(backend, mig_gpus):
    for gpu in mig_gpus:
        devices = backend.mig_devices(gpu.index)
        gi_ids = {g.id for g in backend.gpu_instances(gpu.index)}
        for device in devices:
            assert MIG_UUID.match(device.uuid) and " MIG " in device.name, device
            assert device.gi_id in gi_ids and device.memory_mib > 0
            assert any(c.id == device.ci_id for c in backend.compute_instances(gpu.index, device.gi_id))


def test_mig_minors_closed_form(mig_gpus):
    if not os.path.exists(MIG_MINORS):
        pytest.skip(f"gpu tier: {MIG_MINORS} absent")
    table = read_mig_minors()
    assert table, MIG_MINORS
    for (gpu, gi, ci), minor in table.items():
        assert minor == (gi_access_minor(gpu, gi) if ci is None else ci_access_minor(gpu, gi, ci)), (gpu, gi, ci)
