"""usage / fairness / fairshare: GPU-equivalent usage and Fair Tree reports.

Each reads live Slurm (sacct, sshare, through the Runner made here at the
entry point) or, with --sacct-file / --sshare-file, recorded output, so the
same report runs offline. Thin: parse options, call accounting, print.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import click

from .. import examples
from ..accounting import fairtree, report
from ..accounting.timeline import BucketError, Timeline, parse_bucket
from ..accounting.usage import aggregate
from ..errors import GpushareError
from ..policy import Site, load_file
from ..slurm import sshare
from ..slurm.parsable import SlurmParseError, parse_duration
from ..slurm.sacct import FileSource
from .common import SLURM_BACKEND, get_client, get_now, parse_when, zone

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _window(ctx, since: str, until: str, tz) -> tuple[float, float]:
    now = get_now(ctx)
    hi = parse_when(until, now, tz)
    lo = parse_when(since, hi, tz)
    if hi <= lo:
        raise GpushareError(f"--since ({since}) must be before --until ({until})")
    return lo, hi


def _site(policy: Path | None) -> Site:
    return load_file(policy or examples.example())


def _source(ctx, sacct_file: Path | None, tz):
    return FileSource(sacct_file, tz) if sacct_file else get_client(ctx).usage_source()


def _half_life(text: str | None) -> float | None:
    return None if text is None else _half_life_seconds(text)


def _half_life_seconds(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except SlurmParseError as exc:
        raise GpushareError(f"--half-life: {exc}") from None
    if not 0 < seconds < float("inf"):
        raise GpushareError("--half-life must be a positive, finite Slurm time such as 7-0")
    return seconds


def _stamp(t: float, tz) -> str:
    when = datetime.fromtimestamp(t, tz) if tz else datetime.fromtimestamp(t).astimezone()
    return when.isoformat(timespec="seconds")


_POLICY = click.option("--policy", type=_FILE, help="Site policy (default: the bundled small-lab example).")
_SINCE = click.option("--since", default="30d", show_default=True, help="Window start: now, 7d, 12h, or an ISO time.")
_UNTIL = click.option("--until", default="now", show_default=True, help="Window end.")
_SACCT = click.option(
    "--sacct-file",
    type=_FILE,
    help="Recorded sacct output (parsable2 with the usage fields, or --json) instead of running sacct.",
)
_FORMAT = click.option("--format", "fmt", type=click.Choice(report.FORMATS), default="table", show_default=True)
_TZ = click.option("--tz", help="Time zone of naive times in files and options (default: this host's).")
_PLOT = click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.png",
    help="Also draw the report as a PNG chart (needs matplotlib: pip install 'slurm-gpushare[plot]').",
)


def _plot_path(path: Path | None) -> Path | None:
    """Checked before any work: a .png file in a directory that exists, and matplotlib importable."""
    if path is None:
        return None
    if path.suffix.lower() != ".png":
        raise GpushareError(f"--plot {path}: the chart is written as PNG; give a file name ending in .png")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise GpushareError(f"--plot {path}: directory {parent} does not exist; give a file in an existing directory")
    from ..accounting import plot

    plot.require()
    return path


def _write_plot(path: Path, png: bytes, what: str, fmt: str) -> None:
    try:
        path.write_bytes(png)
    except OSError as exc:
        raise GpushareError(f"--plot {path}: cannot write the chart: {exc.strerror or exc}") from None
    click.echo(f"wrote {path} ({what}, {len(png):,} bytes)", err=fmt != "table")


def _timeline(bucket: str | None, plot_path: Path | None, lo: float, hi: float, tz) -> Timeline | None:
    """The time buckets to fill while aggregating, when a chart or --bucket asks for them."""
    if bucket is None and plot_path is None:
        return None
    try:
        size = parse_bucket(bucket or "auto")
        offset = (datetime.fromtimestamp(lo, tz) if tz else datetime.fromtimestamp(lo).astimezone()).utcoffset()
        return Timeline.over(lo, hi, size, offset.total_seconds() if offset else 0.0)
    except BucketError as exc:
        raise GpushareError(f"--bucket: {exc}") from None


@click.command("usage")
@_SINCE
@_UNTIL
@click.option(
    "--by", type=click.Choice(["account", "user", "gpu-kind", "partition"]), default="account", show_default=True
)
@_FORMAT
@_SACCT
@_POLICY
@click.option(
    "--half-life",
    help="Also show usage decayed to --until with this half-life (Slurm time, e.g. 7-0), times QOS UsageFactor.",
)
@_TZ
@_PLOT
@click.option(
    "--bucket",
    help="Time buckets of --plot and of the JSON's timeline: auto (at most 60 buckets "
    "of 1s .. 4w, the default with --plot), or a duration such as 15m, 1h, 1d, 1w.",
)
@SLURM_BACKEND
@click.pass_context
def usage(ctx, since, until, by, fmt, sacct_file, policy, half_life, tz, plot, bucket):
    """GPU-equivalent hours, billing hours, job counts and share of the cluster total, per group.

    A 1g.5gb MIG slice counts 1/7 of a GPU, a shard 1/replicas, an MPS unit
    1/units: the same fractions the billing weights use. Jobs are clipped
    to the window; running jobs count up to --until.

    --plot draws each group's GPU-equivalent hours per time bucket, stacked;
    the buckets come from the same pass as the table and sum to its figures
    (with --format json and --plot or --bucket, they are in its "timeline").
    """
    tz = zone(tz)
    plot = _plot_path(plot)
    lo, hi = _window(ctx, since, until, tz)
    site = _site(policy)
    timeline = _timeline(bucket, plot, lo, hi, tz)
    agg = aggregate(
        site,
        _source(ctx, sacct_file, tz).records(lo, hi),
        lo,
        hi,
        by=by,
        half_life=_half_life(half_life),
        timeline=timeline,
    )
    cols, rows, total = report.usage_rows(agg)
    window = {"since": _stamp(lo, tz), "until": _stamp(hi, tz)}
    if plot is not None:
        from ..accounting import plot as charts

        png = charts.usage_png(
            timeline, rows, lambda r: report.row_key(by, r), by, total, (window["since"], window["until"]), tz
        )
        _write_plot(plot, png, f"usage by {by}, {timeline.buckets} buckets", fmt)
    if fmt == "json":
        extra = {"window": window, "by": by, "total": total}
        if timeline is not None:
            extra["timeline"] = timeline.as_json([report.row_key(by, r) for r in rows], lambda t: _stamp(t, tz))
        click.echo(report.render(cols, rows, fmt, extra=extra), nl=False)
        return
    if fmt == "table":
        click.echo(f"GPU-equivalent usage {window['since']} .. {window['until']}, by {by}")
    click.echo(report.render(cols, rows, fmt), nl=False)
    if fmt == "table":
        click.echo(
            f"total: {total['gpu_hours']:,.2f} GPU-eq h, {total['billing_hours']:,.2f} billing h, "
            f"{total['jobs']:,} jobs ({total['outside_window']:,} records outside the window)"
        )
        _warn_unknown(total["unknown_tres"])


def _warn_unknown(unknown: dict) -> None:
    if unknown:
        listed = ", ".join(f"{k} ({v} jobs)" for k, v in sorted(unknown.items()))
        click.echo(f"warning: TRES not in the policy, counted as whole GPUs or not at all: {listed}", err=True)


@click.command("fairness")
@_SINCE
@_UNTIL
@_FORMAT
@_SACCT
@_POLICY
@_TZ
@_PLOT
@SLURM_BACKEND
@click.pass_context
def fairness(ctx, since, until, fmt, sacct_file, policy, tz, plot):
    """Each tenant's GPU-equivalent use against its share, and Jain's fairness index per level.

    use/share is 1 when a tenant used exactly its share of what its sibling
    tenants used together; Jain's index over those ratios is 1 when all are
    equal and 1/n when one tenant used everything. --plot draws each
    tenant's share and use side by side, with use/share above them.
    """
    tz = zone(tz)
    plot = _plot_path(plot)
    lo, hi = _window(ctx, since, until, tz)
    site = _site(policy)
    agg = aggregate(site, _source(ctx, sacct_file, tz).records(lo, hi), lo, hi, by="account")
    cols, rows, index = report.fairness_rows(site, {k: t.gpu_seconds for k, t in agg.groups.items()})
    window = {"since": _stamp(lo, tz), "until": _stamp(hi, tz)}
    if plot is not None:
        from ..accounting import plot as charts

        _write_plot(
            plot, charts.fairness_png(rows, index, (window["since"], window["until"])), f"{len(rows)} tenants", fmt
        )
    if fmt == "json":
        click.echo(report.render(cols, rows, fmt, extra={"window": window, "jain": index}), nl=False)
        return
    if fmt == "csv":
        cols = [*cols, report.Column("level_jain", "jain", "float")]
        rows = [{**r, "level_jain": index[r["level"]]} for r in rows]
    click.echo(report.render(cols, rows, fmt), nl=False)
    if fmt == "table":
        for level, j in sorted(index.items()):
            click.echo(f"Jain's index among the tenants under {level}: {'n/a (no use)' if j is None else f'{j:.4f}'}")


@click.command("fairshare")
@click.option(
    "--sshare-file",
    type=_FILE,
    help="Recorded `sshare -a -l --parsable2` or `sshare --json` output instead of running sshare.",
)
@click.option(
    "--json-sshare",
    is_flag=True,
    help="Run `sshare --json` (24.11+: exact doubles) instead of `sshare -a -l --parsable2`.",
)
@click.option(
    "--gpu-usage",
    is_flag=True,
    help="What if usage were counted in GPU-equivalents (from sacct) instead of billing units.",
)
@click.option(
    "--add",
    "adds",
    multiple=True,
    metavar="ACCOUNT[:USER]=HOURS",
    help="What if ACCOUNT (or one of its users) used HOURS more: GPU-equivalent hours with --gpu-usage, "
    "else billing-unit hours.",
)
@click.option("--since", help="With --gpu-usage: sacct window start (default: five half-lives before --until).")
@_UNTIL
@_SACCT
@_POLICY
@click.option("--half-life", help="With --gpu-usage: decay half-life (default: the policy's PriorityDecayHalfLife).")
@click.option(
    "--documented-ties",
    is_flag=True,
    help="Merge tied sibling accounts as fair_tree.shtml describes (slurmctld does not).",
)
@click.option("--tolerance", type=float, default=1e-6, show_default=True)
@click.option("--check", is_flag=True, help="Exit 1 if any value differs from sshare's beyond the tolerance.")
@_FORMAT
@_TZ
@SLURM_BACKEND
@click.pass_context
def fairshare(
    ctx,
    sshare_file,
    json_sshare,
    gpu_usage,
    adds,
    since,
    until,
    sacct_file,
    policy,
    half_life,
    documented_ties,
    tolerance,
    check,
    fmt,
    tz,
):
    """The Fair Tree: shares, usage, LevelFS and factor, ours beside sshare's (differences flagged).

    Ours is recomputed from sshare's own shares and RawUsage with Slurm's
    algorithm; a difference beyond --tolerance (plus what sshare's integer
    RawUsage can explain) is flagged. --gpu-usage and --add show what the
    factors would become.

    sshare -l's EffectvUsage, LevelFS and FairShare are from slurmctld's last
    PriorityCalcPeriod, its RawUsage from now: when jobs ended in between,
    RawUsage no longer gives sshare's EffectvUsage. Then LevelFS and FairShare
    are compared with ours computed from sshare's EffectvUsage (the same
    moment), and the output says so.
    """
    rows = sshare.read(sshare_file) if sshare_file else get_client(ctx).sshare(as_json=json_sshare)
    rows, root, ours, checks, moved = _ours_against_sshare(rows, tolerance, documented_ties)
    alt, alt_tree = _what_if(
        ctx, root, gpu_usage, adds, since, until, sacct_file, policy, half_life, documented_ties, tz
    )
    theirs = {r.key: r for r in rows}
    cols, table = report.fairshare_rows(root, ours, checks, alt, alt_tree, theirs)
    bad = [c for c in checks if not c.ok]
    _echo_fairshare(cols, table, checks, bad, moved, fmt, tolerance)
    if check and bad:
        raise SystemExit(1)


def _ours_against_sshare(rows, tolerance: float, documented_ties: bool):
    """(rows, tree, our Fair Tree, checks against sshare, the checks RawUsage moved since the calculation).

    When RawUsage moved, the rows are sshare's own EffectvUsage snapshot and the checks are redone on them."""
    root = fairtree.tree_from_sshare(rows)
    ours = fairtree.compute(root, merge_tied_accounts=documented_ties)
    checks = fairtree.check_against(rows, root, ours, tolerance=tolerance)
    moved = _moved_since_calculation(rows, checks)
    if moved:  # like with like: sshare's own EffectvUsage, of the moment its LevelFS and FairShare are from
        rows = fairtree.snapshot_rows(rows)
        root = fairtree.tree_from_sshare(rows)
        ours = fairtree.compute(root, merge_tied_accounts=documented_ties)
        checks = fairtree.check_against(rows, root, ours, tolerance=tolerance, usage_abs=fairtree.PRINTED_ABS)
    return rows, root, ours, checks, moved


def _echo_fairshare(cols, table, checks, bad, moved, fmt: str, tolerance: float) -> None:
    """The Fair Tree table in ``fmt``, with what differs from sshare (``bad``) and the note when RawUsage moved."""
    if fmt == "json":
        extra = {
            "compared": len(checks),
            "differ": [_check_json(c) for c in bad],
            "usage_moved_since_calculation": [_check_json(c) for c in moved],
        }
        click.echo(report.render(cols, table, fmt, extra=extra), nl=False)
    else:
        click.echo(report.render(cols, table, fmt), nl=False)
        if fmt == "table":
            click.echo(f"{len(checks)} values compared with sshare, {len(bad)} differ by more than {tolerance:g}")
            for c in bad:
                click.echo(
                    f"  {c.key[0]}{'/' + c.key[1] if c.key[1] else ''} {c.field}: ours {c.ours} sshare {c.theirs}"
                )
    if moved:
        click.echo(_MOVED.format(n=len(moved)), err=fmt != "table")


_MOVED = (
    "note: {n} RawUsage values moved since slurmctld's last priority calculation (jobs ended since): sshare's "
    "EffectvUsage, LevelFS and FairShare are from that calculation, its RawUsage from now. LevelFS and FairShare "
    "were compared with ours computed from sshare's EffectvUsage (the same moment), not from RawUsage. To compare "
    "RawUsage too, run again right after the next PriorityCalcPeriod, or use --json-sshare."
)


def _moved_since_calculation(rows, checks) -> list[fairtree.Check]:
    """The EffectvUsage checks that RawUsage fails, when the rows are sshare -l text (the JSON's U is Slurm's own)."""
    if any(r.exact_usage for r in rows):
        return []
    return [c for c in checks if c.field == "effective_usage" and not c.ok]


def _check_json(c: fairtree.Check) -> dict:
    return {
        "account": c.key[0],
        "user": c.key[1],
        "field": c.field,
        "ours": report.json_value(c.ours),
        "sshare": report.json_value(c.theirs),
        "allowed": c.allowed,
    }


def _what_if(ctx, root, gpu_usage, adds, since, until, sacct_file, policy, half_life, documented_ties, tz):
    """The what-if tree and its Fair Tree, or (None, None) when no what-if was asked for."""
    if not gpu_usage and not adds:
        return None, None
    tree = root
    if gpu_usage:
        tree = fairtree.with_usage(root, _gpu_usage(ctx, since, until, sacct_file, policy, half_life, tz))
    for account, user, hours in (_parse_add(a) for a in adds):
        try:
            tree = fairtree.add_usage(tree, account, hours * 3600, user)
        except KeyError as exc:
            raise GpushareError(f"--add: {exc.args[0]}") from None
    return fairtree.compute(tree, merge_tied_accounts=documented_ties), tree


def _gpu_usage(ctx, since, until, sacct_file, policy, half_life, tz) -> dict:
    tz = zone(tz)
    site = _site(policy)
    hl = _half_life_seconds(half_life or site.cluster.priority.decay_half_life)
    hi = parse_when(until, get_now(ctx), tz)
    lo = parse_when(since, hi, tz) if since else hi - 5 * hl
    agg = aggregate(site, _source(ctx, sacct_file, tz).records(lo, hi), lo, hi, by="assoc", half_life=hl)
    return {k: t.fs_seconds for k, t in agg.groups.items()}


def _parse_add(text: str) -> tuple[str, str | None, float]:
    m = re.fullmatch(r"([^:=\s]+)(?::([^=\s]+))?=(\d+(?:\.\d+)?)", text.strip())
    if not m:
        raise GpushareError(f"--add {text!r}: expected ACCOUNT=HOURS or ACCOUNT:USER=HOURS, e.g. physics=100")
    return m[1], m[2], float(m[3])


COMMANDS = (usage, fairness, fairshare)
