"""MIG planning on a node: pure plan over observed state, executed on the fake NVML."""

from __future__ import annotations

import copy

import pytest

from slurm_gpushare.gpu import GpuError, open_backend
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hardware import get_model, place_layout
from slurm_gpushare.node.mig import (
    CreateCi,
    CreateGi,
    DestroyCi,
    DestroyGi,
    MigRefused,
    apply_actions,
    differences,
    observe,
    plan_mig,
)
from slurm_gpushare.policy import build_site, load_file
from tests.conftest import ROOT, minimal_policy


def slots_for(model: str, count: int, sharing: list[dict]):
    raw = copy.deepcopy(minimal_policy())
    raw["node_groups"][0].update(nodes="gpu-01", gpu={"model": model, "count": count}, sharing=sharing)
    return build_site(raw, "test.yaml").group_for_node("gpu-01").gpus


def a100_slots(layout):
    return slots_for(
        "A100-SXM4-40GB", 2, [{"gpus": 0, "mode": "mig", "layout": layout}, {"gpus": 1, "mode": "exclusive"}]
    )


@pytest.fixture
def node(tmp_path):
    """A node with two A100-40GB, MIG mode on GPU 0; yields (fake, backend)."""
    fake = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[0])
    with open_backend(fake.state_path) as backend:
        yield fake, backend


def make_layout(backend, index: int, profiles: list[tuple[int, int, int]]):
    """Create (profile id, start, CI constant) instances directly, as an admin would."""
    for profile_id, start, ci_constant in profiles:
        gi = backend.create_gpu_instance(index, profile_id, start)
        if ci_constant is not None:
            backend.create_compute_instance(index, gi.id, ci_constant)


def converge(backend, slots):
    apply_actions(backend, plan_mig(slots, observe(backend)))
    return plan_mig(slots, observe(backend)), differences(slots, observe(backend))


# ---- plans -------------------------------------------------------------------------------


def test_from_empty_creates_in_placement_order(node):
    _fake, backend = node
    slots = a100_slots(["1g.5gb", "3g.20gb", "2g.10gb"])
    actions = plan_mig(slots, observe(backend))
    want = place_layout(get_model("A100-SXM4-40GB"), ["1g.5gb", "3g.20gb", "2g.10gb"])
    assert [(a.profile, a.start) for a in actions] == list(want) == [("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]
    assert [(a.profile_id, a.ci_constant) for a in actions] == [(9, 2), (14, 1), (19, 0)]
    assert converge(backend, slots) == ([], [])


def test_no_actions_when_matching(node):
    _fake, backend = node
    slots = a100_slots("all-1g.5gb")
    converge(backend, slots)
    state = observe(backend)
    assert plan_mig(slots, state) == [] and differences(slots, state) == []


def test_3g_x2_to_1g_x7_on_a100(node):
    _fake, backend = node
    make_layout(backend, 0, [(9, 0, 2), (9, 4, 2)])
    slots = a100_slots("all-1g.5gb")
    state = observe(backend)
    assert differences(slots, state) == ["GPU 0: have 3g.20gb x2, want 1g.5gb x7"]
    actions = plan_mig(slots, state)
    gi_ids = [s.gi.id for s in state[0].instances]
    assert actions[:4] == [
        DestroyCi(0, gi_ids[0], 0),
        DestroyCi(0, gi_ids[1], 0),
        DestroyGi(0, gi_ids[0], "3g.20gb"),
        DestroyGi(0, gi_ids[1], "3g.20gb"),
    ]
    assert [(type(a), a.profile, a.start) for a in actions[4:]] == [(CreateGi, "1g.5gb", s) for s in range(7)]
    assert converge(backend, slots) == ([], [])
    assert [g.start for g in backend.gpu_instances(0)] == list(range(7))


def test_h100_mixed_production_two_3g_40gb(tmp_path):
    site = load_file(ROOT / "etc" / "mixed-production.yaml")
    slots = site.group_for_node("h100-03").gpus
    fake = FakeNvml.build(tmp_path / "nvml.json", model="H100-SXM5-80GB", count=8, mig_enabled=[4, 5])
    with open_backend(fake.state_path) as backend:
        actions = plan_mig(slots, observe(backend))
        assert {a.index for a in actions} == {4, 5}
        assert [(a.profile, a.start) for a in actions if a.index == 4] == [("3g.40gb", 0), ("3g.40gb", 4)]
        assert converge(backend, slots) == ([], [])
        assert [d.name for d in backend.mig_devices(5)] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb"] * 2


def test_only_the_differing_gpu_changes(tmp_path):
    slots = slots_for("A100-SXM4-40GB", 2, [{"gpus": "0-1", "mode": "mig", "layout": ["3g.20gb", "3g.20gb"]}])
    fake = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[0, 1])
    with open_backend(fake.state_path) as backend:
        make_layout(backend, 0, [(9, 0, 2), (9, 4, 2)])
        make_layout(backend, 1, [(0, 0, 4)])
        before = backend.mig_devices(0)
        actions = plan_mig(slots, observe(backend))
        assert {a.index for a in actions} == {1}
        assert converge(backend, slots) == ([], [])
        assert backend.mig_devices(0) == before  # untouched: same UUIDs


def test_matching_profiles_with_wrong_cis_only_redo_the_cis(node):
    _fake, backend = node
    make_layout(backend, 0, [(9, 0, 2), (9, 4, None)])
    state = observe(backend)
    split = state[0].instances[0].gi.id  # its full CI is replaced by 3 x 1c; the other GI has none
    backend.destroy_compute_instance(0, split, 0)
    for _ in range(3):
        backend.create_compute_instance(0, split, 0)
    state = observe(backend)
    empty = state[0].instances[1].gi.id
    slots = a100_slots(["3g.20gb", "3g.20gb"])
    assert differences(slots, state) == [
        (
            f"GPU 0: GI {split} (3g.20gb) has 3 compute instance(s); GI {empty} (3g.20gb) has 0 compute instance(s), "
            "want one full compute instance per GPU instance"
        )
    ]
    assert plan_mig(slots, state) == [
        DestroyCi(0, split, 0),
        DestroyCi(0, split, 1),
        DestroyCi(0, split, 2),
        CreateCi(0, split, "3g.20gb", 2),
        CreateCi(0, empty, "3g.20gb", 2),
    ]
    assert converge(backend, slots) == ([], [])


# ---- refusals ---------------------------------------------------------------------------------


def test_refuses_with_processes_naming_gpu_and_pids(node):
    fake, backend = node
    make_layout(backend, 0, [(9, 0, 2), (9, 4, 2)])
    ids = [g.id for g in backend.gpu_instances(0)]
    fake.add_process(0, 4711, gi=ids[0], ci=0)
    fake.add_process(0, 815, gi=ids[1], ci=0)
    uuid = backend.gpus()[0].uuid
    with pytest.raises(MigRefused) as exc:
        plan_mig(a100_slots("all-1g.5gb"), observe(backend))
    assert exc.value.reasons == [
        f"GPU 0 ({uuid}): processes are running on it (PIDs 815, 4711); its MIG layout cannot change under them"
    ]
    assert exc.value.exit_code == 1


def test_processes_on_unchanged_gpus_do_not_block(node):
    fake, backend = node
    fake.add_process(1, 99)  # GPU 1 is exclusive and stays as it is
    assert len(plan_mig(a100_slots("all-1g.5gb"), observe(backend))) == 7


def test_busy_hook(node):
    _fake, backend = node
    slots = a100_slots("all-1g.5gb")
    with pytest.raises(MigRefused, match="GPU 0 .*Slurm jobs are running on it"):
        plan_mig(slots, observe(backend), busy={0})
    assert len(plan_mig(slots, observe(backend), busy={1})) == 7


def test_refuses_when_mig_disabled_and_never_changes_it(node):
    _fake, backend = node
    slots = slots_for(
        "A100-SXM4-40GB", 2, [{"gpus": 1, "mode": "mig", "layout": ["7g.40gb"]}, {"gpus": 0, "mode": "exclusive"}]
    )
    state = observe(backend)
    assert "GPU 1: MIG mode is disabled, want 7g.40gb x1" in differences(slots, state)
    with pytest.raises(MigRefused) as exc:
        plan_mig(slots, state)
    text = str(exc.value)
    assert "GPU 1 (GPU-" in text and "never changes MIG mode" in text and "nvidia-smi -i 1 -mig 1" in text
    assert "GPU 0 (GPU-" in text and "MIG mode is enabled, but the policy shares it as exclusive" in text


def test_pending_mig_mode_is_named(node):
    fake, backend = node
    fake.set_mig_mode(1, current=False, pending=True)
    slots = slots_for(
        "A100-SXM4-40GB",
        2,
        [{"gpus": 0, "mode": "mig", "layout": ["7g.40gb"]}, {"gpus": 1, "mode": "mig", "layout": ["7g.40gb"]}],
    )
    with pytest.raises(MigRefused, match="enabling is pending"):
        plan_mig(slots, observe(backend))


def test_refuses_wrong_model_and_missing_gpu(tmp_path):
    fake = FakeNvml.build(tmp_path / "nvml.json", model="H100-SXM5-80GB", count=1, mig_enabled=[0])
    with open_backend(fake.state_path) as backend:
        state = observe(backend)
    found = differences(a100_slots("all-1g.5gb"), state)
    assert "NVML reports 'NVIDIA H100 80GB HBM3' (H100-SXM5-80GB), but the policy says A100-SXM4-40GB" in found[0]
    assert found[1] == "GPU 1: not found on this node (NVML lists GPUs: 0)"
    with pytest.raises(MigRefused):
        plan_mig(a100_slots("all-1g.5gb"), state)


def test_plan_is_pure(node):
    _fake, backend = node
    state = observe(backend)
    slots = a100_slots("all-balanced")
    assert plan_mig(slots, state) == plan_mig(slots, state)
    assert observe(backend) == state  # planning changed nothing


def test_apply_stops_at_the_first_nvml_failure(node):
    """A process that appears between plan and apply: NVML's IN_USE stops it, naming the GPU."""
    fake, backend = node
    make_layout(backend, 0, [(0, 0, 4)])
    actions = plan_mig(a100_slots("all-1g.5gb"), observe(backend))
    fake.add_process(0, 31337, gi=0, ci=0)
    with pytest.raises(
        GpuError, match=r"GPU 0 \(GPU-.*\): destroy compute instance 0 in GPU instance 0: NVML_ERROR_IN_USE"
    ):
        apply_actions(backend, actions)
    assert [g.profile_id for g in backend.gpu_instances(0)] == [0]


def test_actions_read_as_sentences():
    assert str(DestroyCi(2, 1, 0)) == "GPU 2: destroy compute instance 0 of GPU instance 1"
    assert str(DestroyGi(2, 1, "3g.20gb")) == "GPU 2: destroy GPU instance 1 (3g.20gb)"
    assert (
        str(CreateGi(2, "1g.5gb", 19, 6, 0)) == "GPU 2: create 1g.5gb at memory slice 6 with one full compute instance"
    )
    with pytest.raises(TypeError, match="not a MIG action"):
        apply_actions(None, ["destroy everything"])
