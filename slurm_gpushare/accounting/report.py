"""Usage, fairness and fair-share reports: rows of plain values, then text/CSV/JSON. Pure.

The row builders decide what is reported; ``render`` only decides how it
looks, so the three formats always carry the same numbers (tables round,
CSV and JSON do not).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..policy import Site
from .fairtree import NO_VAL, Assoc, Check, Key, Level
from .usage import UsageAggregator

FORMATS = ("table", "csv", "json")
_BY_COLUMNS = {
    "account": ("account",),
    "user": ("user",),
    "assoc": ("account", "user"),
    "partition": ("partition",),
    "gpu-kind": ("gpu_kind",),
}


def row_key(by: str, row: Mapping[str, Any]):
    """The aggregator's group key of a usage row (a tuple for account/user associations)."""
    names = _BY_COLUMNS[by]
    return tuple(row[n] for n in names) if len(names) > 1 else row[names[0]]


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: str = "text"  # text | hours | int | num | share | float


def usage_rows(agg: UsageAggregator) -> tuple[list[Column], list[dict[str, Any]], dict[str, Any]]:
    """One row per group, largest GPU-equivalent use first, and the cluster total."""
    names = _BY_COLUMNS[agg.by]
    cols = [Column(n, n.replace("_", "-")) for n in names]
    cols += [
        Column("gpu_hours", "GPU-eq h", "hours"),
        Column("billing_hours", "billing h", "hours"),
        Column("jobs", "jobs", "int"),
        Column("share", "share", "share"),
    ]
    if agg.half_life is not None:
        cols.append(Column("fairshare_gpu_hours", "fair-share GPU-eq h", "hours"))
    total = agg.total.gpu_seconds
    rows = []
    for key, t in sorted(agg.groups.items(), key=lambda kv: (-kv[1].gpu_seconds, str(kv[0]))):
        values = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(names, values, strict=False))
        row.update(_totals(t, total))
        rows.append(row)
    summary = _totals(agg.total, total)
    summary.update({"outside_window": agg.outside, "unknown_tres": dict(agg.unknown_tres)})
    return cols, rows, summary


def _totals(t, total: float) -> dict[str, Any]:
    return {
        "gpu_hours": t.gpu_seconds / 3600,
        "billing_hours": t.billing_seconds / 3600,
        "jobs": t.jobs,
        "share": t.gpu_seconds / total if total else 0.0,
        "fairshare_gpu_hours": t.fs_seconds / 3600,
    }


# ---- fairness: each tenant's usage against its share ------------------------------------------


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one has everything."""
    values = list(values)
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return None
    return sum(values) ** 2 / (len(values) * squares)


def fairness_rows(
    site: Site, gpu_seconds_by_account: Mapping[str, float]
) -> tuple[list[Column], list[dict], dict[str, float | None]]:
    """Per tenant: its share among its sibling tenants, its part of their GPU-equivalent use, the ratio.

    Siblings are the tenants under the same fair-share parent (children of a
    FairShare=parent tenant count among that tenant's siblings, as in Fair
    Tree); a tenant's use includes its sub-tenants'. Only tenants are
    compared: users' own shares are not in the policy. Jain's index is over
    the ratios of each level; ``root`` is the cluster-wide one.
    """
    tenants = {t.name: t for t in site.policy.tenants}
    level_of = {n: _fs_parent(n, tenants) for n in tenants}
    usage = {n: _subtree_usage(n, tenants, gpu_seconds_by_account) for n in tenants}
    levels: dict[str, list[str]] = {}
    for n in tenants:
        levels.setdefault(level_of[n], []).append(n)
    share = _level_shares(tenants, levels)
    rows = [_fair_row(name, tenants, levels[level_of[name]], level_of, share, usage) for name in tenants]
    index = {lvl: jain([r["ratio"] for r in rows if r["level"] == lvl and r["ratio"] is not None]) for lvl in levels}
    cols = [
        Column("tenant", "tenant"),
        Column("level", "level"),
        Column("shares", "shares"),
        Column("level_share", "share", "share"),
        Column("global_share", "cluster share", "share"),
        Column("gpu_hours", "GPU-eq h", "hours"),
        Column("level_usage", "use", "share"),
        Column("ratio", "use/share", "float"),
    ]
    return cols, rows, index


def _fs_parent(name: str, tenants) -> str:
    parent = tenants[name].parent
    while parent is not None and tenants[parent].shares == "parent":
        parent = tenants[parent].parent
    return parent or "root"


def _subtree_usage(name: str, tenants, usage: Mapping[str, float]) -> float:
    return usage.get(name, 0.0) + sum(_subtree_usage(c, tenants, usage) for c, t in tenants.items() if t.parent == name)


def _level_shares(tenants, levels) -> dict[str, float | None]:
    share: dict[str, float | None] = {}
    for members in levels.values():
        total = sum(tenants[m].shares for m in members if tenants[m].shares != "parent")
        for m in members:
            s = tenants[m].shares
            share[m] = None if s == "parent" else (s / total if total else 0.0)
    return share


def _global(name: str, tenants, level_of, share) -> float | None:
    g, node = 1.0, name
    while node != "root":
        if share.get(node) is not None:
            g *= share[node]
        node = level_of[node]
    return g if share.get(name) is not None else None


def _fair_row(name, tenants, members, level_of, share, usage) -> dict[str, Any]:
    competing = [m for m in members if share[m] is not None]
    level_total = sum(usage[m] for m in competing)
    use = usage[name] / level_total if level_total else 0.0
    s = share[name]
    return {
        "tenant": name,
        "level": level_of[name],
        "shares": tenants[name].shares,
        "level_share": s,
        "global_share": _global(name, tenants, level_of, share),
        "gpu_hours": usage[name] / 3600,
        "level_usage": use if s is not None else None,
        "ratio": (use / s) if s else None,
    }


# ---- fair share: ours beside sshare's ------------------------------------------------------------


def fairshare_rows(
    root: Assoc,
    ours: Mapping[Key, Level],
    checks: Sequence[Check] = (),
    what_if: Mapping[Key, Level] | None = None,
    what_if_usage: Assoc | None = None,
    theirs: Mapping[Key, Any] | None = None,
) -> tuple[list[Column], list[dict]]:
    """The tree, one row per association, depth-first, with sshare's values and the checks beside ours."""
    bad: dict[Key, list[str]] = {}
    for c in checks:
        if not c.ok:
            bad.setdefault(c.key, []).append(c.field)
    alt = {a.key: a.usage for a in what_if_usage.walk()} if what_if_usage is not None else {}
    cols = _fairshare_columns(theirs is not None, what_if is not None)
    rows = []
    for depth, node in _depth_walk(root):
        lv = ours[node.key]
        row = {
            "account": " " * depth + node.account,
            "user": node.user or "",
            "shares": _shown_shares(node, depth),
            "norm_shares": lv.shares_norm,
            "usage": node.usage,
            "effective_usage": lv.usage_efctv,
            "level_fs": _shown_lf(node, lv),
            "fairshare": lv.fairshare,
        }
        if theirs is not None:
            t = theirs.get(node.key)
            row.update(
                {
                    "sshare_level_fs": getattr(t, "level_fs", None),
                    "sshare_fairshare": getattr(t, "fairshare", None),
                    "mismatch": ",".join(bad.get(node.key, [])),
                }
            )
        if what_if is not None:
            w = what_if[node.key]
            row.update(
                {
                    "what_if_usage": alt.get(node.key),
                    "what_if_level_fs": _shown_lf(node, w),
                    "what_if_fairshare": w.fairshare,
                }
            )
        rows.append(row)
    return cols, rows


def _fairshare_columns(sshare: bool, what_if: bool) -> list[Column]:
    """The Fair Tree's columns: ours, then sshare's beside them, then the what-if's, as asked."""
    cols = [
        Column("account", "account"),
        Column("user", "user"),
        Column("shares", "shares"),
        Column("norm_shares", "norm shares", "float"),
        Column("usage", "raw usage", "num"),
        Column("effective_usage", "effectv usage", "float"),
        Column("level_fs", "LevelFS", "float"),
        Column("fairshare", "FairShare", "float"),
    ]
    if sshare:
        cols += [
            Column("sshare_level_fs", "sshare LevelFS", "float"),
            Column("sshare_fairshare", "sshare FairShare", "float"),
            Column("mismatch", "differs"),
        ]
    if what_if:
        cols += [
            Column("what_if_usage", "what-if usage", "num"),
            Column("what_if_level_fs", "what-if LevelFS", "float"),
            Column("what_if_fairshare", "what-if FairShare", "float"),
        ]
    return cols


def _depth_walk(node: Assoc, depth: int = 0):
    yield depth, node
    for child in node.children:
        yield from _depth_walk(child, depth + 1)


def _shown_shares(node: Assoc, depth: int):
    if depth == 0:
        return ""
    return "parent" if node.shares is None else node.shares


def _shown_lf(node: Assoc, lv: Level) -> float | None:
    """As sshare shows it: nothing for root and FairShare=parent rows."""
    if node.shares is None or lv.level_fs == NO_VAL:
        return None
    return lv.level_fs


# ---- rendering ---------------------------------------------------------------------------------


def render(
    cols: Sequence[Column], rows: Sequence[Mapping[str, Any]], fmt: str, *, extra: Mapping[str, Any] | None = None
) -> str:
    """``rows`` as an aligned table, CSV, or JSON (``{"rows": [...], **extra}``)."""
    if fmt == "json":
        return (
            json.dumps({"rows": [_json_row(r, cols) for r in rows], **(extra or {})}, indent=2, default=_json_default)
            + "\n"
        )
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([c.key for c in cols])
        for r in rows:
            w.writerow(["" if r.get(c.key) is None else r.get(c.key) for c in cols])
        return buf.getvalue()
    if fmt == "table":
        return _table(cols, rows)
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def _json_row(row: Mapping[str, Any], cols: Sequence[Column]) -> dict:
    return {c.key: json_value(row.get(c.key)) for c in cols}


def json_value(v):
    """JSON has no infinity: an infinite LevelFS is written as the text sshare prints, "inf"."""
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return v


def _json_default(v):
    if isinstance(v, tuple):
        return list(v)
    return str(v)


def _table(cols: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> str:
    cells = [[c.title for c in cols]] + [[_cell(r.get(c.key), c.kind) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = []
    for row in cells:
        parts = [v.ljust(w) if c.kind == "text" else v.rjust(w) for v, w, c in zip(row, widths, cols, strict=False)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def _cell(v, kind: str) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if kind == "hours":
        return f"{v:,.2f}"
    if kind == "share":
        return f"{100 * v:.1f}%"
    if kind == "float" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.6f}"
    if kind == "int":
        return f"{v:,}"
    if kind == "num":
        return f"{v:,.1f}"
    return str(v)
