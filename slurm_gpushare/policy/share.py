"""A GPU's share: how one GPU is given out (whole, as MIG slices, through MPS, as shards), in one type.

The one noun every room handles: the policy resolves each GPU's ``sharing``
entry to a ``Share``, the node spec carries it to the hooks, the live planner
proposes new ones, and every room asks it for what it needs (its GRES, its
shared GRES and count, its text, its policy entry) instead of switching on a
mode string. Lean on purpose: the root node hooks import it, so it needs
nothing but ``enum`` (loaded by ``re``/``json`` already) and ``records``; the
hardware catalogue comes in as arguments (the model's Slurm type, its MIG
profile -> Slurm type mapping), never as an import.
"""

from __future__ import annotations

from enum import StrEnum

from ..records import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


class Mode(StrEnum):
    """A GPU's sharing mode; its value is the policy's (and JSON's) text."""

    EXCLUSIVE = "exclusive"
    MIG = "mig"
    SHARD = "shard"
    MPS = "mps"


MODES = tuple(m.value for m in Mode)  # the policy's order, for messages
SHARED_GRES = (Mode.MPS.value, Mode.SHARD.value)  # the shared GRES names, in slurm.conf's GresTypes order

# The keys of a policy ``sharing`` entry besides ``gpus`` and ``mode``, and the modes that use each.
KEYS: dict[Mode, tuple[str, ...]] = {
    Mode.MIG: ("layout",),
    Mode.SHARD: ("replicas", "type"),
    Mode.MPS: ("units", "type", "compute_mode", "client_mem_limit_mib"),
    Mode.EXCLUSIVE: ("type",),
}
SHARING_KEYS = ("layout", "replicas", "units", "type", "compute_mode", "client_mem_limit_mib")


def parse_mode(value: object) -> Mode:
    """A mode as a policy writes it (any case); ValueError names the modes allowed."""
    try:
        return Mode(str(value).strip().lower())
    except ValueError:
        raise ValueError(f"{value!r} is not a sharing mode; allowed: {', '.join(MODES)}") from None


def misplaced_keys(mode: Mode, entry: Mapping) -> list[tuple[str, str]]:
    """(key, why) for each key ``entry`` sets (not None) that ``mode`` does not use."""
    out = []
    for key in SHARING_KEYS:
        if entry.get(key) is not None and key not in KEYS[mode]:
            owners = [m.value for m, keys in KEYS.items() if key in keys]
            out.append((key, f"not used by mode {mode}; it applies to mode {' / '.join(owners)}"))
    return out


@record
class Share:
    """One GPU's share as the policy declares it (a ``sharing`` entry without ``gpus``), resolved."""

    mode: Mode = Mode.EXCLUSIVE
    layout: tuple[str, ...] = ()  # mig: the MIG profiles
    replicas: int = 0  # shard: shards per GPU
    units: int = 0  # mps: MPS units per GPU
    type: str = ""  # exclusive/shard/mps: the whole GPU's Slurm type where the policy names one ('': the model's)
    compute_mode: str = ""  # mps: "default" or "exclusive_process" (nvidia-smi -c), as the site sets the GPU
    client_mem_limit_mib: int = 0  # mps: the most device memory one client may pin on the GPU (0: its share)

    @property
    def is_mig(self) -> bool:
        """Partitioned into MIG instances: Slurm sees one typed gpu GRES per instance, never the GPU."""
        return self.mode is Mode.MIG

    @property
    def shared_gres(self) -> str:
        """The shared GRES the GPU offers ('mps', 'shard'), or '' (exclusive, MIG)."""
        return self.mode.value if self.mode in (Mode.MPS, Mode.SHARD) else ""

    @property
    def shared_count(self) -> int:
        """Its shared GRES per GPU: MPS units or shards; 0 for none."""
        return self.units if self.mode is Mode.MPS else self.replicas if self.mode is Mode.SHARD else 0

    @property
    def exclusive_process(self) -> bool:
        """An MPS GPU in EXCLUSIVE_PROCESS: one MPS server, so one user, at a time."""
        return self.mode is Mode.MPS and self.compute_mode == "exclusive_process"

    def gpu_type(self, model_type: str) -> str:
        """The Slurm type of the whole GPU: the policy's ``type``, else the model's."""
        return self.type or model_type

    def gres(self, model_type: str, mig_type: Callable[[str], str]) -> tuple[tuple[str, str, int], ...]:
        """The GRES one such GPU gives a node: (name, type, count), type '' for the untyped shared GRES.
        ``mig_type``: the model's MIG profile -> Slurm type mapping (hardware.GpuModel.mig_slurm_type)."""
        if self.is_mig:
            return tuple(("gpu", mig_type(p), 1) for p in self.layout)
        out = (("gpu", self.gpu_type(model_type), 1),)
        return out + ((self.shared_gres, "", self.shared_count),) if self.shared_gres else out

    @property
    def text(self) -> str:
        """In a report: 'exclusive', 'mps (100 units)', 'shard (4 replicas)', 'mig (1g.5gb+1g.5gb)'."""
        if self.mode is Mode.MPS:
            return f"mps ({self.units} units)"
        if self.mode is Mode.SHARD:
            return f"shard ({self.replicas} replicas)"
        if self.mode is Mode.MIG:
            return f"mig ({'+'.join(self.layout)})"
        return self.mode.value

    def to_entry(self) -> dict:
        """A policy ``sharing`` entry without ``gpus``: the mode, then the keys it uses that differ from the
        defaults (``policy.document.with_modes`` takes these)."""
        entry: dict = {"mode": self.mode.value}
        if self.is_mig:
            entry["layout"] = list(self.layout)
        if self.mode is Mode.MPS:
            entry["units"] = self.units
            if self.compute_mode and self.compute_mode != "default":
                entry["compute_mode"] = self.compute_mode
            if self.client_mem_limit_mib:
                entry["client_mem_limit_mib"] = self.client_mem_limit_mib
        elif self.mode is Mode.SHARD:
            entry["replicas"] = self.replicas
        if self.type:
            entry["type"] = self.type
        return entry

    @classmethod
    def from_entry(cls, entry: Mapping) -> Share:
        """A policy ``sharing`` entry (``gpus`` ignored) as a share, unchecked: ``policy.groups`` checks the
        values; ValueError for a mode that is none."""
        mode = parse_mode(entry.get("mode", Mode.EXCLUSIVE))
        layout = entry.get("layout") or ()
        return cls(
            mode,
            (layout,) if isinstance(layout, str) else tuple(layout),
            int(entry.get("replicas") or 0),
            int(entry.get("units") or 0),
            str(entry.get("type") or ""),
            str(entry.get("compute_mode") or "default") if mode is Mode.MPS else "",
            int(entry.get("client_mem_limit_mib") or 0),
        )

    def to_json(self) -> dict:
        """Every field, for the node spec cache (``from_json`` reads it back)."""
        return {**vars(self), "mode": self.mode.value, "layout": list(self.layout)}

    @classmethod
    def from_json(cls, data: Mapping) -> Share:
        """``to_json``'s shape; TypeError, KeyError or ValueError for anything else."""
        return cls(**{**data, "mode": Mode(data["mode"]), "layout": tuple(data["layout"])})
