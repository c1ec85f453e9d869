"""Which of the policy's nodes change GRES at the switch (pure).

Slurm 24.11 kills and requeues the jobs holding GRES on a node whose GRES count changes at a
reconfigure (docs/reference/slurm-behaviour.md), so those nodes are drained and emptied first
(docs/admins/switching.md). A node's GRES now are the ``Gres=`` of its last ``NodeName`` line: in the
include the last install wrote when there is one, else in the site's slurm.conf (and the files it
includes), ``NodeName=DEFAULT`` lines giving it to the lines after them that set none. A node the
site does not define yet is new, not changed: no job runs there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hostlist import expand_hostlist

from .conf import Line

_SOCKETS = re.compile(r"\(S:[^)]*\)")


def node_gres(lines: Iterable[Line]) -> dict[str, frozenset[str]]:
    """Node name -> its GRES items ("gpu:l40s:2"), as the last of ``lines`` that defines it says."""
    out: dict[str, frozenset[str]] = {}
    default: str | None = None
    for line in lines:
        name = line.get("NodeName") if line.record == "nodename" else None
        if not name:
            continue
        gres = line.get("Gres")
        if name.upper() == "DEFAULT":
            default = gres if gres is not None else default
            continue
        items = gres_items(gres if gres is not None else default)
        for node in expand_hostlist(name):
            out[node] = items
    return out


def gres_items(value: str | None) -> frozenset[str]:
    """A Gres= value as a set of name[:type]:count items (a count of 1 written out, socket binding dropped)."""
    items = []
    for raw in _SOCKETS.sub("", value or "").split(","):
        item = raw.strip()
        if not item or item.lower() == "(null)":
            continue
        parts = item.split(":")
        if not parts[-1].isdigit():
            parts.append("1")
        items.append(":".join(parts))
    return frozenset(items)


def gres_changes(
    now: dict[str, frozenset[str]], after: dict[str, frozenset[str]], nodes: Iterable[str]
) -> dict[str, tuple[str, str]]:
    """Each of ``nodes`` defined now whose GRES differ after: node -> (now, after), as Gres= values."""
    changed = {}
    for node in sorted(nodes):
        if node in now and now[node] != after.get(node, frozenset()):
            changed[node] = (_text(now[node]), _text(after.get(node, frozenset())))
    return changed


def _text(items: frozenset[str]) -> str:
    return ",".join(sorted(items)) or "(none)"
