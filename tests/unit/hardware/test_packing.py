"""Catalogue facts for shares of a GPU (hardware/packing.py) that the static and the live planner both use."""

from __future__ import annotations

from collections import Counter

from slurm_gpushare.hardware import check_layout, get_model, models
from slurm_gpushare.hardware.packing import GPU_MILLI, covering, pack, plain_profiles, whole_profile
from slurm_gpushare.sim import cluster


def test_the_whole_gpu_profile_is_the_plain_one_with_every_slice_and_the_least_memory():
    assert whole_profile(get_model("A100-SXM4-40GB")).name == "7g.40gb"
    for model in models():
        whole = whole_profile(model)
        if not model.mig_capable:
            assert whole is None
            continue
        assert whole.fraction(model) >= 1 and not whole.media_extensions
        assert whole in plain_profiles(model)
        assert covering(model, GPU_MILLI) == whole.name  # a whole GPU's share takes it


def test_one_unit_for_a_share_the_simulator_counts_in_the_same():
    assert GPU_MILLI == 1000 and cluster.GPU_MILLI is GPU_MILLI


def test_packed_layouts_hold_what_was_asked_and_each_is_valid():
    a100 = get_model("A100-SXM4-40GB")
    need = Counter({"3g.20gb": 3, "2g.10gb": 2, "1g.5gb": 5})
    for fill in (False, True):
        layouts = pack(a100, need, fill=fill)
        held = Counter(p for lay in layouts for p in lay)
        assert all(held[p] >= n for p, n in need.items())
        assert all(not check_layout(a100, list(lay)) for lay in layouts)
