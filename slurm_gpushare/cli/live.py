"""`gpushare plan --live --apply [--every SECONDS]`: carry out the live planner's proposals (cli/plan.py calls it).

One run (cron) or a loop every SECONDS (a systemd service); SIGTERM or
SIGINT ends the loop between runs, never inside one (a run holds the state
file's lock while it writes the live policy and submits a relayout job).
A run that fails (slurmctld unreachable, say) is printed and the loop goes
on; a one-shot run exits non-zero.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import click


def apply_live(ctx: click.Context, policy_path: Path, every: float | None, as_json: bool,
               node_config: str | None = None) -> None:
    from ..errors import GpushareError
    from ..live.apply import LiveApply
    from ..slurm.reservations import Reservations
    from .common import get_client, get_now, get_runner

    runner = get_runner(ctx)
    kw = {"node_config": node_config} if node_config else {}
    live = LiveApply(policy_path, get_client(ctx), Reservations(runner), clock=lambda: get_now(ctx), **kw)
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
                click.echo(f"gpushare plan --live --apply: this run failed: {exc}", err=True)
            stop.wait(every)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo("gpushare plan --live --apply: stopped", err=True)


def _show(report, as_json: bool) -> None:
    plan = report.plan
    if as_json:
        doc = plan.to_dict() if hasattr(plan, "to_dict") else {}
        click.echo(json.dumps({**doc, "applied": report.lines}, sort_keys=True))
        return
    if hasattr(plan, "report"):
        click.echo("\n".join(plan.report()))
    for line in report.lines:
        click.echo(f"apply: {line}")
    if not report.lines:
        click.echo("apply: nothing to do")


def read_steered(site) -> dict[str, int]:
    """node -> the weight the apply side set (its state file), for `gpushare plan --live` (report only)."""
    from ..live.apply import live_policy_path, state_path
    from ..live.state import StateFile

    return dict(StateFile(state_path(live_policy_path(site))).read().weights)


def read_state(client, site, now: float) -> tuple[dict[str, float], frozenset[str]]:
    """(node -> last change or attempt, nodes holding a gpushare-relayout reservation), as the apply side keeps
    them: for `gpushare plan --live` (report only), so it holds back what --apply would."""
    from ..live.apply import live_policy_path, state_path
    from ..live.state import StateFile
    from ..slurm.reservations import Reservations

    changes = StateFile(state_path(live_policy_path(site))).read().changes()
    runner = getattr(client, "runner", None)
    locks = frozenset(r.node for r in Reservations(runner).locks()) if runner is not None else frozenset()
    return changes, locks
