"""The catalogue's data: MIG geometry, per-GPU profile values, whole-GPU facts.

Each table names the sources of its values by key; every key is public:

  MIG-SP     NVIDIA Multi-Instance GPU User Guide (r570 documentation; PDF
             RN-08625-v2.0, March 2024), "Supported MIG Profiles":
             https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
             (profile names, memory and SM fractions, instance counts, driver notes)
  MIG-GS     the same guide, "Getting Started with MIG" (.../getting-started-with-mig.html):
             `nvidia-smi mig -lgip` / `-lgipp` / `-lcip` transcripts (IDs, placements, GiB, SMs)
  MIG-CON    the same guide, "Concepts" (.../concepts.html): slices, CI sizes, the R510 4g+3g note
  NVML-H     NVML API Reference (https://docs.nvidia.com/deploy/nvml-api/), as the header
             nvml.h of NVML API 13 (github.com/NVIDIA/go-nvml, gen/nvml/nvml.h at 2f9e261):
             NVML_GPU_INSTANCE_PROFILE_* / NVML_COMPUTE_INSTANCE_PROFILE_* constants, placements
  PYNVML     nvidia-ml-py 13.615.71 (PyPI), pynvml.py: the same constants as Python sees them
  MPARTED    github.com/NVIDIA/mig-parted at bd7160f, deployments/systemd/config-default.yaml:
             PCI device IDs grouped per MIG geometry
  OUT        third-party `nvidia-smi` transcripts on public pages (e.g. jbarrow.ai
             field_notes/nvidia-mig for H100-SXM5-80GB; Microsoft Azure's H100 NVL MIG
             walkthrough); the table that uses one says which GPU it is for
  OUT-PROBE  a third-party nvidia-smi probe table (name, memory.total, driver
             580.95.05) in a public repository: whole-GPU memory of A100-SXM4-40/80GB,
             H100 80GB HBM3, H200 and L40S. A30's 24576 MiB is from two other transcripts (OUT).
  SPEC       NVIDIA's product specifications (SM count = CUDA cores / cores per SM),
             used only for whole-GPU SMs.

"reference N.N" in the comments below names the section of the maintainers'
notes a value was collected in; the key beside it is where to check it.

Memory of a MIG profile is `nvidia-smi mig -lgip` GiB as printed x 1024,
rounded: an inference ("MiB ~ GiB x 1024"; whether NVML's memorySizeMB
equals it was not confirmed on hardware). Printed
GiB has two decimals, so e.g. 9.62 may really be 9.625 (9856 MiB, not 9851);
where the sheet records an exact MiB figure that differs, the figure is used.

Placements, slice counts and max instances come from the per-geometry shape
tables; the per-GPU tables give only what differs between GPUs.
"""

from __future__ import annotations

from ..records import record
from .model import GpuModel, MigProfile


@record
class _Shape:
    """What a profile type is on every GPU of one geometry."""

    nvml_constant: int
    profile_id: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]


@record
class _Row:
    """What one GPU's `-lgip` says about one profile type."""

    shape: str
    name: str
    gib: float
    multiprocessors: int | None
    confirmed: bool = True
    note: str = ""
    mib: int | None = None  # exact MiB where the reference records one


# Reference 1.1 (7 compute / 8 memory slices: A100, H100, H200). Fractions and
# counts: MIG-SP. IDs and placements verbatim: MIG-GS (A100-40GB -lgip/-lgipp),
# OUT (H100 NVL walkthrough; A100-80GB and H100-80GB IDs). NVML constants:
# NVML-H / PYNVML; the constant-to-ID pairing is inferred from names and slice
# counts (1.1). 1g cannot start at memory slice 7.
_SHAPES_8 = {
    "1g": _Shape(0, 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),  # 1_SLICE
    "1g+me": _Shape(7, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),  # 1_SLICE_REV1
    "1g.dbl": _Shape(9, 15, 1, 2, 4, (0, 2, 4, 6)),  # 1_SLICE_REV2: twice the memory
    "2g": _Shape(1, 14, 2, 2, 3, (0, 2, 4)),  # 2_SLICE
    "3g": _Shape(2, 9, 3, 4, 2, (0, 4)),  # 3_SLICE
    "4g": _Shape(3, 5, 4, 4, 1, (0,)),  # 4_SLICE
    "7g": _Shape(4, 0, 7, 8, 1, (0,)),  # 7_SLICE
}

# Reference 1.3 (A30: 4 compute / 4 memory slices). Fractions/counts: MIG-SP;
# IDs, placements: OUT.
_SHAPES_4 = {
    "1g": _Shape(0, 14, 1, 1, 4, (0, 1, 2, 3)),  # 1_SLICE
    "1g+me": _Shape(7, 21, 1, 1, 1, (0, 1, 2, 3)),  # 1_SLICE_REV1
    "2g": _Shape(1, 5, 2, 2, 2, (0, 2)),  # 2_SLICE
    "2g+me": _Shape(8, 6, 2, 2, 1, (0, 2)),  # 2_SLICE_REV1
    "4g": _Shape(3, 0, 4, 4, 1, (0,)),  # 4_SLICE
}

# Compute-instance profiles inside a GI of g compute slices (reference 2,
# MIG-CON / MIG-GS): sizes c allowed, and NVML_COMPUTE_INSTANCE_PROFILE_<c>_SLICE
# (NVML-H). 5c/6c on 7g are unconfirmed (reference 7.7), so left out. A30 uses
# the same rules by slice count (inferred: the sheet states them for A100).
_CI_SIZES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 3, 4), 7: (1, 2, 3, 4, 7)}
_CI_CONSTANT = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

_R510 = "4g + 3g on one GPU needs driver R510 or newer (MIG-CON); older drivers refuse it"
_IDS_8 = "ID inferred from the shared 8-slice layout (reference 1.1, 7.1), not observed on H200"

# MIG-GS, reference 1.2: A100-SXM4-40GB `-lgip` (GiB as printed / SMs).
_A100_40 = (
    _Row("1g", "1g.5gb", 4.75, 14),
    _Row("1g+me", "1g.5gb+me", 4.75, 14),
    _Row("1g.dbl", "1g.10gb", 9.62, 14),
    _Row("2g", "2g.10gb", 9.62, 28),
    _Row("3g", "3g.20gb", 19.50, 42),
    _Row("4g", "4g.20gb", 19.50, 56, note=_R510),
    _Row("7g", "7g.40gb", 39.25, 98),
)

# OUT, reference 1.2: A100 80GB `-lgip`.
_A100_80 = (
    _Row("1g", "1g.10gb", 9.50, 14),
    _Row("1g+me", "1g.10gb+me", 9.50, 14),
    _Row("1g.dbl", "1g.20gb", 19.50, 14),
    _Row("2g", "2g.20gb", 19.50, 28),
    _Row("3g", "3g.40gb", 39.25, 42),
    _Row("4g", "4g.40gb", 39.25, 56, note=_R510),
    _Row("7g", "7g.80gb", 79.00, 98),
)

# OUT (jbarrow.ai field notes), reference 1.2: H100-SXM5-80GB `-lgip`.
# 1g 9984 MiB and 3g 40448 MiB were also seen as MIG-device totals (MIG-GS, OUT).
_H100_80 = (
    _Row("1g", "1g.10gb", 9.75, 16),
    _Row("1g+me", "1g.10gb+me", 9.75, 16),
    _Row("1g.dbl", "1g.20gb", 19.62, 26),
    _Row("2g", "2g.20gb", 19.62, 32),
    _Row("3g", "3g.40gb", 39.50, 60),
    _Row("4g", "4g.40gb", 39.50, 64),
    _Row("7g", "7g.80gb", 79.25, 132),
)

# OUT (driver 570.169), reference 1.2: H100 PCIe 80GB `-lgip`: the H100-SXM5 profiles
# and memory, fewer SMs (114 on the whole GPU).
_H100_PCIE = (
    _Row("1g", "1g.10gb", 9.75, 14),
    _Row("1g+me", "1g.10gb+me", 9.75, 14),
    _Row("1g.dbl", "1g.20gb", 19.62, 14),
    _Row("2g", "2g.20gb", 19.62, 30),
    _Row("3g", "3g.40gb", 39.50, 46),
    _Row("4g", "4g.40gb", 39.50, 62),
    _Row("7g", "7g.80gb", 79.25, 114),
)

# OUT, reference 1.2: H100 NVL `-lgip`. Exact MIG-device totals (OUT) 22144 MiB
# (1g.24gb) and 47488 MiB (3g.47gb) show the printed 21.62 / 46.38 are 21.625 /
# 46.375 GiB, so those figures are used, and for 2g.24gb / 4g.47gb, which print
# the same GiB (inferred to be the same size).
_NVL_1G24 = "22144 MiB seen as a MIG-device total (OUT); GiB x 1024 would give 22139"
_NVL_2G24 = "22144 MiB inferred: prints the same 21.62 GiB as 1g.24gb, whose exact total is 22144 (OUT)"
_NVL_3G47 = "47488 MiB seen as a MIG-device total (OUT); GiB x 1024 would give 47493"
_NVL_4G47 = "47488 MiB inferred: prints the same 46.38 GiB as 3g.47gb, whose exact total is 47488 (OUT)"
_H100_NVL = (
    _Row("1g", "1g.12gb", 10.75, 16),
    _Row("1g+me", "1g.12gb+me", 10.75, 16),
    _Row("1g.dbl", "1g.24gb", 21.62, 26, note=_NVL_1G24, mib=22144),
    _Row("2g", "2g.24gb", 21.62, 32, note=_NVL_2G24, mib=22144),
    _Row("3g", "3g.47gb", 46.38, 60, note=_NVL_3G47, mib=47488),
    _Row("4g", "4g.47gb", 46.38, 64, note=_NVL_4G47, mib=47488),
    _Row("7g", "7g.94gb", 93.12, 132),
)

# MIG-SP names; partial OUT values, reference 1.2. 1g.35gb, 3g.71gb, 4g.71gb
# are under "Could not confirm" (7.1): ID, memory and SMs inferred as noted.
# On every other 8-slice GPU in 1.2 the 1g double-memory profile has the 2g's
# memory and the 4g the 3g's; the 3g is just under half the 7g (39.50 / 79.25
# on H100-SXM5, the same GH100 chip), so that ratio estimates H200's 3g.
_H200_3G_GIB = 140.00 * 39.50 / 79.25
_H200_1G35 = f"{_IDS_8}; memory assumed equal to 2g.35gb (as on all other 8-slice GPUs); SMs unknown (26 on H100)"
_H200_3G71 = (
    f"{_IDS_8}; memory estimated as 7g.141gb x 39.50/79.25 (the H100-SXM5 3g/7g ratio), "
    "not observed; SMs unknown (60 on H100)"
)
_H200_4G71 = f"{_IDS_8}; memory assumed equal to 3g.71gb (estimated, see there); SMs unknown (64 on H100)"
_H200 = (
    _Row("1g", "1g.18gb", 16.00, 16),
    _Row("1g+me", "1g.18gb+me", 16.00, 16),
    _Row("1g.dbl", "1g.35gb", 32.50, None, confirmed=False, note=_H200_1G35),
    _Row("2g", "2g.35gb", 32.50, 32),
    _Row("3g", "3g.71gb", _H200_3G_GIB, None, confirmed=False, note=_H200_3G71),
    _Row("4g", "4g.71gb", _H200_3G_GIB, None, confirmed=False, note=_H200_4G71),
    _Row("7g", "7g.141gb", 140.00, 132),
)

# MIG-SP (fractions, counts, driver notes), OUT (IDs, placements, GiB/SM),
# reference 1.3: A30-24GB.
_A30 = (
    _Row("1g", "1g.6gb", 5.81, 14),
    _Row("1g+me", "1g.6gb+me", 5.81, 14, note="needs driver R470 or newer (MIG-SP)"),
    _Row("2g", "2g.12gb", 11.69, 28),
    _Row("2g+me", "2g.12gb+me", 11.69, 28, note="needs driver R525 or newer (MIG-SP)"),
    _Row("4g", "4g.24gb", 23.44, 56, note="23.44 and 23.50 GiB both seen (OUT); the smaller is used"),
)


def _gib_to_mib(gib: float) -> int:
    """GiB as `nvidia-smi mig -lgip` prints it, in MiB (inferred, see module docstring)."""
    return round(gib * 1024)


def _compute_profiles(gi_name: str, compute_slices: int) -> tuple[tuple[str, int], ...]:
    """CI profiles allowed in a GI: '<c>c.<gi>' names, the c omitted when it is the whole GI (MIG-CON)."""
    return tuple(
        (gi_name if c == compute_slices else f"{c}c.{gi_name}", _CI_CONSTANT[c]) for c in _CI_SIZES[compute_slices]
    )


def _profile(shape: _Shape, row: _Row) -> MigProfile:
    return MigProfile(
        name=row.name,
        nvml_constant=shape.nvml_constant,
        profile_id=shape.profile_id,
        compute_slices=shape.compute_slices,
        memory_slices=shape.memory_slices,
        memory_mib=row.mib if row.mib is not None else _gib_to_mib(row.gib),
        max_instances=shape.max_instances,
        placements=shape.placements,
        multiprocessors=row.multiprocessors,
        confirmed=row.confirmed,
        note=row.note,
        compute_profiles=_compute_profiles(row.name, shape.compute_slices),
    )


def _profiles(shapes: dict[str, _Shape], rows: tuple[_Row, ...]) -> tuple[MigProfile, ...]:
    return tuple(_profile(shapes[row.shape], row) for row in rows)


# PCI device IDs: MPARTED groupings (reference 1.4), which are per MIG geometry,
# not per SKU: a group may include PCIe, A800/H800 or NVL variants. mig-parted
# puts A100-80GB and H100-80GB in one group; it is split here by chip family
# (0x20xx GA100, 0x23xx GH100: inferred from the IDs, matching go-nvml's labels
# 0x20B210DE A100-SXM4-80GB / 0x20B510DE A100-PCIE-80GB).
_MODELS = (
    GpuModel(
        name="A100-SXM4-40GB",
        nvml_names=("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),  # OUT-PROBE; MIG-GS (R450, no prefix)
        slurm_type="a100_40g",
        memory_mib=40960,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=108,
        pci_device_ids=(0x20B010DE, 0x20B110DE, 0x20F110DE, 0x20F610DE),
        mig_profiles=_profiles(_SHAPES_8, _A100_40),
        source="MIG-SP, MIG-GS (profiles); MPARTED (PCI IDs); OUT-PROBE (memory); SPEC (SMs)",
        note="40960 MiB with driver 580 (OUT-PROBE); 40537 MiB seen with R450 (MIG-GS). "
        "108 SMs whole GPU (SPEC); 7g.40gb has 98 (MIG-GS)",
        mig_mode_reset=True,
    ),
    GpuModel(
        name="A100-PCIE-40GB",
        nvml_names=("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"),  # OUT (nvidia-smi --query-gpu=name transcripts)
        slurm_type="a100_pcie_40g",
        memory_mib=40960,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=108,
        pci_device_ids=(),
        mig_profiles=_profiles(_SHAPES_8, _A100_40),
        source="MIG-SP (profiles: the A100 40GB ones); MIG-GS (values, as A100-SXM4-40GB); OUT (name, memory); "
        "SPEC (SMs)",
        note="same GA100 chip and MIG profiles as A100-SXM4-40GB (MIG-SP lists A100 40GB without form factor); "
        "its PCI ID 0x20F110DE stays in A100-SXM4-40GB's MPARTED group; 40960 MiB with recent drivers, "
        "40536 MiB seen with R470 (OUT)",
        mig_mode_reset=True,
    ),
    GpuModel(
        name="A100-PCIE-80GB",
        nvml_names=("NVIDIA A100 80GB PCIe",),  # OUT (nvidia-smi --query-gpu=name,memory.total transcripts)
        slurm_type="a100_pcie_80g",
        memory_mib=81920,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=108,
        pci_device_ids=(),
        mig_profiles=_profiles(_SHAPES_8, _A100_80),
        source="MIG-SP (profiles: the A100 80GB ones); OUT (values, as A100-SXM4-80GB; name, memory); SPEC (SMs)",
        note="same GA100 chip and MIG profiles as A100-SXM4-80GB; its PCI ID 0x20B510DE stays in "
        "A100-SXM4-80GB's group (MPARTED, go-nvml's label A100-PCIE-80GB)",
        mig_mode_reset=True,
    ),
    GpuModel(
        name="A100-SXM4-80GB",
        nvml_names=("NVIDIA A100-SXM4-80GB",),  # OUT-PROBE
        slurm_type="a100_80g",
        memory_mib=81920,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=108,
        pci_device_ids=(0x20B210DE, 0x20B510DE, 0x20F310DE, 0x20F510DE),
        mig_profiles=_profiles(_SHAPES_8, _A100_80),
        source="MIG-SP, OUT (profiles); MPARTED (PCI IDs, split by chip family); OUT-PROBE (memory); SPEC (SMs)",
        note="108 SMs whole GPU (SPEC); 7g.80gb has 98 (OUT)",
        mig_mode_reset=True,
    ),
    GpuModel(
        name="A30-24GB",
        nvml_names=("NVIDIA A30",),  # OUT
        slurm_type="a30",
        memory_mib=24576,
        compute_slices=4,
        memory_slices=4,
        multiprocessors=56,
        pci_device_ids=(0x20B710DE,),
        mig_profiles=_profiles(_SHAPES_4, _A30),
        source="MIG-SP, OUT (profiles, memory); MPARTED (PCI IDs); SPEC (SMs)",
        note="CI profiles follow the A100 rules by slice count (inferred)",
        mig_mode_reset=True,
    ),
    GpuModel(
        name="H100-SXM5-80GB",
        nvml_names=("NVIDIA H100 80GB HBM3",),  # MIG-GS, OUT-PROBE
        slurm_type="h100",
        memory_mib=81559,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=132,
        pci_device_ids=(0x233010DE, 0x233110DE, 0x232210DE, 0x232410DE),
        mig_profiles=_profiles(_SHAPES_8, _H100_80),
        source="MIG-SP, OUT (profiles); MIG-GS (memory); MPARTED (PCI IDs, split by chip family); SPEC (SMs)",
        note="the PCI group may include H100 PCIe / H800 IDs, whose SM counts differ (reference 1.2)",
    ),
    GpuModel(
        name="H100-PCIE-80GB",
        nvml_names=("NVIDIA H100 PCIe",),  # reference 1.2, OUT
        slurm_type="h100_pcie",
        memory_mib=81559,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=114,
        pci_device_ids=(),
        mig_profiles=_profiles(_SHAPES_8, _H100_PCIE),
        source="MIG-SP, OUT (profiles, driver 570.169); OUT (name, memory 81559 MiB, 114 SMs)",
        note="the H100-SXM5-80GB profiles with fewer SMs; its PCI ID stays in H100-SXM5-80GB's MPARTED group",
    ),
    GpuModel(
        name="H100-NVL-94GB",
        nvml_names=("NVIDIA H100 NVL",),  # OUT
        slurm_type="h100_nvl",
        memory_mib=95830,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=132,
        pci_device_ids=(0x232110DE, 0x233A10DE),
        mig_profiles=_profiles(_SHAPES_8, _H100_NVL),
        source="MIG-SP, OUT (profiles, placements, memory); MPARTED (PCI IDs); SPEC (SMs)",
    ),
    GpuModel(
        name="H200-141GB",
        nvml_names=("NVIDIA H200",),  # OUT ("NVIDIA H200 MIG 1g.18gb"), OUT-PROBE
        slurm_type="h200",
        memory_mib=143771,
        compute_slices=7,
        memory_slices=8,
        multiprocessors=132,
        pci_device_ids=(0x233510DE, 0x233B10DE),
        mig_profiles=_profiles(_SHAPES_8, _H200),
        source="MIG-SP, partial OUT (profiles); MPARTED (PCI IDs); OUT-PROBE (memory); SPEC (SMs)",
        note="143771 MiB is not in the reference sheet (OUT-PROBE, driver 580); "
        "placements assumed from the shared 8-slice layout (MIG-SP); the PCI group includes H200 NVL",
    ),
    GpuModel(
        name="L40S",
        nvml_names=("NVIDIA L40S",),  # OUT-PROBE
        slurm_type="l40s",
        memory_mib=46068,
        compute_slices=0,
        memory_slices=0,
        multiprocessors=142,
        pci_device_ids=(),
        mig_profiles=(),
        source="OUT-PROBE (memory); SPEC (SMs)",
        note="no MIG; 48 GB nominal, 46068 MiB reported by nvidia-smi (OUT-PROBE); PCI ID not in the reference",
    ),
)

CATALOGUE: dict[str, GpuModel] = {m.name: m for m in sorted(_MODELS, key=lambda m: m.name)}
