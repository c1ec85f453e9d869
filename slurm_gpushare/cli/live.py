"""`gpushare live`: the live planner on the cluster now: the report (`live report`, the default) and carrying its
proposals out (`live apply`, once for cron or `--every SECONDS` as a service).

`apply --every`: SIGTERM or SIGINT ends the loop between runs, never inside
one (a run holds the state file's lock while it writes the live policy and
submits a relayout job). A run that fails (slurmctld unreachable, say) is
printed and the loop goes on; a one-shot run exits non-zero.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import click

from ..errors import GpushareError
from ..live.apply import LiveApply, RunReport
from ..live.observe import Observation, observe, policy_file_of, state_path
from ..live.plan import plan_live
from ..live.report import LivePlan
from ..live.state import StateFile
from ..policy import load_file
from .common import SLURM_BACKEND, get_client, get_now

POLICY = click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The admin's site policy (its live: section); the cluster runs the live policy written "
    "from it when that file exists.",
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")


def look(ctx: click.Context, policy_path: Path) -> tuple[Observation, LivePlan]:
    """Read Slurm, the reservations and the apply side's state, and plan (report only: nothing changes)."""
    admin = load_file(policy_path)
    store = StateFile(state_path(policy_file_of(admin)))
    seen = observe(get_client(ctx), admin, policy_path, store, get_now(ctx))
    return seen, plan_live(seen.site, seen.view, seen.doc)


def report(ctx: click.Context, policy_path: Path, as_json: bool) -> None:
    seen, result = look(ctx, policy_path)
    live = seen.site.policy.live
    if as_json:
        click.echo(
            json.dumps(
                {"policy": str(seen.path), "now": seen.view.now, "enabled": live.enabled, **result.to_dict()}, indent=1
            )
        )
        return
    click.echo(
        f"policy: {seen.path}"
        + ("" if seen.path == policy_path else " (the live policy)")
        + ("" if live.enabled else "; live.enabled is false: report only, apply would refuse")
    )
    click.echo(
        f"limits: min_pending {live.min_pending} s, min_dwell {live.min_dwell} s, min_benefit_jobs "
        f"{live.min_benefit_jobs}, max_draining {live.max_draining} per tier, max_wait {live.max_wait} s, "
        f"change_cost {live.change_cost} s"
    )
    click.echo(
        f"history: {len({r.job_id for r in seen.view.history})} GPU job(s) ended in the last "
        f"{live.history_window} s (live.history_window); modes: "
        f"{'planned' if live.modes else 'not planned (live.modes false)'}; weights: "
        f"{'planned' if live.weights else 'not planned (live.weights false)'}"
    )
    click.echo("\n".join(result.report()))


def apply(ctx: click.Context, policy_path: Path, every: float | None, as_json: bool) -> None:
    live = LiveApply(policy_path, get_client(ctx), clock=lambda: get_now(ctx))
    if every is None:
        _show(live.run_once(), as_json)
        return
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set():
            try:
                _show(live.run_once(), as_json)
            except GpushareError as exc:
                click.echo(f"gpushare live apply: this run failed: {exc}", err=True)
            stop.wait(every)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo("gpushare live apply: stopped", err=True)


def _show(run: RunReport, as_json: bool) -> None:
    plan = run.plan
    assert plan is not None, "run_once returns a report with its plan"
    if as_json:
        click.echo(json.dumps({**plan.to_dict(), "applied": run.lines}, sort_keys=True))
        return
    click.echo("\n".join(plan.report()))
    for line in run.lines:
        click.echo(f"apply: {line}")
    if not run.lines:
        click.echo("apply: nothing to do")


REPORT_HELP = """Which GPUs should change MIG layout or sharing mode, or which node weights, for the queue now.

Reads the pending jobs (typed GRES, reason, age, priority), the running GPU
jobs with their end times (time limits), the nodes and the jobs that ended
within live.history_window (sacct) through the Slurm client, with the
policy the cluster runs (the live policy file when it exists, else
--policy). Prints the demand per GPU type, one line per proposed change of
a node: a MIG relayout, or a change of GPU modes (exclusive, mps, shard,
with the settings the site uses on that GPU model; live.modes) (who waits,
which GPU changes to what, how many jobs it lets start, and its cost: the
node's GPU jobs that must finish first, since Slurm requeues every job
holding GRES on a node whose GRES change, plus live.change_cost of drain
and re-registration) and the changes held back with why: the policy's
live: limits (min_dwell, min_benefit_jobs, max_draining, max_wait), or the
recent history (the jobs of a type a change takes away, at their recent
rate over min_dwell, count against it). With live.weights, it also
proposes node weights that keep small jobs off the node a blocked
multi-GPU job needs (scontrol update, no drain). Changes nothing.
"""


@click.group("live", invoke_without_command=True)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="With no command: the report for this policy (as `live report --policy`).",
)
@click.option("--json", "as_json", is_flag=True, help="With no command: the report as JSON.")
@SLURM_BACKEND
@click.pass_context
def live(ctx: click.Context, policy_path: Path | None, as_json: bool) -> None:
    """The live planner on the cluster now: which GPUs should change MIG layout or sharing mode, or which node
    weights, for the jobs pending now (`report`, the default), and carrying that out (`apply`).

    Docs: docs/admins/live-planner.md, live-apply.md, live-loop.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    if policy_path is None:
        raise click.UsageError("give --policy FILE (the report), or a command: report, apply")
    report(ctx, policy_path, as_json)


@live.command("report", help=REPORT_HELP)
@POLICY
@JSON
@SLURM_BACKEND
@click.pass_context
def report_command(ctx: click.Context, policy_path: Path, as_json: bool) -> None:
    report(ctx, policy_path, as_json)


@live.command("apply")
@POLICY
@click.option(
    "--every",
    type=click.FloatRange(1),
    default=None,
    metavar="SECONDS",
    help="Run again every SECONDS until SIGTERM (a service); default: once (cron).",
)
@click.option("--json", "as_json", is_flag=True, help="Print each run's plan and what it did as JSON.")
@SLURM_BACKEND
@click.pass_context
def apply_command(ctx: click.Context, policy_path: Path, every: float | None, as_json: bool) -> None:
    """Carry the live planner's proposals out (needs live.enabled; docs/admins/live-apply.md).

    Locks the node with a Slurm reservation and relayouts it (MIG layout or
    GPU modes) by a root job once its GPU jobs end; a node weight by scontrol
    update. Once (for cron), or with --every SECONDS as a service.
    """
    apply(ctx, policy_path, every, as_json)


COMMANDS = (live,)
