"""The merged gres.conf: the product's lines for the policy's nodes, the site's for every other node (pure).

gres.conf is read by slurmd on every node, so the site's lines for nodes outside the policy stay as
they were. A line naming no node applies to every node: it is kept for the nodes outside the
policy (``NodeName=`` added). The product's file sets a global ``AutoDetect=off``; a site's global
AutoDetect becomes a per-node ``NodeName=<nodes outside the policy> AutoDetect=...`` line, which
gres.conf(5) lets trump the global one. The site's original lines ride along as comments
(``#gpushare-site# ``), so ``unmerge`` gives the site's file back for the next install.
"""

from __future__ import annotations

from hostlist import collect_hostlist, expand_hostlist

from ..render.header import header_ok
from . import conf
from .conf import Line, Pair
from .merge import OWNED, SITE, Change

ORIGINAL = "#gpushare-site# "
BEGIN = "# ---- the site's gres.conf for nodes outside the policy (`gpushare install`) ----"
END = "# ---- end of the site's gres.conf ----"


def unmerge(text: str) -> str | None:
    """The site's own gres.conf inside a merged one; the text itself when it is not merged."""
    if BEGIN not in text.splitlines():
        return text
    lines = [raw[len(ORIGINAL) :] for raw in text.splitlines(keepends=True) if raw.startswith(ORIGINAL)]
    return "".join(lines)


def plan_gres_conf(
    site_text: str | None, ours: str, policy_nodes: frozenset[str], site_nodes: frozenset[str]
) -> tuple[str, list[Change]]:
    """The merged gres.conf and its changes. ``site_nodes``: every node slurm.conf names (the nodes a line
    without NodeName applies to)."""
    if not site_text or header_ok(site_text):  # none, or the product's own rendered file
        return ours, [Change(OWNED, "gres.conf", None, "(written)", "the product's GRES for the policy's nodes")]
    site_text = unmerge(site_text) or ""
    outside = sorted(site_nodes - policy_nodes)
    kept, changes = _site_lines(conf.parse(site_text), policy_nodes, outside)
    original = [ORIGINAL + raw for raw in site_text.splitlines()]
    block = [BEGIN, *original, *kept, END] if original else []
    text = ours if not block else ours + "\n".join(block) + "\n"
    changes.insert(0, Change(OWNED, "gres.conf", None, "(merged)", "the product's GRES for the policy's nodes"))
    return text, changes


def _site_lines(lines: list[Line], policy_nodes: frozenset[str], outside: list[str]) -> tuple[list[str], list[Change]]:
    kept, changes = [], []
    for line in lines:
        if not line.pairs:
            continue
        names = line.get("NodeName")
        if names is None and [p.name for p in line.pairs] == ["autodetect"]:
            auto = line.pairs[0].value
            if outside and auto.lower() != "off":
                kept.append(f"NodeName={collect_hostlist(outside)} AutoDetect={auto}")
                why = "the site's global AutoDetect, now per node (the product's nodes have AutoDetect=off)"
                changes.append(Change(SITE, "AutoDetect", auto, f"{kept[-1]}", why))
            continue
        if names is None:
            if line.first is not None and line.first.name == "include":
                kept.append(line.raw.strip())
                continue
            names = collect_hostlist(outside)
            if not outside:
                changes.append(Change(OWNED, line.raw.strip(), line.raw.strip(), None, "no node outside the policy"))
                continue
        kept_line, change = _node_line(line, names, policy_nodes)
        kept += [kept_line] if kept_line else []
        changes += [change] if change else []
    return kept, changes


def _node_line(line: Line, names: str, policy_nodes: frozenset[str]) -> tuple[str | None, Change | None]:
    """A site line for ``names``: kept for the nodes outside the policy, dropped for the policy's."""
    nodes = expand_hostlist(names)
    outside = [n for n in nodes if n not in policy_nodes]
    rest = [p for p in line.pairs if p.name != "nodename"]
    if len(outside) == len(nodes) and line.get("NodeName") is not None:
        return line.raw.strip(), None
    if not outside:
        return None, Change(OWNED, line.raw.strip(), line.raw.strip(), None, "the policy's nodes: the product's lines")
    text = conf.render_pairs([Pair("NodeName", collect_hostlist(outside)), *rest])
    return text, Change(SITE, line.raw.strip(), line.raw.strip(), text, "kept for the nodes outside the policy")
