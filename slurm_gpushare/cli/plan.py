"""`gpushare plan`: choose the sharing layout, node weights and class routing from the workload."""

from __future__ import annotations

import difflib
from pathlib import Path

import click
import yaml

from ..atomic import atomic_write
from ..errors import GpushareError
from ..planner.demand import Demand, DemandError, Units, format_demand, from_job_records, from_openb, from_squeue_json
from ..planner.search import BUDGET_S
from ..policy import Site, load_file
from ..policy.billing import unit_fractions
from ..policy.load import parse_yaml
from ..policy.share import Mode
from .common import SLURM_BACKEND

FORMS = (
    "openb:FILE.csv[.gz], sacct:FILE (recorded sacct --json or --parsable2), squeue:FILE (squeue --json), sacct:live"
)


def units_of(site: Site) -> Units:
    """How this site's GRES counts read as GPU shares (for sacct/squeue demand), from ``billing.unit_fractions``:
    MPS units and shard replicas per GPU (the largest the site uses), each MIG type's share of its GPU."""
    mps, shard, mig = [], [], {}
    for group in site.groups:
        whole = {f"gpu:{s.slurm_type}" for s in group.gpus if not s.share.is_mig}
        for kind, fraction in unit_fractions(group):
            if kind == Mode.MPS:
                mps.append(round(1 / fraction))
            elif kind == Mode.SHARD:
                shard.append(round(1 / fraction))
            elif kind not in whole:
                mig[kind.split(":", 1)[1]] = round(1000 * fraction)
    return Units(mps=max(mps, default=100), shard=max(shard, default=1), type_milli=mig)


def read_demand(source: str, site: Site, ctx: click.Context | None = None, days: float = 30.0) -> Demand:
    kind, sep, where = source.partition(":")
    if not sep or not where:
        raise GpushareError(f"--demand {source!r}: write KIND:WHERE, one of {FORMS}")
    if kind == "sacct" and where == "live":
        return _sacct_live(ctx, site, days)
    path = Path(where)
    text = _read_text(path, source)
    if kind == "openb":
        return from_openb(text, path.name)
    if kind == "squeue":
        return from_squeue_json(text, units_of(site), path.name)
    if kind == "sacct":
        from ..slurm.sacct import open_records

        return from_job_records(open_records(path), units_of(site), path.name)
    raise GpushareError(f"--demand {source!r}: unknown kind {kind!r}; accepted: {FORMS}")


def _read_text(path: Path, source: str) -> str:
    """The file's UTF-8 text; a gzip-compressed file (the paper's pod lists ship so) is read through gzip."""
    import gzip
    import zlib

    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except OSError as exc:
        raise DemandError(f"--demand {source}: cannot read {path}: {exc.strerror or exc}") from None
    except (EOFError, zlib.error) as exc:
        raise DemandError(f"--demand {source}: {path} is not a whole gzip file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise DemandError(
            f"--demand {source}: {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); "
            f"accepted: a CSV or JSON file, plain or gzip-compressed"
        ) from None


def _sacct_live(ctx, site: Site, days: float) -> Demand:
    from ..slurm.sacct import SacctSource
    from .common import get_now, get_runner

    until = get_now(ctx)
    records = SacctSource(get_runner(ctx)).records(until - days * 86400, until)
    return from_job_records(records, units_of(site), f"live, last {days:g} days")


def policy_yaml(raw: dict) -> str:
    return yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, width=120)


def policy_diff(before: dict, after: dict, name: str) -> str:
    a, b = policy_yaml(before).splitlines(keepends=True), policy_yaml(after).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"{name} (as read)", f"{name} (planned)"))


class PlanCommand(click.Command):
    """`gpushare plan`; `plan --live [--json] [--apply [--every S]]`, kept for one release, runs `gpushare live
    report` or `gpushare live apply` with the other arguments, after a one-line deprecation note on stderr."""

    def make_context(self, info_name, args, parent=None, **extra):
        if "--live" not in args:
            return super().make_context(info_name, args, parent=parent, **extra)
        from .live import live

        sub = "apply" if "--apply" in args else "report"
        click.echo(
            f"gpushare plan --live is deprecated and goes in the next release: use gpushare live {sub}", err=True
        )
        rest = [a for a in args if a not in ("--live", "--apply")]
        return live.make_context("live", [sub, *rest], parent=parent, **extra)


@click.command("plan", cls=PlanCommand)
@click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The site policy whose hardware (node groups, GPU models) is planned for.",
)
@click.option("--demand", "source", metavar="SOURCE", required=True, help=f"Where the workload comes from: {FORMS}.")
@SLURM_BACKEND
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the planned policy here (YAML).")
@click.option(
    "--isolate-qos",
    multiple=True,
    metavar="QOS",
    help="Fractional jobs of this QoS get MIG slices of their own (repeatable; needs MIG-capable GPUs).",
)
@click.option("--mig-fractions", is_flag=True, help="Every fractional job gets a MIG slice (no MPS).")
@click.option(
    "--evaluate/--no-evaluate",
    default=True,
    show_default=True,
    help="Search the planner's choices (pool sizes, CPU bounds, weights, routes), scoring each candidate "
    "with the Slurm placement model on sampled arrivals, and race the best on more arrivals.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=BUDGET_S,
    show_default=True,
    metavar="SECONDS",
    help="Time for planning with --evaluate: when it has gone the best so far is kept (the report says "
    "so). 0: no limit, the search runs to its end.",
)
@click.option("--days", default=30.0, show_default=True, help="With sacct:live: how many days of history to read.")
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Processes that score the candidates side by side (default: the CPUs this process may use, at "
    "most 4). With --budget 0 the plan is the same for any N; under a budget more processes search "
    "further in the same time.",
)
@click.pass_context
def plan(
    ctx,
    policy_path: Path,
    source: str,
    out: Path | None,
    isolate_qos,
    mig_fractions: bool,
    evaluate: bool,
    days: float,
    budget: float,
    jobs: int | None,
) -> None:
    """Choose each GPU's sharing mode, node weights and class routing from the workload.

    Reads the demand (request classes: GPUs, per-GPU share, CPUs, memory,
    QoS, GPU type) from SOURCE, plans on the hardware of --policy, and prints
    a report that explains each choice (demand by class, supply per tier,
    expected stranded capacity) and the unified diff of the policy. With
    --out the planned policy is written there (comments of the original are
    not kept); check it with `gpushare validate` and render it with
    `gpushare render`.

    SOURCE: openb:FILE.csv (an openb pod list, the FGD paper's trace format),
    sacct:FILE (a recorded `sacct -a -X -P -o ...` or `sacct --json`),
    squeue:FILE (a recorded `squeue --json`: the pending jobs), or sacct:live
    (the last --days of this cluster's history).

    For the cluster as it is now (the queue, and changes of layouts, modes
    and weights for it), see `gpushare live`.
    """
    from ..planner.evaluate import evaluator
    from ..planner.plan import plan as make_plan

    site = load_file(policy_path)
    raw = parse_yaml(policy_path.read_text(encoding="utf-8"), policy_path.name)
    assert isinstance(raw, dict), "load_file has read the policy as a mapping"
    demand = read_demand(source, site, ctx, days)
    if not demand.jobs:
        raise DemandError(f"--demand {source}: no jobs found; nothing to plan for")
    try:
        result = make_plan(
            raw,
            demand,
            isolate_qos=isolate_qos,
            mig_fractions=mig_fractions,
            evaluate=evaluator(demand, workers=jobs or _cpus(4)) if evaluate else None,
            budget_s=budget or None,
        )
    except ValueError as exc:
        raise GpushareError(f"cannot plan: {exc}") from None
    click.echo("\n".join(result.report))
    click.echo("")
    diff = policy_diff(raw, result.policy, policy_path.name)
    click.echo(diff if diff else "(the planned policy is the policy as read)", nl=not diff)
    if out:
        atomic_write(out, "# Planned by `gpushare plan` from " + source + "\n" + policy_yaml(result.policy))
        click.echo(f"wrote {out}")


def _cpus(most: int) -> int:
    """The CPUs this process may run on (its affinity mask), at most ``most``."""
    import os

    try:
        return max(1, min(most, len(os.sched_getaffinity(0))))
    except AttributeError:  # no sched_getaffinity on this platform
        return max(1, min(most, os.cpu_count() or 1))


COMMANDS = (plan,)
__all__ = ["COMMANDS", "format_demand"]
