"""accounts plan / apply: the policy's tenants and tiers as Slurm accounts, users and QOS."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import click

from ..accounting import tenants
from ..accounting.tenants import Current, plan, unmanaged
from ..errors import GpushareError
from ..policy import load_file
from ..slurm import sacctmgr
from .common import get_runner

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_POLICY = click.argument("policy", type=_FILE)
_CLUSTER = click.option("--cluster", help="Slurm cluster name (default: the policy's cluster.name).")


@click.group("accounts")
def accounts() -> None:
    """Slurm accounts (FairShare, GrpTRES quotas), users and tier QOS from the policy.

    `plan` shows the sacctmgr commands that would make slurmdbd match the
    policy; `apply` runs them and checks that nothing is left to do. Nothing
    is ever deleted: accounts, users and QOS the policy does not name are
    listed as unmanaged.
    """


@accounts.command("plan")
@_POLICY
@_CLUSTER
@click.option(
    "--assoc-file",
    type=_FILE,
    help="Recorded `sacctmgr -n -P show assoc format=account,user,parentname,fairshare,grptres`.",
)
@click.option(
    "--qos-file",
    type=_FILE,
    help="Recorded `sacctmgr -n -P show qos format=name,priority,preemptmode,usagefactor,preempt`.",
)
@click.pass_context
def plan_cmd(ctx, policy: Path, cluster: str | None, assoc_file: Path | None, qos_file: Path | None) -> None:
    """Print the sacctmgr commands that would make slurmdbd match POLICY (changes nothing)."""
    site = load_file(policy)
    cluster = cluster or site.cluster.name
    current = _current(ctx, cluster, assoc_file, qos_file)
    commands = plan(site, current, cluster=cluster)
    for argv in commands:
        click.echo(shlex.join(argv))
    if not commands:
        click.echo(f"# slurmdbd matches {policy.name}: nothing to do")
    for line in unmanaged(site, current):
        click.echo(f"# unmanaged (left alone): {line}")


@accounts.command("apply")
@_POLICY
@_CLUSTER
@click.pass_context
def apply_cmd(ctx, policy: Path, cluster: str | None) -> None:
    """Run the plan through sacctmgr, then read slurmdbd back and check nothing is left to do."""
    site = load_file(policy)
    cluster = cluster or site.cluster.name
    runner = get_runner(ctx)
    commands = plan(site, _current(ctx, cluster), cluster=cluster)
    for argv in commands:
        click.echo(f"running: {shlex.join(argv)}")
        sacctmgr.apply(runner, [argv])
    left = plan(site, _current(ctx, cluster), cluster=cluster)
    if left:
        raise GpushareError(
            f"slurmdbd still differs from {policy.name} after applying; next plan: {shlex.join(left[0])}"
        )
    click.echo(f"applied {len(commands)} command(s); slurmdbd matches {policy.name}")


def _current(ctx, cluster: str, assoc_file: Path | None = None, qos_file: Path | None = None) -> Current:
    if (assoc_file is None) != (qos_file is None):
        raise GpushareError("give both --assoc-file and --qos-file, or neither (then sacctmgr is asked)")
    if assoc_file is not None and qos_file is not None:
        assocs = sacctmgr.parse_assocs(io.StringIO(assoc_file.read_text()), source=str(assoc_file))
        qos = sacctmgr.parse_qos(io.StringIO(qos_file.read_text()), source=str(qos_file))
        return Current.from_rows(assocs, qos)
    from ..slurm.cli_backend import CliClient

    return tenants.read_current(CliClient(get_runner(ctx)), cluster)  # live: QOS access included
