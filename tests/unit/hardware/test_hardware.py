"""The GPU catalogue: data consistency, lookups, MIG layout validity and placement.

Layouts are written by profile *type* ("3g", "1g.dbl", ...) and translated to
each model's names through the NVML constant, so one table covers every GPU
of a geometry.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from slurm_gpushare import hardware as hw
from slurm_gpushare.hardware import CatalogueError, GpuModel, MigProfile

MIG_MODELS = [m for m in hw.models() if m.mig_capable]
EIGHT_SLICE = [m for m in MIG_MODELS if m.memory_slices == 8]
A30 = hw.get_model("A30-24GB")
A100_40 = hw.get_model("A100-SXM4-40GB")

# NVML_GPU_INSTANCE_PROFILE_* constant of each profile type (reference 1.1).
TYPE_CONSTANT = {"1g": 0, "2g": 1, "3g": 2, "4g": 3, "7g": 4, "1g+me": 7, "2g+me": 8, "1g.dbl": 9}


def names_of(model: GpuModel, types: str) -> list[str]:
    """'3g 2g 1g*2' -> that model's profile names."""
    names = []
    for token in types.split():
        kind, _, count = token.partition("*")
        names += [model.profile_for_constant(TYPE_CONSTANT[kind]).name] * int(count or 1)
    return names


def ids(model: GpuModel) -> str:
    return model.name


# --- the models -------------------------------------------------------------

EXPECTED = {
    # name: (slurm_type, compute, memory slices, profile names)
    "A100-PCIE-40GB": ("a100_pcie_40g", 7, 8, "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"),
    "A100-PCIE-80GB": ("a100_pcie_80g", 7, 8, "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "H100-PCIE-80GB": ("h100_pcie", 7, 8, "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "A100-SXM4-40GB": ("a100_40g", 7, 8, "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"),
    "A100-SXM4-80GB": ("a100_80g", 7, 8, "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "A30-24GB": ("a30", 4, 4, "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb"),
    "H100-NVL-94GB": ("h100_nvl", 7, 8, "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb"),
    "H100-SXM5-80GB": ("h100", 7, 8, "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb"),
    "H200-141GB": ("h200", 7, 8, "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"),
    "L40S": ("l40s", 0, 0, ""),
}


def test_models_are_the_expected_ones_sorted_by_name():
    assert [m.name for m in hw.models()] == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_shape(name):
    model = hw.get_model(name)
    slurm_type, compute, memory, profiles = EXPECTED[name]
    assert (model.slurm_type, model.compute_slices, model.memory_slices) == (slurm_type, compute, memory)
    assert [p.name for p in model.mig_profiles] == profiles.split()
    assert model.mig_capable == bool(profiles)
    assert model.memory_mib > 0 and model.source and model.nvml_names


@pytest.mark.parametrize(
    "name, memory_mib, pci_id",
    [
        ("A100-SXM4-40GB", 40960, 0x20B010DE),
        ("A100-SXM4-80GB", 81920, 0x20B210DE),
        ("A30-24GB", 24576, 0x20B710DE),
        ("H100-SXM5-80GB", 81559, 0x233010DE),
        ("H100-NVL-94GB", 95830, 0x232110DE),
        ("H200-141GB", 143771, 0x233510DE),
        ("L40S", 46068, None),
        ("A100-PCIE-40GB", 40960, None),
        ("A100-PCIE-80GB", 81920, None),
        ("H100-PCIE-80GB", 81559, None),
    ],
)
def test_whole_gpu_values(name, memory_mib, pci_id):
    model = hw.get_model(name)
    assert model.memory_mib == memory_mib
    assert (pci_id in model.pci_device_ids) if pci_id else model.pci_device_ids == ()


def test_pci_ids_belong_to_one_model_each():
    all_ids = [i for m in hw.models() for i in m.pci_device_ids]
    assert len(all_ids) == len(set(all_ids))


# --- profile data -----------------------------------------------------------

# (model, profile, nvml constant, -lgip id, compute, memory slices, MiB, max, placements, SMs)
PROFILE_ROWS = [
    ("A100-SXM4-40GB", "1g.5gb", 0, 19, 1, 1, 4864, 7, (0, 1, 2, 3, 4, 5, 6), 14),
    ("A100-SXM4-40GB", "1g.5gb+me", 7, 20, 1, 1, 4864, 1, (0, 1, 2, 3, 4, 5, 6), 14),
    ("A100-SXM4-40GB", "1g.10gb", 9, 15, 1, 2, 9851, 4, (0, 2, 4, 6), 14),
    ("A100-SXM4-40GB", "2g.10gb", 1, 14, 2, 2, 9851, 3, (0, 2, 4), 28),
    ("A100-SXM4-40GB", "3g.20gb", 2, 9, 3, 4, 19968, 2, (0, 4), 42),
    ("A100-SXM4-40GB", "4g.20gb", 3, 5, 4, 4, 19968, 1, (0,), 56),
    ("A100-SXM4-40GB", "7g.40gb", 4, 0, 7, 8, 40192, 1, (0,), 98),
    ("A100-SXM4-80GB", "7g.80gb", 4, 0, 7, 8, 80896, 1, (0,), 98),
    ("H100-SXM5-80GB", "1g.10gb", 0, 19, 1, 1, 9984, 7, (0, 1, 2, 3, 4, 5, 6), 16),
    ("H100-SXM5-80GB", "3g.40gb", 2, 9, 3, 4, 40448, 2, (0, 4), 60),
    ("H100-NVL-94GB", "1g.12gb", 0, 19, 1, 1, 11008, 7, (0, 1, 2, 3, 4, 5, 6), 16),
    ("H100-NVL-94GB", "1g.24gb", 9, 15, 1, 2, 22144, 4, (0, 2, 4, 6), 26),
    ("H100-NVL-94GB", "3g.47gb", 2, 9, 3, 4, 47488, 2, (0, 4), 60),
    ("H200-141GB", "1g.18gb", 0, 19, 1, 1, 16384, 7, (0, 1, 2, 3, 4, 5, 6), 16),
    ("H200-141GB", "2g.35gb", 1, 14, 2, 2, 33280, 3, (0, 2, 4), 32),
    ("H200-141GB", "7g.141gb", 4, 0, 7, 8, 143360, 1, (0,), 132),
    ("A30-24GB", "1g.6gb", 0, 14, 1, 1, 5949, 4, (0, 1, 2, 3), 14),
    ("A30-24GB", "1g.6gb+me", 7, 21, 1, 1, 5949, 1, (0, 1, 2, 3), 14),
    ("A30-24GB", "2g.12gb", 1, 5, 2, 2, 11971, 2, (0, 2), 28),
    ("A30-24GB", "2g.12gb+me", 8, 6, 2, 2, 11971, 1, (0, 2), 28),
    ("A30-24GB", "4g.24gb", 3, 0, 4, 4, 24003, 1, (0,), 56),
    ("A100-PCIE-40GB", "1g.5gb", 0, 19, 1, 1, 4864, 7, (0, 1, 2, 3, 4, 5, 6), 14),
    ("A100-PCIE-80GB", "3g.40gb", 2, 9, 3, 4, 40192, 2, (0, 4), 42),
    ("H100-PCIE-80GB", "1g.10gb", 0, 19, 1, 1, 9984, 7, (0, 1, 2, 3, 4, 5, 6), 14),
    ("H100-PCIE-80GB", "2g.20gb", 1, 14, 2, 2, 20091, 3, (0, 2, 4), 30),
    ("H100-PCIE-80GB", "7g.80gb", 4, 0, 7, 8, 81152, 1, (0,), 114),
]


@pytest.mark.parametrize("row", PROFILE_ROWS, ids=lambda r: f"{r[0]}:{r[1]}")
def test_profile_values(row):
    model_name, name, constant, profile_id, compute, memory, mib, max_inst, placements, sms = row
    p = hw.get_model(model_name).profile(name)
    assert (p.nvml_constant, p.profile_id, p.compute_slices, p.memory_slices) == (
        constant,
        profile_id,
        compute,
        memory,
    )
    assert (p.memory_mib, p.max_instances, p.placements, p.multiprocessors) == (mib, max_inst, placements, sms)


UNCONFIRMED = {("H200-141GB", "1g.35gb"), ("H200-141GB", "3g.71gb"), ("H200-141GB", "4g.71gb")}


@pytest.mark.parametrize("model", MIG_MODELS, ids=ids)
def test_only_reference_unconfirmed_values_are_marked_and_they_say_why(model):
    for p in model.mig_profiles:
        assert p.confirmed == ((model.name, p.name) not in UNCONFIRMED), p.name
        if not p.confirmed:
            assert "inferred" in p.note and p.multiprocessors is None


@pytest.mark.parametrize("model", MIG_MODELS, ids=ids)
def test_profiles_are_physically_consistent(model):
    for p in model.mig_profiles:
        assert all(s >= 0 and s + p.memory_slices <= model.memory_slices for s in p.placements)
        assert p.memory_mib < model.memory_mib
        assert p.max_instances <= len(p.placements)
        assert (p.max_instances == 1) if p.media_extensions else p.max_instances >= 1
        assert 0 < p.fraction(model) <= 1


@pytest.mark.parametrize("model", EIGHT_SLICE, ids=ids)
def test_one_slice_never_starts_at_the_last_memory_slice(model):
    assert 7 not in model.profile_for_constant(0).placements


@pytest.mark.parametrize(
    "gi, expected",
    [
        ("1g.5gb", (("1g.5gb", 0),)),
        ("1g.10gb", (("1g.10gb", 0),)),
        ("2g.10gb", (("1c.2g.10gb", 0), ("2g.10gb", 1))),
        ("3g.20gb", (("1c.3g.20gb", 0), ("2c.3g.20gb", 1), ("3g.20gb", 2))),
        ("4g.20gb", (("1c.4g.20gb", 0), ("2c.4g.20gb", 1), ("3c.4g.20gb", 2), ("4g.20gb", 3))),
        ("7g.40gb", (("1c.7g.40gb", 0), ("2c.7g.40gb", 1), ("3c.7g.40gb", 2), ("4c.7g.40gb", 3), ("7g.40gb", 4))),
    ],
)
def test_compute_instance_profiles(gi, expected):
    assert A100_40.profile(gi).compute_profiles == expected


@pytest.mark.parametrize(
    "profile, expected",
    [("1g.5gb", 1 / 7), ("1g.10gb", 0.25), ("2g.10gb", 2 / 7), ("3g.20gb", 0.5), ("4g.20gb", 4 / 7), ("7g.40gb", 1.0)],
)
def test_fraction(profile, expected):
    assert A100_40.profile(profile).fraction(A100_40) == pytest.approx(expected)


def test_fraction_on_a30_and_without_mig():
    assert A30.profile("1g.6gb").fraction(A30) == 0.25
    with pytest.raises(CatalogueError, match="L40S has no MIG slices"):
        A30.profile("1g.6gb").fraction(hw.get_model("L40S"))


@pytest.mark.parametrize(
    "profile, suffix, slurm_type",
    [
        ("1g.5gb", "1g.5gb", "a100_40g_1g.5gb"),
        ("1g.5gb+me", "1g.5gb_me", "a100_40g_1g.5gb_me"),
        ("7g.40gb", "7g.40gb", "a100_40g_7g.40gb"),
    ],
)
def test_slurm_names(profile, suffix, slurm_type):
    assert A100_40.profile(profile).slurm_suffix == suffix
    assert A100_40.mig_slurm_type(profile) == slurm_type


def test_mig_slurm_type_per_model():
    assert hw.get_model("H100-NVL-94GB").mig_slurm_type("1g.12gb+me") == "h100_nvl_1g.12gb_me"
    assert A30.mig_slurm_type("4g.24gb") == "a30_4g.24gb"


def test_profile_lookup_spellings():
    p = A100_40.profile("1g.5gb+me")
    assert A100_40.profile("1G.5GB+ME") is p
    assert A100_40.profile("1g.5gb_me") is p
    assert A100_40.profile_for_constant(7) is p
    assert A100_40.profile_for_id(20) is p


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(CatalogueError) as err:
        A100_40.profile("1g.10gb+me")
    assert "A100-SXM4-40GB" in str(err.value)
    assert "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb" in str(err.value)
    with pytest.raises(CatalogueError, match=r"known profile IDs: .*19 \(1g\.5gb\)"):
        A100_40.profile_for_id(99)
    with pytest.raises(CatalogueError, match=r"known profiles: \(none\)"):
        hw.get_model("L40S").profile("1g.5gb")


# --- lookups ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_get_model_exact_and_case_insensitive(name):
    model = hw.get_model(name)
    assert model.name == name
    assert hw.get_model(name.lower()) is model
    assert hw.get_model(name.upper()) is model


@pytest.mark.parametrize("bad", ["A100", "H100-SXM5", "", "NVIDIA H200", None])
def test_get_model_error_lists_known_models(bad):
    with pytest.raises(CatalogueError) as err:
        hw.get_model(bad)
    assert "known models: " + ", ".join(sorted(EXPECTED)) in str(err.value)


NVML_NAMES = [(m.name, n) for m in hw.models() for n in m.nvml_names]


@pytest.mark.parametrize("model_name, nvml_name", NVML_NAMES)
def test_model_for_each_nvml_name(model_name, nvml_name):
    assert hw.model_for_nvml_name(nvml_name).name == model_name


@pytest.mark.parametrize(
    "nvml_name, model_name",
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
        ("NVIDIA H100 PCIe MIG 3g.40gb", "H100-PCIE-80GB"),
        ("NVIDIA H200 MIG 1g.18gb", "H200-141GB"),
        ("A100-SXM4-40GB MIG 4c.7g.40gb", "A100-SXM4-40GB"),
        ("  nvidia   h100 nvl ", "H100-NVL-94GB"),
    ],
)
def test_model_for_nvml_name_spellings(nvml_name, model_name):
    assert hw.model_for_nvml_name(nvml_name).name == model_name


@pytest.mark.parametrize("bad", ["NVIDIA H800 PCIe", "NVIDIA H200 NVL", "Tesla T4", ""])
def test_model_for_unknown_nvml_name_lists_known(bad):
    with pytest.raises(CatalogueError, match=r"known NVML names: .*NVIDIA H100 80GB HBM3"):
        hw.model_for_nvml_name(bad)


# --- named layouts ------------------------------------------------------------

NAMED = [(m, name, layout) for m in MIG_MODELS for name, layout in m.named_layouts().items()]


@pytest.mark.parametrize("model, name, layout", NAMED, ids=[f"{m.name}:{n}" for m, n, _ in NAMED])
def test_every_named_layout_is_valid(model, name, layout):
    assert hw.check_layout(model, layout) == []
    assert hw.place_layout(model, layout) is not None


@pytest.mark.parametrize("model", MIG_MODELS, ids=ids)
def test_named_layouts_cover_every_plain_profile(model):
    layouts = model.named_layouts()
    plain = [p for p in model.mig_profiles if not p.media_extensions]
    assert list(layouts) == [f"all-{p.name}" for p in plain] + ["all-balanced"]
    for p in plain:
        assert layouts[f"all-{p.name}"] == (p.name,) * p.max_instances


@pytest.mark.parametrize(
    "model_name, name, expected",
    [
        ("A100-SXM4-40GB", "all-1g.5gb", ("1g.5gb",) * 7),
        ("A100-SXM4-40GB", "all-3g.20gb", ("3g.20gb",) * 2),
        ("A100-SXM4-40GB", "all-1g.10gb", ("1g.10gb",) * 4),
        ("A100-SXM4-40GB", "all-balanced", ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")),
        ("H200-141GB", "all-balanced", ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")),
        ("A30-24GB", "all-balanced", ("2g.12gb", "1g.6gb", "1g.6gb")),
        ("A30-24GB", "all-2g.12gb", ("2g.12gb",) * 2),
    ],
)
def test_named_layout_contents(model_name, name, expected):
    assert hw.get_model(model_name).named_layouts()[name] == expected


def test_non_mig_model_has_no_named_layouts():
    assert hw.get_model("L40S").named_layouts() == {}


# --- documented layouts --------------------------------------------------------

# Layouts NVIDIA documents or that were seen created (reference 1.1, 1.5; MIG-GS, MIG-CON, OUT).
VALID_8 = [
    "1g*7",
    "2g*3 1g",
    "3g*2",
    "4g 3g",
    "4g 2g 1g",
    "4g 1g*3",
    "3g 2g 1g*2",
    "3g 1g*4",
    "7g",
    "1g.dbl*4",
    "3g 1g.dbl 1g",
    "1g+me 1g*6",
    "2g*3 1g.dbl",
    "4g 1g.dbl 1g*2",
]
VALID_4 = ["1g*4", "2g*2", "2g 1g*2", "4g", "1g+me 1g*3", "2g+me 2g", "2g+me 1g*2", "1g+me 2g 1g"]
DOCUMENTED = [(m, t) for m in EIGHT_SLICE for t in VALID_8] + [(A30, t) for t in VALID_4]
DOC_IDS = [f"{m.name}:{t}" for m, t in DOCUMENTED]


@pytest.mark.parametrize("model, types", DOCUMENTED, ids=DOC_IDS)
def test_documented_layouts_are_accepted(model, types):
    assert hw.check_layout(model, names_of(model, types)) == []


# (types, substrings every one of which must appear in some reason)
INVALID_8 = [
    ("4g*2", ["2 x {4g} exceeds its maximum of 1", "needs 8 compute slices"]),
    ("1g*8", ["8 x {1g} exceeds its maximum of 7", "needs 8 compute slices"]),
    ("1g+me*2", ["2 x {1g+me} exceeds its maximum of 1"]),
    ("7g 1g", ["needs 8 compute slices", "needs 9 memory slices"]),
    ("3g*3", ["3 x {3g} exceeds its maximum of 2", "needs 9 compute slices", "needs 12 memory slices"]),
    ("2g*4", ["4 x {2g} exceeds its maximum of 3", "needs 8 compute slices"]),
    ("4g 4g", ["exceeds its maximum of 1"]),
    ("3g*2 1g", ["needs 9 memory slices"]),
    ("1g.dbl*5", ["5 x {1g.dbl} exceeds its maximum of 4", "needs 10 memory slices"]),
    ("4g 2g*2", ["needs 8 compute slices"]),
]
INVALID_4 = [
    ("1g*5", ["5 x {1g} exceeds its maximum of 4", "needs 5 compute slices"]),
    ("2g+me*2", ["2 x {2g+me} exceeds its maximum of 1"]),
    ("4g 1g", ["needs 5 compute slices", "needs 5 memory slices"]),
    ("2g*3", ["3 x {2g} exceeds its maximum of 2"]),
]
REJECTED = [(m, t, r) for m in EIGHT_SLICE for t, r in INVALID_8] + [(A30, t, r) for t, r in INVALID_4]


@pytest.mark.parametrize("model, types, wanted", REJECTED, ids=[f"{m.name}:{t}" for m, t, _ in REJECTED])
def test_invalid_layouts_are_rejected_with_the_reason(model, types, wanted):
    names = names_of(model, types)
    reasons = hw.check_layout(model, names)
    assert reasons and hw.place_layout(model, names) is None
    type_names = {
        f"{{{k}}}": model.profile_for_constant(c).name
        for k, c in TYPE_CONSTANT.items()
        if any(p.nvml_constant == c for p in model.mig_profiles)
    }
    for want in wanted:
        for placeholder, name in type_names.items():
            want = want.replace(placeholder, name)
        assert any(want in r and model.name in r for r in reasons), (want, reasons)


def test_unknown_profile_in_layout_lists_known_profiles():
    reasons = hw.check_layout(A100_40, ["3g.20gb", "5g.30gb", "5g.30gb"])
    assert reasons == [
        "unknown MIG profile '5g.30gb' for A100-SXM4-40GB; known profiles: "
        "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"
    ]
    with pytest.raises(CatalogueError, match="known profiles"):
        hw.place_layout(A100_40, ["5g.30gb"])


def test_profile_names_of_another_model_are_unknown():
    reasons = hw.check_layout(hw.get_model("H100-SXM5-80GB"), ["1g.5gb"])
    assert len(reasons) == 1 and "unknown MIG profile '1g.5gb'" in reasons[0]


def test_mig_on_a_gpu_without_mig_is_rejected():
    l40s = hw.get_model("L40S")
    assert hw.check_layout(l40s, ["1g.5gb"]) == [
        "L40S does not support MIG, so the MIG layout 1g.5gb cannot be applied"
    ]
    assert hw.place_layout(l40s, ["1g.5gb"]) is None


@pytest.mark.parametrize("model", hw.models(), ids=ids)
def test_empty_layout_is_valid_everywhere(model):
    assert hw.check_layout(model, []) == []
    assert hw.place_layout(model, ()) == ()


def test_a_bare_string_is_not_a_layout():
    with pytest.raises(TypeError, match="sequence of profile names"):
        hw.place_layout(A100_40, "1g.5gb")
    with pytest.raises(TypeError):
        hw.check_layout(A100_40, "1g.5gb")


def test_placement_only_failure_is_reported():
    """No catalogue GPU has a layout that fits the budgets but not the placements,
    so a made-up GPU whose 2g can only start at 0 shows the message."""
    tight = GpuModel(
        name="TEST-4SLICE",
        nvml_names=("TEST",),
        slurm_type="test",
        memory_mib=4096,
        compute_slices=4,
        memory_slices=4,
        multiprocessors=None,
        pci_device_ids=(),
        mig_profiles=(MigProfile("2g.2gb", 1, 5, 2, 2, 2048, 2, (0,)),),
        source="test",
    )
    assert hw.check_layout(tight, ["2g.2gb", "2g.2gb"]) == ["no valid placement for 2g.2gb + 2g.2gb on TEST-4SLICE"]
    assert hw.place_layout(tight, ["2g.2gb"]) == (("2g.2gb", 0),)


@pytest.mark.parametrize(
    "profiles, problem",
    [
        ((MigProfile("2g.2gb", 1, 5, 2, 2, 2048, 2, (0, 3)),), "run past memory slice 3"),
        ((MigProfile("8g.8gb", 1, 5, 8, 4, 2048, 1, (0,)),), "8 compute slices, GPU has 4"),
        (
            (MigProfile("1g.1gb", 0, 1, 1, 1, 1024, 1, (0,)), MigProfile("1G.1GB", 7, 2, 1, 1, 1024, 1, (1,))),
            "duplicate profile name",
        ),
        ((MigProfile("1g.1gb", 0, 1, 1, 1, 1024, 1, (0,), confirmed=False),), "need a note"),
    ],
)
def test_inconsistent_catalogue_data_is_refused(profiles, problem):
    with pytest.raises(CatalogueError, match=problem):
        GpuModel("BAD", ("BAD",), "bad", 4096, 4, 4, None, (), profiles, "test")


# --- placement ----------------------------------------------------------------

ALL_VALID = [(m, names_of(m, t)) for m, t in DOCUMENTED] + [(m, list(layout)) for m, _, layout in NAMED]


def occupied(model: GpuModel, name: str, start: int) -> set[int]:
    return set(range(start, start + model.profile(name).memory_slices))


@pytest.mark.parametrize("model, names", ALL_VALID, ids=[f"{m.name}:{'+'.join(n)}" for m, n in ALL_VALID])
def test_placements_are_valid_and_disjoint(model, names):
    placed = hw.place_layout(model, names)
    assert Counter(n for n, _ in placed) == Counter(names)
    taken: set[int] = set()
    for name, start in placed:
        assert start in model.profile(name).placements
        slices = occupied(model, name, start)
        assert not slices & taken
        taken |= slices


@pytest.mark.parametrize("model, names", ALL_VALID, ids=[f"{m.name}:{'+'.join(n)}" for m, n in ALL_VALID])
def test_placement_is_deterministic_and_largest_first(model, names):
    placed = hw.place_layout(model, names)
    assert hw.place_layout(model, list(reversed(names))) == placed
    assert hw.place_layout(model, tuple(sorted(names))) == placed
    sizes = [model.profile(n).memory_slices for n, _ in placed]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    "layout, expected",
    [
        (["4g.20gb", "3g.20gb"], (("4g.20gb", 0), ("3g.20gb", 4))),
        (["3g.20gb", "3g.20gb"], (("3g.20gb", 0), ("3g.20gb", 4))),
        (["1g.10gb"] * 4, (("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6))),
        (["1g.5gb", "2g.10gb", "1g.5gb", "3g.20gb"], (("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3))),
        (["2g.10gb"] * 3 + ["1g.5gb"], (("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6))),
        (["7g.40gb"], (("7g.40gb", 0),)),
    ],
)
def test_known_placements(layout, expected):
    assert hw.place_layout(A100_40, layout) == expected


def test_placement_accepts_other_spellings_and_returns_canonical_names():
    assert hw.place_layout(A100_40, ["1G.5GB_ME", "3g.20gb"]) == (("3g.20gb", 0), ("1g.5gb+me", 4))


def test_placement_is_memoised_for_catalogue_models():
    first = hw.place_layout(A100_40, ["3g.20gb", "1g.5gb"])
    assert hw.place_layout(A100_40, ["1g.5gb", "3g.20gb"]) is first


def brute_force_fits(model: GpuModel, names: list[str]) -> bool:
    """Independent check: every choice of distinct starts per profile, no pruning."""
    counts = Counter(names)
    profiles = [model.profile(n) for n in counts]
    choices = [itertools.combinations(p.placements, counts[p.name]) for p in profiles]
    for starts in itertools.product(*choices):
        slices = [
            s
            for p, chosen in zip(profiles, starts, strict=True)
            for start in chosen
            for s in range(start, start + p.memory_slices)
        ]
        if len(slices) == len(set(slices)):
            return True
    return False


@pytest.mark.parametrize("model", MIG_MODELS, ids=ids)
def test_search_agrees_with_brute_force_on_every_layout(model):
    profiles = model.mig_profiles
    for counts in itertools.product(*(range(p.max_instances + 1) for p in profiles)):
        if sum(p.compute_slices * c for p, c in zip(profiles, counts, strict=True)) > model.compute_slices:
            continue
        names = [p.name for p, c in zip(profiles, counts, strict=True) for _ in range(c)]
        fits = brute_force_fits(model, names)
        assert (hw.place_layout(model, names) is not None) == fits, names
        assert (hw.check_layout(model, names) == []) == fits, names
