"""PNG charts of the usage and fairness reports, for sites without Grafana: figures in, PNG bytes out.

They draw the rows the text and JSON reports print (``report.usage_rows``,
``report.fairness_rows``) and the usage buckets the aggregator filled in the
same pass (``timeline.Timeline``), so a chart and its table never disagree.

matplotlib is an optional extra (``pip install 'slurm-gpushare[plot]'``),
imported only here and only when a chart is drawn. The object-oriented API
draws on Agg into memory: no display, no pyplot global state, nothing
written here (the CLI writes the bytes).
"""

from __future__ import annotations

import io
import math
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any

from ..errors import GpushareError
from .timeline import HOUR, Timeline, label
from .timeline import name as _name

EXTRA = "pip install 'slurm-gpushare[plot]'"
MAX_SERIES = 10
DPI = 100
SIZE = (9.0, 4.8)


class PlotUnavailable(GpushareError):
    """matplotlib is not installed: the charts are an optional extra."""


def require() -> None:
    """Fail early, with the extra to install, when matplotlib cannot be imported."""
    _mpl()


def _mpl():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed here ({exc}): {EXTRA}") from None
    return Figure


def hours_text(h: float) -> str:
    """GPU-equivalent hours for a legend: 1,234 / 12.3 / 0.0123."""
    if h == 0:
        return "0"
    if abs(h) >= 100:
        return f"{h:,.0f}"
    if abs(h) >= 1:
        return f"{h:,.1f}"
    return f"{h:.3g}"


def usage_png(
    timeline: Timeline,
    rows: Sequence[Mapping[str, Any]],
    key_of,
    by: str,
    total: Mapping[str, Any],
    window: tuple[str, str],
    tz: tzinfo | None,
) -> bytes:
    """Stacked bars: each group's GPU-equivalent hours per bucket, largest group at the bottom.

    ``rows`` are the usage report's rows (largest first), ``key_of(row)`` the
    timeline key of a row; the legend carries each group's total and share
    from the same rows.
    """
    Figure = _mpl()
    keys: list[Hashable] = [key_of(r) for r in rows]
    by_name = {_name(k): r for k, r in zip(keys, rows, strict=False)}
    series = [(n, s) for n, s in timeline.top(keys, MAX_SERIES) if any(s)]
    edges = [datetime.fromtimestamp(t, tz) if tz else datetime.fromtimestamp(t).astimezone() for t in timeline.edges]
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    _stacked_bars(ax, timeline, series, edges, by_name)
    per = label(timeline.bucket)
    ax.set_ylabel(f"GPU-equivalent hours per {per}")
    ax.set_xlabel(f"time ({_zone_name(edges[0])})")
    fig.suptitle(
        f"GPU-equivalent hours by {by}, {window[0]} .. {window[1]}\n"
        f"total {hours_text(total['gpu_hours'])} GPU-eq h in {total['jobs']:,} jobs, {per} buckets",
        fontsize=10,
    )
    _time_axes(ax, timeline, edges)
    if series:
        ax.legend(
            title=f"{by}: GPU-eq h (share)",
            fontsize=8,
            title_fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.12, 1.0),
            frameon=False,
        )
    else:
        ax.text(0.5, 0.5, "no GPU use in this window", transform=ax.transAxes, ha="center", va="center")
    return _png(fig)


def _stacked_bars(ax, timeline: Timeline, series, edges: list[datetime], by_name: Mapping[str, Any]) -> None:
    """One bar per bucket and series, each series on the ones before it, labelled for the legend."""
    starts, widths = edges[:-1], [(b - a).total_seconds() / 86400 for a, b in zip(edges, edges[1:], strict=False)]
    bottom = [0.0] * timeline.buckets
    colours = _colours(len(series))
    for (name, s), colour in zip(series, colours, strict=False):
        hours = [v / HOUR for v in s]
        ax.bar(
            starts,
            hours,
            width=widths,
            bottom=bottom,
            align="edge",
            color=colour,
            edgecolor="white",
            linewidth=0.3,
            label=_usage_label(name, by_name.get(name)),
        )
        bottom = [b + h for b, h in zip(bottom, hours, strict=False)]


def _time_axes(ax, timeline: Timeline, edges: list[datetime]) -> None:
    """Mean GPU-equivalents on the right, dates in the edges' zone below, the window exactly, a light grid."""
    from matplotlib import dates as mdates

    rate = timeline.bucket / HOUR
    right = ax.secondary_yaxis("right", functions=(lambda h: h / rate, lambda g: g * rate))
    right.set_ylabel("mean GPU-equivalents in use")
    locator = mdates.AutoDateLocator(tz=edges[0].tzinfo)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=edges[0].tzinfo))
    ax.set_xlim(edges[0], edges[-1])
    ax.grid(axis="y", alpha=0.3)


def _usage_label(name: str, row: Mapping[str, Any] | None) -> str:
    if row is None:  # the summed remainder
        return name
    return f"{name}: {hours_text(row['gpu_hours'])} ({100 * row['share']:.1f}%)"


def fairness_png(
    rows: Sequence[Mapping[str, Any]], index: Mapping[str, float | None], window: tuple[str, str]
) -> bytes:
    """Paired bars per tenant: its share of its level and its part of the level's GPU-equivalent use.

    Tenants are grouped by fair-share level (siblings compete with each
    other); use/share is written above each pair, Jain's index per level in
    the title. FairShare=parent tenants have no share of their own and are
    listed under the chart.
    """
    Figure = _mpl()
    levels: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["level_share"] is not None:
            levels.setdefault(r["level"], []).append(r)
    parents = [r["tenant"] for r in rows if r["level_share"] is None]
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    x, width = 0.0, 0.38
    ticks: list[float] = []
    tick_labels: list[str] = []
    colours = _colours(2)  # share, use
    for n, (level, members) in enumerate(sorted(levels.items(), key=lambda kv: (kv[0] != "root", kv[0]))):
        first = x
        for r in members:
            _tenant_pair(ax, r, x, width, colours, labelled=not ticks)
            ticks.append(x)
            tick_labels.append(f"{r['tenant']}\n{hours_text(r['gpu_hours'])} GPU-eq h")
            x += 1.0
        _level_caption(ax, level, (first + x - 1) / 2, index.get(level))
        if n < len(levels) - 1:
            ax.axvline(x - 0.5, color="grey", linewidth=0.6, linestyle=":")
        x += 0.4
    ax.set_xticks(ticks, tick_labels, fontsize=8)
    ax.set_ylabel("percent of the tenant's level (%)")
    top = max([100.0] + [100 * max(r["level_share"], r["level_usage"] or 0) for m in levels.values() for r in m])
    ax.set_ylim(0, math.ceil(top / 10) * 10 + 12)
    ax.set_title(
        f"GPU-equivalent use against fair share, {window[0]} .. {window[1]}\n"
        "each tenant against its siblings (tenants under the same fair-share parent)",
        fontsize=10,
        pad=22,
    )
    ax.grid(axis="y", alpha=0.3)
    if ticks:
        ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no tenants with shares in the policy", transform=ax.transAxes, ha="center", va="center")
    if parents:
        fig.text(0.01, 0.005, f"FairShare=parent (counted with their parent's level): {', '.join(parents)}", fontsize=7)
    return _png(fig)


def _tenant_pair(ax, r: Mapping[str, Any], x: float, width: float, colours, labelled: bool) -> None:
    """A tenant's share and use bars side by side at ``x``, use/share above them; ``labelled``: the first pair,
    which names the two bars in the legend."""
    share_c, use_c = colours
    share, use = 100 * r["level_share"], 100 * (r["level_usage"] or 0.0)
    ax.bar(x - width / 2, share, width, color=share_c, label="share (normalised shares)" if labelled else None)
    ax.bar(
        x + width / 2,
        use,
        width,
        color=use_c,
        label="use (part of the level's GPU-eq h)" if labelled else None,
    )
    ratio = r["ratio"]
    ax.annotate(
        "use/share\n" + ("n/a" if ratio is None else f"{ratio:.2f}"),
        (x, max(share, use)),
        xytext=(0, 3),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=7,
    )


def _level_caption(ax, level: str, x: float, j: float | None) -> None:
    """The fair-share level's name and Jain's index ``j``, under its tenants (centred on ``x``)."""
    ax.text(
        x,
        -0.13,
        f"{'cluster (root)' if level == 'root' else 'under ' + level}\nJain {('n/a' if j is None else f'{j:.3f}')}",
        transform=ax.get_xaxis_transform(),
        ha="center",
        va="top",
        fontsize=8,
        style="italic",
    )


def _colours(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _zone_name(when: datetime) -> str:
    return when.tzname() or "local time"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()
