"""Catalogue value types: a GPU model and its MIG GPU-instance profiles.

Frozen dataclasses, so the catalogue can be shared by every module (and a
model can key a cache) without anyone changing it under another's feet.
Each model checks its own profile data when built, so a typo in the tables
fails at import instead of producing a layout the driver would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..records import field, record

# NVML_GPU_INSTANCE_PROFILE_* / NVML_COMPUTE_INSTANCE_PROFILE_* values for the
# plain 1-, 2- and 3-slice profiles (NVML-H / PYNVML, reference sections 1.1, 2).
GI_1_SLICE, GI_2_SLICE, GI_3_SLICE = 0, 1, 2

# "all-balanced" as in NVIDIA mig-parted's default configs: one 3g (where the
# GPU has one), one 2g, two 1g; listed largest first, the safe creation order.
_BALANCED = ((GI_3_SLICE, 1), (GI_2_SLICE, 1), (GI_1_SLICE, 2))


class CatalogueError(ValueError):
    """An unknown GPU model, NVML name or MIG profile, or inconsistent catalogue data.

    A ValueError, so code validating user input catches one familiar type;
    the message always lists what would have been accepted.
    """


def known(kind: str, names: Iterable[object]) -> str:
    """Format 'known <kind>: a, b, c' for error messages."""
    listed = ", ".join(str(n) for n in names)
    return f"known {kind}: {listed}" if listed else f"known {kind}: (none)"


@record
class MigProfile:
    """One MIG GPU-instance profile as `nvidia-smi mig -lgip` / NVML report it.

    ``nvml_constant`` is the NVML_GPU_INSTANCE_PROFILE_* value passed to
    nvmlDeviceGetGpuInstanceProfileInfo; ``profile_id`` is the ID it returns
    (the `-lgip` ID, used to create instances). They differ: 7g is constant 4, ID 0.
    ``placements`` are valid memory-slice starts; an instance occupies
    ``memory_slices`` slices from its start. ``compute_profiles`` are the
    compute-instance profiles allowed inside it: (CI name, NVML_COMPUTE_INSTANCE_PROFILE_*).
    """

    name: str
    nvml_constant: int
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    placements: tuple[int, ...]
    multiprocessors: int | None = None
    confirmed: bool = True
    note: str = ""
    compute_profiles: tuple[tuple[str, int], ...] = ()

    @property
    def slurm_suffix(self) -> str:
        """The name as a Slurm GRES type fragment: '+' is not safe there ('1g.10gb_me')."""
        return self.name.replace("+", "_")

    @property
    def full_compute_constant(self) -> int:
        """NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance that spans the whole GPU instance (same name)."""
        return dict(self.compute_profiles)[self.name]

    @property
    def media_extensions(self) -> bool:
        """True for '+me' profiles, which take the GPU's only media engines (max 1)."""
        return self.name.endswith("+me")

    def fraction(self, model: GpuModel) -> float:
        """Share of the GPU this instance denies to others: its larger slice share.

        Used for billing: a 3g.20gb holds 3/7 of the compute but half the memory,
        and nothing else can use that memory, so it is billed as 0.5.
        """
        if not model.compute_slices or not model.memory_slices:
            raise CatalogueError(f"{model.name} has no MIG slices, so {self.name} has no fraction of it")
        return max(
            self.compute_slices / model.compute_slices,
            self.memory_slices / model.memory_slices,
        )


@record
class GpuModel:
    """A GPU model: identity (NVML names, PCI IDs), size, Slurm type and MIG profiles.

    ``compute_slices`` / ``memory_slices`` are 0 on GPUs without MIG.
    ``source`` names the reference-sheet keys the values come from; ``note``
    says which whole-GPU values are inferred or come from elsewhere.
    ``mig_mode_reset``: changing MIG mode takes a GPU reset, and the mode is kept across reboots (Ampere:
    A100, A30); otherwise (Hopper and later) it changes without a reset while the GPU is idle, and is lost
    when the driver unloads (MIG-GS, MIG-DC).
    """

    name: str
    nvml_names: tuple[str, ...]
    slurm_type: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    multiprocessors: int | None
    pci_device_ids: tuple[int, ...]
    mig_profiles: tuple[MigProfile, ...]
    source: str
    note: str = ""
    mig_mode_reset: bool = False
    _by_name: dict[str, MigProfile] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        problems = _profile_problems(self)
        if problems:
            raise CatalogueError(f"catalogue data for {self.name} is inconsistent: " + "; ".join(problems))
        object.__setattr__(self, "_by_name", _name_index(self.mig_profiles))

    @property
    def mig_capable(self) -> bool:
        """Whether the GPU can be partitioned with MIG at all."""
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile:
        """The MIG profile called ``name`` (case-insensitive; '1g.10gb_me' also means '1g.10gb+me')."""
        found = self._by_name.get(name.strip().lower()) if isinstance(name, str) else None
        if found is None:
            raise CatalogueError(
                f"unknown MIG profile {name!r} for {self.name}; "
                + known("profiles", (p.name for p in self.mig_profiles))
            )
        return found

    def profile_for_constant(self, nvml_constant: int) -> MigProfile:
        """The profile NVML describes for an NVML_GPU_INSTANCE_PROFILE_* constant."""
        return self._profile_where("NVML constant", nvml_constant, lambda p: p.nvml_constant)

    def profile_for_id(self, profile_id: int) -> MigProfile:
        """The profile with this `-lgip` ID (what instance creation takes)."""
        return self._profile_where("profile ID", profile_id, lambda p: p.profile_id)

    def mig_slurm_type(self, profile_name: str) -> str:
        """Slurm GRES type for one MIG instance, e.g. 'a100_40g_1g.5gb'."""
        return f"{self.slurm_type}_{self.profile(profile_name).slurm_suffix}"

    def named_layouts(self) -> dict[str, tuple[str, ...]]:
        """mig-parted style layouts: 'all-<profile>' filled to max_instances, and 'all-balanced'.

        '+me' profiles get no 'all-' layout: only one fits per GPU.
        """
        layouts = {f"all-{p.name}": (p.name,) * p.max_instances for p in self.mig_profiles if not p.media_extensions}
        balanced = self._balanced()
        if balanced:
            layouts["all-balanced"] = balanced
        return layouts

    def _balanced(self) -> tuple[str, ...]:
        by_constant = {p.nvml_constant: p.name for p in self.mig_profiles}
        names: list[str] = []
        for constant, count in _BALANCED:
            if constant in by_constant:
                names += [by_constant[constant]] * count
        return tuple(names)

    def _profile_where(self, what: str, value: int, key) -> MigProfile:
        for p in self.mig_profiles:
            if key(p) == value:
                return p
        listed = (f"{key(p)} ({p.name})" for p in self.mig_profiles)
        raise CatalogueError(f"unknown MIG {what} {value!r} for {self.name}; " + known(f"{what}s", listed))


def _name_index(profiles: tuple[MigProfile, ...]) -> dict[str, MigProfile]:
    """Lower-case name and Slurm-suffix spellings, so policies can use either."""
    index: dict[str, MigProfile] = {}
    for p in profiles:
        index[p.name.lower()] = p
        index[p.slurm_suffix.lower()] = p
    return index


def _profile_problems(model: GpuModel) -> list[str]:
    """Why ``model``'s profile data could not describe real hardware ([] if it could)."""
    problems = [
        f"duplicate {what} {dup}"
        for what, values in (
            ("profile name", [p.name.lower() for p in model.mig_profiles]),
            ("NVML constant", [str(p.nvml_constant) for p in model.mig_profiles]),
            ("profile ID", [str(p.profile_id) for p in model.mig_profiles]),
        )
        for dup in sorted({v for v in values if values.count(v) > 1}, key=str)
    ]
    for p in model.mig_profiles:
        problems += _one_profile_problems(model, p)
    return problems


def _one_profile_problems(model: GpuModel, p: MigProfile) -> list[str]:
    problems = []
    if not 1 <= p.compute_slices <= model.compute_slices:
        problems.append(f"{p.name}: {p.compute_slices} compute slices, GPU has {model.compute_slices}")
    if not 1 <= p.memory_slices <= model.memory_slices:
        problems.append(f"{p.name}: {p.memory_slices} memory slices, GPU has {model.memory_slices}")
    if p.max_instances < 1:
        problems.append(f"{p.name}: max_instances {p.max_instances} < 1")
    if not p.placements or list(p.placements) != sorted(set(p.placements)):
        problems.append(f"{p.name}: placements {p.placements} must be distinct, ascending, non-empty")
    bad = [s for s in p.placements if s < 0 or s + p.memory_slices > model.memory_slices]
    if bad:
        problems.append(f"{p.name}: placement starts {bad} run past memory slice {model.memory_slices - 1}")
    if not p.confirmed and not p.note:
        problems.append(f"{p.name}: unconfirmed values need a note saying what is inferred")
    return problems
