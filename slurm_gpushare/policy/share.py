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
    Mode.MIG: ("layout", "per_job", "profiles", "carrier_weights", "on_slice_failure", "isolation"),
    Mode.SHARD: ("replicas", "type"),
    Mode.MPS: ("units", "type", "compute_mode", "client_mem_limit_mib"),
    Mode.EXCLUSIVE: ("type",),
}
SHARING_KEYS = (
    "layout",
    "per_job",
    "profiles",
    "carrier_weights",
    "on_slice_failure",
    "isolation",
    "replicas",
    "units",
    "type",
    "compute_mode",
    "client_mem_limit_mib",
)
# The shared GRES that carries per-job MIG slices: a slice of profile p is ``shard:<weight of p>`` on one GPU.
CARRIER = Mode.SHARD.value
# A per-job MIG job's record of its profile, ``gpushare-mig=<profile>``: the submission filter sets it in the job's
# extra field (submit.tables.RECORD_FIELD), the prolog reads it from SLURM_JOB_EXTRA (node.jobenv).
RECORD_PREFIX = "gpushare-mig="
# What becomes of a batch job whose per-job MIG instance the prolog could not make (``Share.on_slice_failure``):
# the health check requeues it (at most MAX_SLICE_REQUEUES times, by Slurm's restart count), or it fails.
REQUEUE, FAIL = "requeue", "fail"
ON_SLICE_FAILURE = (REQUEUE, FAIL)
MAX_SLICE_REQUEUES = 3
# How a per-job MIG job is kept from its neighbours' instances on the same GPU (``Share.isolation``): NAMESPACE, a
# private read-only /dev/nvidia-caps in the job's mount namespace holding only its own instances' capabilities
# (gpushare-ns-caps, run by Slurm's job_container/tmpfs CloneNSScript: node.nscaps), or NO_ISOLATION (device
# cgroups only: a job can open a neighbour's capability files, docs/admins/per-job-mig.md#isolation).
NAMESPACE, NO_ISOLATION = "namespace", "none"
ISOLATIONS = (NAMESPACE, NO_ISOLATION)
# slurm.conf PrologEpilogTimeout and BatchStartTimeout (s) where any GPU is per-job MIG (render.context.hooks). A
# per-job prolog's NVML calls take ~30 s (its epilog's ~21 s) at the latencies NVIDIA's driver code notes (a MIG
# device walk O(10 s), a GPU's handle by UUID O(10 s), a GI destroy O(1 s): tests/unit/hooks/test_perjob.py counts
# them), up to node.perjob.WHOLE_WAIT_S more for a whole-GPU job, and the prologs of one GPU's jobs (up to 7
# slices) wait for each other's GPU lock: 7 x 30 + 20 s. Slurm's default waits for ever (a hung prolog never
# ends), and 10 s of BatchStartTimeout would count such a batch job missing.
PER_JOB_PROLOG_TIMEOUT_S = 300


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
    """One GPU's share as the policy declares it (a ``sharing`` entry without ``gpus``), resolved.

    A MIG GPU has a fixed ``layout``, or is ``per_job``: an instance of one of
    ``profiles`` is made for each job, and Slurm counts them with the carrier
    GRES (shards, ``capacity`` per GPU, profile i weighing ``weights[i]``:
    hardware.migweights, exact, so the count admits exactly what fits; or the
    policy's ``carrier_weights``, ``tuned``, which admit only sets that fit).
    """

    mode: Mode = Mode.EXCLUSIVE
    layout: tuple[str, ...] = ()  # mig: the MIG profiles
    replicas: int = 0  # shard: shards per GPU
    units: int = 0  # mps: MPS units per GPU
    type: str = ""  # exclusive/shard/mps: the whole GPU's Slurm type where the policy names one ('': the model's)
    compute_mode: str = ""  # mps: "default" or "exclusive_process" (nvidia-smi -c), as the site sets the GPU
    client_mem_limit_mib: int = 0  # mps: the most device memory one client may pin on the GPU (0: its share)
    per_job: bool = False  # mig: an instance made for each job instead of a fixed layout
    profiles: tuple[str, ...] = ()  # per-job mig: the profiles it allows (catalogue names)
    weights: tuple[int, ...] = ()  # per-job mig: each profile's carrier weight, in ``profiles`` order
    capacity: int = 0  # per-job mig: carrier units per GPU (shard Count)
    tuned: bool = False  # per-job mig: ``weights`` are the policy's carrier_weights, not the exact ones
    on_slice_failure: str = ""  # per-job mig: REQUEUE or FAIL, a batch job whose instance could not be made
    isolation: str = ""  # per-job mig: NAMESPACE or NO_ISOLATION (resolved: policy.perjob)

    @property
    def is_mig(self) -> bool:
        """A fixed MIG layout: Slurm sees one typed gpu GRES per instance, never the GPU."""
        return self.mode is Mode.MIG and not self.per_job

    @property
    def is_per_job_mig(self) -> bool:
        """Per-job MIG: Slurm sees the whole GPU (gpu) and its carrier shards; the instances come and go with jobs."""
        return self.mode is Mode.MIG and self.per_job

    @property
    def isolated(self) -> bool:
        """Per-job MIG whose jobs each see only their own instances' capability files (a private /dev/nvidia-caps)."""
        return self.is_per_job_mig and self.isolation == NAMESPACE

    @property
    def is_whole_gpu(self) -> bool:
        """What an untyped GPU request may take: a GPU given out whole (exclusive), or a per-job MIG GPU, which a
        whole-GPU request takes when it is empty; never a fixed MIG layout's slice, nor an MPS or shard GPU."""
        return self.mode is Mode.EXCLUSIVE or self.is_per_job_mig

    def weight(self, profile: str) -> int:
        """The carrier units a per-job slice of ``profile`` (a catalogue name) takes; KeyError if not allowed."""
        if profile not in self.profiles:
            raise KeyError(f"{profile} is not one of this GPU's per-job profiles ({', '.join(self.profiles)})")
        return self.weights[self.profiles.index(profile)]

    @property
    def shared_gres(self) -> str:
        """The shared GRES the GPU offers ('mps', 'shard'; per-job MIG: its carrier), or '' (exclusive, fixed MIG)."""
        if self.is_per_job_mig:
            return CARRIER
        return self.mode.value if self.mode in (Mode.MPS, Mode.SHARD) else ""

    @property
    def shared_count(self) -> int:
        """Its shared GRES per GPU: MPS units, shards, per-job MIG carrier units; 0 for none."""
        if self.is_per_job_mig:
            return self.capacity
        return self.units if self.mode is Mode.MPS else self.replicas if self.mode is Mode.SHARD else 0

    @property
    def wanted_compute_mode(self) -> str:
        """The compute mode an MPS GPU must be in, by nvidia-smi's name (DEFAULT unless the policy's
        ``compute_mode`` says EXCLUSIVE_PROCESS); '' for other shares, whose compute mode the policy leaves alone."""
        return (self.compute_mode or "default").upper() if self.mode is Mode.MPS else ""

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
        if self.is_per_job_mig:
            weights = ", ".join(f"{p}={w}" for p, w in zip(self.profiles, self.weights, strict=True))
            return f"mig per job ({weights} of {self.capacity})"
        if self.mode is Mode.MIG:
            return f"mig ({'+'.join(self.layout)})"
        return self.mode.value

    def to_entry(self) -> dict:
        """A policy ``sharing`` entry without ``gpus``: the mode, then the keys it uses that differ from the
        defaults (``policy.document.with_modes`` takes these)."""
        entry: dict = {"mode": self.mode.value}
        if self.is_mig:
            entry["layout"] = list(self.layout)
        if self.is_per_job_mig:
            entry.update(per_job=True, profiles=list(self.profiles))
            if self.tuned:
                entry["carrier_weights"] = dict(zip(self.profiles, self.weights, strict=True))
            if self.on_slice_failure == FAIL:
                entry["on_slice_failure"] = FAIL
            if self.isolation == NO_ISOLATION:
                entry["isolation"] = NO_ISOLATION
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
        profiles = entry.get("profiles") or ()
        return cls(
            mode,
            (layout,) if isinstance(layout, str) else tuple(layout),
            int(entry.get("replicas") or 0),
            int(entry.get("units") or 0),
            str(entry.get("type") or ""),
            str(entry.get("compute_mode") or "default") if mode is Mode.MPS else "",
            int(entry.get("client_mem_limit_mib") or 0),
            bool(entry.get("per_job")) and mode is Mode.MIG,
            (profiles,) if isinstance(profiles, str) else tuple(profiles),
            on_slice_failure=str(entry.get("on_slice_failure") or "") if mode is Mode.MIG else "",
            isolation=str(entry.get("isolation") or "") if mode is Mode.MIG else "",
        )

    def to_json(self) -> dict:
        """Every field, for the node spec cache (``from_json`` reads it back)."""
        lists = {k: list(getattr(self, k)) for k in _TUPLES}
        return {**vars(self), "mode": self.mode.value, **lists}

    @classmethod
    def from_json(cls, data: Mapping) -> Share:
        """``to_json``'s shape (a cache written before per-job MIG lacks its keys: their defaults); TypeError,
        KeyError or ValueError for anything else."""
        tuples = {k: tuple(data[k]) for k in _TUPLES if k in data}
        return cls(**{**data, "mode": Mode(data["mode"]), "layout": tuple(data["layout"]), **tuples})


_TUPLES = ("layout", "profiles", "weights")  # Share's tuple fields, lists in JSON
