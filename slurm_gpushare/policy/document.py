"""Editing the policy document: a node's GPUs get new MIG layouts or sharing modes, in a node group of its own.

The live planner's changes are written so (``live.apply`` writes the live
policy from the admin's document with every change of its state file applied
by these functions, one node at a time). Each edit validates the whole
document (``build_site``) before it is returned, so a change the policy
refuses (an alias or tier type the site names dropped, MPS and shards on one
node) is never written. The static planner's policies get their submission
aliases remapped where a planned layout removed their target (``remap_aliases``).
"""

from __future__ import annotations

import copy
import math
import re

from hostlist import collect_hostlist, expand_hostlist

from ..errors import PolicyError
from .groups import gpus_value, parse_indexes
from .load import build_site
from .share import Mode, Share, parse_mode
from .site import Site

_GROUP_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def mode_text(entry: dict) -> str:
    """A sharing entry in a report: 'exclusive', 'mps (100 units)', 'shard (4 replicas)' (``Share.text``)."""
    return Share.from_entry(entry).text


def _mode_of(entry: dict) -> Mode | None:
    """The entry's mode, None for one that is none (``build_site`` names it)."""
    try:
        return parse_mode(entry.get("mode", ""))
    except ValueError:
        return None


def with_layout(site_doc: dict, node: str, gpu: int, layout: tuple[str, ...]) -> dict:
    """``with_layouts`` for one GPU."""
    return with_layouts(site_doc, node, {gpu: layout})


def with_layouts(site_doc: dict, node: str, layouts: dict[int, tuple[str, ...]]) -> dict:
    """The policy document with ``node`` split out of its node group into a group of its own ("<group>-<node>",
    added to every tier that had the group) whose GPUs get the MIG layouts ``layouts`` (gpu -> layout); every other
    GPU and node unchanged. A node alone in its group keeps the group. The whole set is validated (``build_site``)
    before the document is returned: PolicyError (a type an alias names dropped, say); ValueError for a node or
    GPU the policy has not, or a GPU not shared by MIG."""
    if not layouts:
        raise ValueError(f"node {node}: no GPU layout given (a mapping gpu -> MIG layout)")

    def check(gpu: int, entry: dict | None, group: dict) -> None:
        if entry is None:
            raise ValueError(
                f"GPU {gpu} of node {node} has no MIG sharing entry in node group {group['name']} "
                "(an exclusive GPU): the live planner changes MIG layouts only"
            )
        if _mode_of(entry) is not Mode.MIG:
            raise ValueError(
                f"GPU {gpu} of node {node} is shared by mode {entry.get('mode')} in node group "
                f"{group['name']}, not mig: the live planner changes MIG layouts only"
            )

    entries = {g: Share(Mode.MIG, tuple(layout)).to_entry() for g, layout in layouts.items()}
    what = ", ".join(f"GPU {g} as {'+'.join(layouts[g])}" for g in sorted(layouts))
    return _with_entries(site_doc, node, entries, check, what)


def with_modes(site_doc: dict, node: str, modes: dict[int, dict]) -> dict:
    """``with_layouts`` for sharing modes: the node's GPUs ``modes`` (gpu -> a sharing entry without ``gpus``:
    ``{"mode": "mps", "units": 100}``, ``{"mode": "shard", "replicas": 4}``, ``{"mode": "exclusive"}``) get
    those modes, in a group of the node's own, validated as a whole (``build_site``: mps and shard on one node,
    say, is refused with PolicyError). ValueError for a GPU shared by MIG or to be made MIG: gpushare never
    changes a GPU's MIG mode (that needs a GPU reset)."""
    if not modes:
        raise ValueError(f"node {node}: no GPU mode given (a mapping gpu -> sharing entry)")
    for gpu, entry in modes.items():
        if _mode_of(entry) in (None, Mode.MIG):
            raise ValueError(
                f"GPU {gpu} of node {node}: mode {entry.get('mode')!r}: the live planner sets "
                "exclusive, mps or shard (MIG mode is never changed: it needs a GPU reset)"
            )

    def check(gpu: int, entry: dict | None, group: dict) -> None:
        if entry is not None and _mode_of(entry) is Mode.MIG:
            raise ValueError(
                f"GPU {gpu} of node {node} is shared by MIG in node group {group['name']}: the live "
                "planner never changes a GPU's MIG mode (it needs a GPU reset)"
            )

    what = ", ".join(f"GPU {g} {mode_text(modes[g])}" for g in sorted(modes))
    return _with_entries(site_doc, node, {g: dict(e) for g, e in modes.items()}, check, what)


def _with_entries(site_doc: dict, node: str, entries: dict[int, dict], check, what: str) -> dict:
    """The document with the node in a group of its own whose GPUs ``entries`` get these sharing entries;
    ``check(gpu, its present entry or None, group)`` raises ValueError for a GPU that may not change so."""
    doc = copy.deepcopy(site_doc)
    groups = doc.get("node_groups") or []
    for i, group in enumerate(groups):  # noqa: B007 - i, the found group's index, is used after the loop
        nodes = expand_hostlist(str(group.get("nodes", "")))
        if node in nodes:
            break
    else:
        raise ValueError(
            f"node {node!r} is in no node group of the policy; groups: {', '.join(str(g.get('name')) for g in groups)}"
        )
    count = int(group["gpu"]["count"])
    for gpu in sorted(entries):
        if not 0 <= gpu < count:
            raise ValueError(f"GPU {gpu} of node {node}: node group {group['name']} has {count} GPU(s), 0-{count - 1}")
    sharing, found = [], set()
    for entry in group.get("sharing") or []:
        indexes = parse_indexes(entry["gpus"], count)
        mine = [x for x in indexes if x in entries]
        if not mine:
            sharing.append(entry)
            continue
        check(mine[0], entry, group)
        rest = [x for x in indexes if x not in entries]
        if rest:
            sharing.append({**entry, "gpus": gpus_value(rest)})
        found.update(mine)
    for gpu in sorted(set(entries) - found):
        check(gpu, None, group)
    sharing += [{"gpus": gpu, **entries[gpu]} for gpu in sorted(entries)]
    sharing.sort(key=lambda e: parse_indexes(e["gpus"], count)[0])
    if len(nodes) == 1:
        group["sharing"] = sharing
    else:
        taken = {str(g.get("name")) for g in groups}
        name = _group_name(f"{group['name']}-{node}", taken)
        groups.insert(i + 1, {**copy.deepcopy(group), "name": name, "nodes": node, "sharing": sharing})
        group["nodes"] = collect_hostlist([n for n in nodes if n != node])
        for tier in doc.get("tiers") or []:
            names = tier.get("node_groups") or []
            if group["name"] in names:
                names.insert(names.index(group["name"]) + 1, name)
    build_site(doc, f"live policy ({node} {what})")
    return doc


def _group_name(wanted: str, taken: set[str]) -> str:
    base = _GROUP_NAME.sub("-", wanted)
    if not base[:1].isalpha():
        base = "g" + base
    base = base[:63]
    name, n = base, 2
    while name in taken:
        suffix = f"-{n}"
        name, n = base[: 63 - len(suffix)] + suffix, n + 1
    return name


def remap_aliases(doc: dict, before: Site) -> list[str]:
    """Submission aliases whose target the document's layout no longer has (``before``: the site it was planned
    from): remapped to the nearest thing it has, or dropped.

    A 'gpu:<type>' target whose type is gone goes to the smallest GPU type of the same model that covers the
    same share of a GPU (a MIG slice or the whole GPU), else to the same share through MPS ('mps:<percent>'),
    else to a shard when the share is below one GPU; a 'shard' target goes to the smallest MIG slice covering
    its share, else to its share through MPS; an 'mps:<percent>' target to the smallest MIG slice that covers
    it. What has no counterpart is dropped.
    Edits ``doc`` in place; returns one report line per alias changed.
    """
    sub = doc.get("submission") or {}
    aliases = dict(sub.get("aliases") or {})
    if not aliases:
        return []
    probe = copy.deepcopy(doc)
    probe["submission"]["aliases"] = {}
    try:
        after = build_site(probe, "planned policy")
    except PolicyError:  # the final validation names the problem; nothing to remap against here
        return []
    old, new = _gpu_types(before), _gpu_types(after)
    modes = {s.mode for g in after.groups for s in g.gpus}
    old_replicas = [s.replicas for g in before.groups for s in g.gpus if s.mode == "shard"]
    why = []
    for alias, target in list(aliases.items()):
        gone = _gone_target(target, old, new, modes, old_replicas)
        if gone is None:
            continue
        kind, model, share = gone
        repl = _alias_replacement(kind, model, share, new, modes)
        if repl:
            aliases[alias] = repl
            why.append(
                f"alias '{alias}': {target} no longer exists in the planned layout; remapped to {repl} "
                f"(it asked {share:.2f} of a {model or 'GPU'})"
            )
        else:
            del aliases[alias]
            why.append(
                f"alias '{alias}': {target} no longer exists in the planned layout and nothing planned "
                f"covers {share:.2f} of a GPU; dropped"
            )
    sub["aliases"] = aliases
    doc["submission"] = sub
    return why


def _gpu_types(site: Site) -> dict[str, tuple[str, float]]:
    """Every GPU type of a site: {slurm type: (model name, GPU fraction of one)} (MIG slices and whole GPUs)."""
    out: dict[str, tuple[str, float]] = {}
    for g in site.groups:
        for slot in g.gpus:
            if slot.mode == "mig":
                for p in slot.layout:
                    out[slot.model.mig_slurm_type(p)] = (slot.model.name, slot.model.profile(p).fraction(slot.model))
            else:
                out[slot.slurm_type] = (slot.model.name, 1.0)
    return out


def _gone_target(
    target: str, old: dict[str, tuple[str, float]], new: dict, modes: set[Mode], old_replicas: list[int]
) -> tuple[str, str, float] | None:
    """(kind, model name or '', share of a GPU) of an alias target that the new layout removed; None when the
    layout still has it, or when it is not something a layout removes (validation reports it as written)."""
    kind, _, arg = target.strip().partition(":")
    if kind == "gpu" and arg in new or kind == "shard" and "shard" in modes or kind == "mps" and "mps" in modes:
        return None
    if kind == "gpu" and arg in old:
        return kind, *old[arg]
    if kind == "shard" and old_replicas:
        return kind, "", 1.0 / max(old_replicas)
    if kind == "mps" and arg.isdigit():
        return kind, "", int(arg) / 100
    return None


def _alias_replacement(
    kind: str, model: str, share: float, new: dict[str, tuple[str, float]], modes: set[Mode]
) -> str | None:
    """The target a removed alias target of this kind and share is remapped to; None: nothing covers it."""
    same = sorted((f, t) for t, (m, f) in new.items() if (m == model or kind != "gpu" and f < 1) and f >= share - 1e-9)
    # a share below one GPU keeps its size where it can (a slice, MPS, a shard) before taking a whole GPU
    if same and (same[0][0] < 1 or share >= 1):
        return f"gpu:{same[0][1]}"
    if "mps" in modes and kind != "mps":
        return f"mps:{min(100, max(1, math.ceil(share * 100 - 1e-9)))}"
    if "shard" in modes and share < 1 and kind == "gpu":
        return "shard"
    if same and kind == "gpu":
        return f"gpu:{same[0][1]}"
    return None
