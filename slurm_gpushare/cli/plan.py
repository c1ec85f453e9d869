"""`gpushare plan`: choose the sharing layout, node weights and class routing from the workload."""

from __future__ import annotations

import difflib
from pathlib import Path

import click
import yaml

from ..atomic import atomic_write
from ..errors import GpushareError
from ..planner.demand import Demand, DemandError, Units, format_demand, from_job_records, from_openb, from_squeue_json
from ..policy import Site, load_file
from ..policy.load import parse_yaml
from .common import SLURM_BACKEND

FORMS = "openb:FILE.csv, sacct:FILE (recorded sacct --json or --parsable2), squeue:FILE (squeue --json), sacct:live"


def units_of(site: Site) -> Units:
    """How this site's GRES counts read as GPU shares (for sacct/squeue demand)."""
    mps = max((s.units for g in site.groups for s in g.gpus if s.mode == "mps"), default=100)
    shard = max((s.replicas for g in site.groups for s in g.gpus if s.mode == "shard"), default=1)
    mig = {}
    for g in site.groups:
        for s in g.slots("mig"):
            for p in s.layout:
                mig[s.model.mig_slurm_type(p)] = round(1000 * s.model.profile(p).fraction(s.model))
    return Units(mps=mps, shard=shard, type_milli=mig)


def read_demand(source: str, site: Site, ctx: click.Context | None = None, days: float = 30.0) -> Demand:
    kind, sep, where = source.partition(":")
    if not sep or not where:
        raise GpushareError(f"--demand {source!r}: write KIND:WHERE, one of {FORMS}")
    if kind == "sacct" and where == "live":
        return _sacct_live(ctx, site, days)
    path = Path(where)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DemandError(f"--demand {source}: cannot read {path}: {exc.strerror}") from None
    if kind == "openb":
        return from_openb(text, path.name)
    if kind == "squeue":
        return from_squeue_json(text, units_of(site), path.name)
    if kind == "sacct":
        from ..slurm.sacct import open_records

        return from_job_records(open_records(path), units_of(site), path.name)
    raise GpushareError(f"--demand {source!r}: unknown kind {kind!r}; accepted: {FORMS}")


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


def live_state(client, site: Site, now: float) -> tuple[dict[str, float], frozenset[str]]:
    """Each node's last relayout (or attempt) time and the nodes under relayout (gpushare-relayout-<node>
    reservations), as the apply side records them: ``slurm_gpushare.cli.live.read_state(client, site, now)``
    when that module has it; otherwise none known (plan_live still sees nodes drained 'gpushare relayout...')."""
    try:
        from . import live as apply_side
    except ImportError:
        return {}, frozenset()
    read = getattr(apply_side, "read_state", None)
    return read(client, site, now) if read else ({}, frozenset())


def live_policy(policy_path: Path) -> tuple[Site, dict, Path]:
    """The policy the cluster runs: the live policy (``live.policy_file`` of --policy, default
    gpushare-live.yaml beside slurm.conf) when that file exists, else --policy itself; (site, document, path)."""
    from ..live.plan import live_policy_path

    admin = load_file(policy_path)
    path = Path(live_policy_path(admin))
    if not path.is_file():
        path = policy_path
    site = admin if path == policy_path else load_file(path)
    return site, parse_yaml(path.read_text(encoding="utf-8"), path.name), path


def live_plan(ctx: click.Context, policy_path: Path):
    """Read Slurm through the client and plan: (site, document, policy path, snapshot, LivePlan). The report
    (`plan --live`) prints it; the apply side (--apply/--every) acts on it."""
    from ..live.plan import plan_live, snapshot_from_client
    from .common import get_client, get_now

    site, doc, path = live_policy(policy_path)
    client, now = get_client(ctx), get_now(ctx)
    changes, locked = live_state(client, site, now)
    snap = snapshot_from_client(client, site, now, changes, locked)
    from . import live as apply_side

    steered = apply_side.read_steered(site)
    if steered:  # the weights --apply set: the report says when they go back to the policy's
        from dataclasses import replace

        snap = replace(snap, steered=steered)
    return site, doc, path, snap, plan_live(site, snap, doc)


def live_report(ctx: click.Context, policy_path: Path, as_json: bool) -> None:
    import json

    site, _doc, path, snap, result = live_plan(ctx, policy_path)
    if as_json:
        click.echo(json.dumps({"policy": str(path), "now": snap.now, "enabled": site.policy.live.enabled,
                               **result.to_dict()}, indent=1))
        return
    live = site.policy.live
    click.echo(f"policy: {path}" + ("" if path == policy_path else " (the live policy)")
               + ("" if live.enabled else "; live.enabled is false: report only, --apply would refuse"))
    click.echo(f"limits: min_pending {live.min_pending} s, min_dwell {live.min_dwell} s, min_benefit_jobs "
               f"{live.min_benefit_jobs}, max_draining {live.max_draining} per tier, max_wait {live.max_wait} s, "
               f"change_cost {live.change_cost} s")
    click.echo(f"history: {len({r.job_id for r in snap.history})} GPU job(s) ended in the last "
               f"{live.history_window} s (live.history_window); modes: "
               f"{'planned' if live.modes else 'not planned (live.modes false)'}; weights: "
               f"{'planned' if live.weights else 'not planned (live.weights false)'}")
    click.echo("\n".join(result.report()))


@click.command("plan")
@click.option("--policy", "policy_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The site policy whose hardware (node groups, GPU models) is planned for.")
@click.option("--demand", "source", metavar="SOURCE", help=f"Where the workload comes from: {FORMS}.")
@click.option("--live", is_flag=True,
              help="Plan on the live cluster instead: read the pending queue, running jobs, nodes and recent "
                   "history (sacct) through the Slurm client and report which GPUs should change MIG layout or "
                   "sharing mode, or node weights, now (see below). Changes nothing without --apply.")
@click.option("--json", "as_json", is_flag=True, help="With --live: print the plan as JSON.")
@click.option("--apply", "apply_", is_flag=True, help="With --live: carry the proposals out (needs live.enabled; "
              "README, 'Carrying a proposal out'): lock the node with a Slurm reservation, relayout it (MIG "
              "layout or GPU modes) by a root job once its GPU jobs end; a node weight by scontrol update.")
@click.option("--every", type=click.FloatRange(1), default=None, metavar="SECONDS",
              help="With --live --apply: run again every SECONDS until SIGTERM (a service); default: once (cron).")
@SLURM_BACKEND
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the planned policy here (YAML).")
@click.option("--isolate-qos", multiple=True, metavar="QOS",
              help="Fractional jobs of this QoS get MIG slices of their own (repeatable; needs MIG-capable GPUs).")
@click.option("--mig-fractions", is_flag=True, help="Every fractional job gets a MIG slice (no MPS).")
@click.option("--evaluate/--no-evaluate", default=True, show_default=True,
              help="Score a few candidate pool sizes with the Slurm placement model on sampled arrivals, keep the best.")
@click.option("--days", default=30.0, show_default=True, help="With sacct:live: how many days of history to read.")
@click.pass_context
def plan(ctx, policy_path: Path, source: str | None, live: bool, as_json: bool, apply_: bool, every: float | None,
         out: Path | None, isolate_qos, mig_fractions: bool, evaluate: bool, days: float) -> None:
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

    --live (instead of --demand): plan on the cluster as it is now. Reads
    the pending jobs (typed GRES, reason, age, priority), the running GPU
    jobs with their end times (time limits), the nodes and the jobs that
    ended within live.history_window (sacct) through the Slurm client, with
    the policy the cluster runs (the live policy file when it exists, else
    --policy). Prints the demand per GPU type, one line per proposed change
    of a node: a MIG relayout, or a change of GPU modes (exclusive, mps,
    shard, with the settings the site uses on that GPU model; live.modes)
    (who waits, which GPU changes to what, how many jobs it lets start, and
    its cost: the node's GPU jobs that must finish first, since Slurm
    requeues every job holding GRES on a node whose GRES change, plus
    live.change_cost of drain and re-registration) and the changes held
    back with why: the policy's live: limits (min_dwell, min_benefit_jobs,
    max_draining, max_wait), or the recent history (the jobs of a type a
    change takes away, at their recent rate over min_dwell, count against
    it). With live.weights, it also proposes node weights that keep small
    jobs off the node a blocked multi-GPU job needs (scontrol update, no
    drain). Changes nothing.
    """
    if live:
        if source or out or isolate_qos or mig_fractions:
            raise click.UsageError("--live plans on the cluster's queue: it takes no --demand, --out, "
                                   "--isolate-qos or --mig-fractions")
        if apply_ or every is not None:
            from .live import apply_live

            if not apply_:
                raise click.UsageError("--every goes with --live --apply")
            apply_live(ctx, policy_path, every, as_json)
            return
        live_report(ctx, policy_path, as_json)
        return
    if apply_ or every is not None:
        raise click.UsageError("--apply and --every go with --live")
    if source is None:
        raise click.UsageError("give --demand SOURCE (a workload to plan for) or --live (the cluster now)")
    if as_json:
        raise click.UsageError("--json goes with --live")
    from ..planner.evaluate import evaluator
    from ..planner.plan import plan as make_plan

    site = load_file(policy_path)
    raw = parse_yaml(policy_path.read_text(encoding="utf-8"), policy_path.name)
    demand = read_demand(source, site, ctx, days)
    if not demand.jobs:
        raise DemandError(f"--demand {source}: no jobs found; nothing to plan for")
    try:
        result = make_plan(raw, demand, isolate_qos=isolate_qos, mig_fractions=mig_fractions,
                           evaluate=evaluator(demand) if evaluate else None)
    except ValueError as exc:
        raise GpushareError(f"cannot plan: {exc}") from None
    click.echo("\n".join(result.report))
    click.echo("")
    diff = policy_diff(raw, result.policy, policy_path.name)
    click.echo(diff if diff else "(the planned policy is the policy as read)", nl=not diff)
    if out:
        atomic_write(out, "# Planned by `gpushare plan` from " + source + "\n" + policy_yaml(result.policy))
        click.echo(f"wrote {out}")


COMMANDS = (plan,)
__all__ = ["COMMANDS", "format_demand"]
