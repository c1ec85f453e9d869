"""`gpushare check`: would job_submit.lua accept this job? Same rules, before submitting."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..policy import load_file
from ..policy.share import RECORD_PREFIX
from ..sitepolicy import describe, find_policy
from ..submit import Decision, build_tables, decide, script_options, split_options, to_job


@click.command()
@click.option(
    "--policy",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site policy (default: $GPUSHARE_POLICY, else /etc/gpushare/policy.yaml).",
)
@click.argument("args", nargs=-1, required=True, metavar="[SCRIPT]... [-- SBATCH-OPTION...]")
def check(policy: Path | None, args: tuple[str, ...]) -> None:
    """Check job scripts' #SBATCH lines, or sbatch options, against the submission policy.

    \b
      gpushare check job.sh more.sh
      gpushare check -- --gres=shard:2 -p notebook
      gpushare check job.sh -- -p scavenger    (command-line options win, as in sbatch)

    Prints the policy it used, then OK (with every change the submission
    filter would make: partition, GRES rewrite, QOS), or one line per
    violation: a stable code such as `OVER shard=2`, then the explanation.
    Exit 0 when every job would be accepted, 1 when any would be rejected.
    """
    path, how = find_policy(policy, os.environ)
    tables = build_tables(load_file(path))
    click.echo(describe(path, how))
    scripts, options = _split_args(args)
    jobs = [(str(p), script_options(Path(p)) + options) for p in scripts] or [("", options)]
    rejected = False
    for name, argv in jobs:
        decision = decide(tables, to_job(split_options(argv), tables.prefix))
        rejected |= not decision.accepted
        prefix = f"{name}: " if len(jobs) > 1 else ""
        for line in report_lines(decision):
            click.echo(prefix + line)
    if rejected:
        raise SystemExit(1)


def _split_args(args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Leading arguments are scripts; from the first one that starts with '-' on, sbatch options."""
    first = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    return list(args[:first]), list(args[first:])


def report_lines(decision: Decision) -> list[str]:
    if not decision.accepted:
        return [str(v) for v in decision.violations]
    changes = decision.all_changes
    if decision.qos_if_allowed:  # set_qos if-allowed: check cannot see the association's QOS, job_submit.lua can
        changes = [*changes, f"qos={decision.qos_if_allowed} if your association may use it"]
    return [f"OK (would set {', '.join(changes)})" if changes else "OK", *per_job_lines(decision)]


def per_job_lines(decision: Decision) -> list[str]:
    """A per-job MIG slice, in the user's terms: what the rewrite means (the extra field holds the record)."""
    if not decision.extra or not decision.extra.startswith(RECORD_PREFIX):
        return []
    profile = decision.extra.removeprefix(RECORD_PREFIX)
    return [
        f"  a {profile} MIG instance is made for this job when it starts, on the GPU Slurm gives it, and destroyed "
        f"when it ends; the shards are how Slurm counts the slice and {decision.extra} in the job's extra field "
        "records its profile (leave --extra unset)"
    ]


COMMANDS = (check,)
