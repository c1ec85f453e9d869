"""Node-group rules: hostlists, GPU models, and each GPU's sharing mode.

``resolve_groups`` returns the resolved groups and every problem it found;
a group with problems is left out of the result but its siblings are still
checked, so one run reports everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import hostlist

from ..errors import Problem
from ..hardware import CatalogueError, GpuModel, check_layout, get_model, models
from ..records import replace
from ..slurmversion import SlurmVersion
from . import perjob
from .model import GpuModelDecl, NodeGroup, Sharing
from .share import Mode, Share, misplaced_keys
from .site import GpuSlot, Group

MPS_UNITS = tuple(n for n in range(2, 101) if 100 % n == 0)
MAX_REPLICAS = 1024  # Slurm caps a File= GRES count at 1024
MIG_WITH_SHARED_FIXED = SlurmVersion(23, 2, 7)  # Bug 17482: wrong MIG devices constrained
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def declared_models(decls: list[GpuModelDecl]) -> tuple[dict[str, GpuModel], list[Problem]]:
    """The policy's own GPU models (gpu_models), keyed by lower-case name: whole GPUs, no MIG.

    A declared model may not reuse a catalogue model's name or Slurm type, nor another declared one's.
    """
    problems: list[Problem] = []
    out: dict[str, GpuModel] = {}
    types = {m.slurm_type: m.name for m in models()}
    for i, d in enumerate(decls):
        path = f"gpu_models[{i}]"
        try:
            get_model(d.name)
            problems.append(
                Problem(f"{path}.name", f"{d.name!r} is already in the catalogue; use it without declaring it")
            )
            continue
        except CatalogueError:
            pass
        if d.name.lower() in out:
            problems.append(Problem(f"{path}.name", f"GPU model {d.name!r} is declared twice"))
            continue
        slurm_type = d.slurm_type or re.sub(r"[^a-z0-9_.]", "_", d.name.lower())
        if slurm_type in types:
            problems.append(
                Problem(
                    f"{path}.slurm_type",
                    f"GPU type {slurm_type!r} already names {types[slurm_type]}; give this model its own slurm_type",
                )
            )
            continue
        types[slurm_type] = d.name
        out[d.name.lower()] = GpuModel(
            name=d.name,
            nvml_names=(),
            slurm_type=slurm_type,
            memory_mib=d.memory_mb,
            compute_slices=0,
            memory_slices=0,
            multiprocessors=None,
            pci_device_ids=(),
            mig_profiles=(),
            source=f"policy {path}",
        )
    return out, problems


def find_model(name: str, declared: dict[str, GpuModel]) -> GpuModel:
    """A catalogue model, or one the policy declares; CatalogueError lists both kinds."""
    found = declared.get(name.strip().lower()) if isinstance(name, str) else None
    if found is not None:
        return found
    try:
        return get_model(name)
    except CatalogueError as exc:
        if declared:
            raise CatalogueError(
                f"{exc}; declared in gpu_models: {', '.join(m.name for m in declared.values())}"
            ) from None
        raise CatalogueError(f"{exc} (or declare it under gpu_models: name, memory_mb)") from None


def resolve_groups(
    groups: list[NodeGroup], version: SlurmVersion, declared: dict[str, GpuModel] | None = None
) -> tuple[list[Group], list[Problem]]:
    declared = declared or {}
    problems: list[Problem] = []
    resolved: list[Group] = []
    owner: dict[str, int] = {}
    seen_names: dict[str, int] = {}
    for i, spec in enumerate(groups):
        path = f"node_groups[{i}]"
        if spec.name in seen_names:
            problems.append(
                Problem(f"{path}.name", f"{spec.name!r} is already used by node_groups[{seen_names[spec.name]}]")
            )
        seen_names.setdefault(spec.name, i)
        nodes = _expand(spec.nodes, f"{path}.nodes", problems)
        for node in nodes:
            if node in owner and owner[node] != i:
                problems.append(
                    Problem(
                        f"{path}.nodes",
                        f"node {node} is also in node_groups[{owner[node]}] "
                        f"({groups[owner[node]].nodes}); a node belongs to one group",
                    )
                )
                break
        for node in nodes:
            owner.setdefault(node, i)
        group = _resolve_group(spec, path, nodes, version, problems, declared)
        if group is not None:
            resolved.append(group)
    return resolved, problems


def _expand(text: str, path: str, problems: list[Problem]) -> tuple[str, ...]:
    try:
        nodes = hostlist.expand_hostlist(text, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        problems.append(Problem(path, f"{text!r} is not a valid hostlist ({exc}); write e.g. gpu-[01-16] or a,b,c"))
        return ()
    bad = [n for n in nodes if not _NODE_NAME.match(n)]
    if bad:
        problems.append(Problem(path, f"{bad[0]!r} is not a valid node name (letters, digits, '-', '_', '.')"))
        return ()
    dup = _first_duplicate(nodes)
    if dup:
        problems.append(Problem(path, f"node {dup[0]} is listed twice in {text!r}"))
    if not nodes:
        problems.append(Problem(path, "the hostlist names no nodes"))
    return tuple(dict.fromkeys(nodes))


def _resolve_group(spec, path, nodes, version, problems, declared) -> Group | None:
    try:
        model = find_model(spec.gpu.model, declared)
    except CatalogueError as exc:
        problems.append(Problem(f"{path}.gpu.model", str(exc)))
        return None
    before = len(problems)
    slots: dict[int, GpuSlot] = {}
    for j, sharing in enumerate(spec.sharing):
        _resolve_sharing(sharing, f"{path}.sharing[{j}]", spec.gpu.count, model, slots, problems, version)
    for index in range(spec.gpu.count):
        slots.setdefault(index, GpuSlot(index, model))
    _check_mode_mix(list(slots.values()), f"{path}.sharing", version, problems)
    perjob.check_group(list(slots.values()), f"{path}.sharing", problems)
    if len(problems) > before or not nodes:
        return None
    gpus = tuple(slots[i] for i in sorted(slots))
    return Group(spec, nodes, hostlist.collect_hostlist(list(nodes)), model, gpus)


def parse_indexes(value: str | int, count: int) -> list[int]:
    """'0-3', '4,5', 6 -> GPU indexes; ValueError names what would be accepted."""
    if isinstance(value, bool):
        raise ValueError('expected GPU indexes such as 0, "0-3" or "4,5"')
    text = str(value).strip()
    indexes: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ValueError(f'{text!r} is not a GPU index list; write e.g. 0, "0-3" or "4,5"')
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise ValueError(f"range {part.strip()!r} runs backwards")
        indexes.extend(range(lo, hi + 1))
    out_of_range = [i for i in indexes if i >= count]
    if out_of_range:
        raise ValueError(
            f"GPU index {out_of_range[0]} is out of range: this group has {count} GPU(s), indexes 0-{count - 1}"
        )
    return indexes


def format_indexes(indexes: Iterable[int]) -> str:
    """GPU indexes as ``parse_indexes`` reads them: sorted, consecutive runs joined ([0, 1, 2, 5] -> '0-2,5')."""
    ordered = sorted(set(indexes))
    if not ordered:
        raise ValueError("no GPU indexes to write: a sharing entry names at least one GPU")
    runs: list[str] = []
    start: int | None = ordered[0]  # None only after the last run
    for a, b in zip(ordered, [*ordered[1:], None], strict=False):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ",".join(runs)


def gpus_value(indexes: Iterable[int]) -> int | str:
    """A sharing entry's ``gpus:`` as a policy file writes it: one GPU as a number (3), more as text ("0-2,5")."""
    text = format_indexes(indexes)
    return int(text) if text.isdigit() else text


def _resolve_sharing(sharing: Sharing, path, count, model: GpuModel, slots, problems, version: SlurmVersion) -> None:
    try:
        indexes = parse_indexes(sharing.gpus, count)
    except ValueError as exc:
        problems.append(Problem(f"{path}.gpus", str(exc)))
        return
    share = _make_share(sharing, path, model, problems, version)
    for index in indexes:
        if index in slots:
            problems.append(Problem(f"{path}.gpus", f"GPU {index} already has a sharing mode from an earlier entry"))
            return
    if share is None:
        return
    for index in indexes:
        slots[index] = GpuSlot(index, model, share)


def _make_share(sharing: Sharing, path, model: GpuModel, problems, version: SlurmVersion) -> Share | None:
    before = len(problems)
    mode = sharing.mode
    for key, why in misplaced_keys(mode, sharing.model_dump()):
        problems.append(Problem(f"{path}.{key}", why))
    share = Share.from_entry(sharing.model_dump())
    if share.type == model.slurm_type:
        share = replace(share, type="")  # the model's own type: as if not given
    if mode is Mode.MIG and sharing.per_job:
        return perjob.resolve(sharing, path, model, share, problems, version) if len(problems) == before else None
    if mode is Mode.MIG and sharing.profiles is not None:
        problems.append(Problem(f"{path}.profiles", "only for per_job: true (the profiles a per-job range allows)"))
    if mode is Mode.MIG and sharing.carrier_weights is not None:
        problems.append(
            Problem(f"{path}.carrier_weights", "only for per_job: true (the shards each per-job profile carries)")
        )
    if mode is Mode.MIG and sharing.isolation is not None:
        problems.append(
            Problem(
                f"{path}.isolation", "only for per_job: true (a fixed layout's instances are isolated by gres.conf)"
            )
        )
    if mode is Mode.MIG and sharing.on_slice_failure is not None:
        problems.append(
            Problem(
                f"{path}.on_slice_failure",
                "only for per_job: true (what becomes of a job whose per-job instance could not be made)",
            )
        )
    if mode is Mode.MIG:
        layout = _resolve_layout(sharing.layout, f"{path}.layout", model, problems)
        share = replace(share, layout=layout)
    elif mode is Mode.SHARD:
        _check_replicas(sharing.replicas, path, problems)
    elif mode is Mode.MPS:
        _check_units(sharing.units, path, problems)
    return None if len(problems) > before else share


def _check_replicas(replicas: int | None, path, problems) -> None:
    if replicas is None:
        problems.append(Problem(f"{path}.replicas", "required for mode shard: an integer >= 2"))
    elif not 2 <= replicas <= MAX_REPLICAS:
        problems.append(
            Problem(
                f"{path}.replicas",
                f"{replicas} is not allowed: replicas must be >= 2 (one replica is an exclusive GPU) and <= "
                f"{MAX_REPLICAS}",
            )
        )


def _check_units(units: int | None, path, problems) -> None:
    if units is None:
        problems.append(Problem(f"{path}.units", f"required for mode mps: one of {', '.join(map(str, MPS_UNITS))}"))
    elif units not in MPS_UNITS:
        problems.append(
            Problem(
                f"{path}.units",
                f"{units} units do not give whole percentages per unit; allowed: {', '.join(map(str, MPS_UNITS))} "
                "(divisors of 100)",
            )
        )


def _resolve_layout(layout, path, model: GpuModel, problems) -> tuple[str, ...]:
    if not model.mig_capable:
        mig = ", ".join(m.name for m in models() if m.mig_capable)
        problems.append(
            Problem(path.rsplit(".", 1)[0] + ".mode", f"{model.name} does not support MIG; MIG models: {mig}")
        )
        return ()
    named = model.named_layouts()
    if layout is None or layout == [] or layout == "":
        problems.append(
            Problem(path, f"required for mode mig: a list of profiles or one of {', '.join(sorted(named))}")
        )
        return ()
    if isinstance(layout, str):
        if layout not in named:
            problems.append(
                Problem(path, f"{layout!r} is not a named layout for {model.name}; known: {', '.join(sorted(named))}")
            )
            return ()
        return tuple(named[layout])
    reasons = check_layout(model, list(layout))
    for reason in reasons:
        problems.append(Problem(path, reason))
    return tuple(layout)


def _check_mode_mix(slots: list[GpuSlot], path, version: SlurmVersion, problems) -> None:
    modes = {s.mode.value for s in slots}
    if {"mps", "shard"} <= modes:
        problems.append(
            Problem(
                path,
                "mps and shard on the same node are not supported by Slurm (one shared GRES per node); put them in "
                "separate node groups",
            )
        )
    if "mig" in modes and modes & {"mps", "shard"} and version < MIG_WITH_SHARED_FIXED:
        problems.append(
            Problem(
                path,
                f"MIG together with {'/'.join(sorted(modes & {'mps', 'shard'}))} on one node constrains the wrong MIG "
                "devices before Slurm 23.02.7 (Bug 17482); upgrade or split the node group",
            )
        )


def _first_duplicate(nodes: list[str]) -> list[str]:
    seen: set[str] = set()
    for node in nodes:
        if node in seen:
            return [node]
        seen.add(node)
    return []
