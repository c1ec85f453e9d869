"""`gpushare install`: join the controller's slurm.conf directory (and `--rollback` to leave it)."""

from __future__ import annotations

from pathlib import Path

import click
from hostlist import collect_hostlist

from ..policy import load_file
from ..render import render_all
from ..siteconf.install import InstallError, execute_install, plan_install, read_site, rollback
from ..siteconf.merge import Options


def _policy_nodes(site) -> frozenset[str]:
    return frozenset(n for g in site.groups for n in g.nodes)


@click.command()
@click.argument("policy", required=False, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--slurm-conf-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The directory of slurm.conf (default: the policy's cluster.paths.slurm_conf_dir).",
)
@click.option("--dry-run", is_flag=True, help="Print every change and why; write nothing.")
@click.option(
    "--take-over",
    "take_over",
    multiple=True,
    metavar="KEY",
    help=(
        "Replace the site's value of KEY (a slurm.conf key, PartitionName=NAME, Default, or CloneNSScript of "
        "job_container.conf); repeatable."
    ),
)
@click.option("--force", is_flag=True, help="Take over every key, and replace files gpushare did not write.")
@click.option("--rollback", "undo", is_flag=True, help="Restore the files of the newest install, byte for byte.")
@click.option(
    "--gres-changes",
    is_flag=True,
    help=(
        "Print only the policy's nodes whose GRES the install changes (a hostlist, empty when none: drain them "
        "before the reconfigure) and write nothing."
    ),
)
def install(
    policy: Path | None,
    slurm_conf_dir: Path | None,
    dry_run: bool,
    take_over: tuple[str, ...],
    force: bool,
    undo: bool,
    gres_changes: bool,
) -> None:
    """Join the site's slurm.conf with the GPU part rendered from POLICY, keeping what the site set.

    Merges slurm.conf (it includes slurm-gpushare.conf; PrologFlags, AccountingStorageTRES, GresTypes,
    JobSubmitPlugins and SchedulerParameters are unions; the site's Prolog/Epilog keep running), keeps
    the site's partition options and nodes outside the policy, keeps gres.conf lines of nodes outside
    the policy, chains a site job_submit.lua (submission.site_lua), and adds gpushare-ns-caps to a site's
    job_container.conf for the policy's nodes. Reads the files slurm.conf includes as the site's (never
    edits them). Prints every change and why;
    refuses (exit 1, writing nothing) to replace a value the site set unless --take-over KEY. The
    original bytes of every file it changes go to DIR/.gpushare-backup/<time>/ for --rollback.
    """
    if undo:
        directory = slurm_conf_dir or (Path(load_file(policy).cluster.paths.slurm_conf_dir) if policy else None)
        if directory is None:
            raise click.UsageError("--rollback needs --slurm-conf-dir (or the policy)")
        for line in rollback(directory):
            click.echo(line)
        return
    if policy is None:
        raise click.UsageError("POLICY is required (the policy the cluster runs)")
    site = load_file(policy)
    directory = slurm_conf_dir or Path(site.cluster.paths.slurm_conf_dir)
    opts = Options(
        policy_nodes=_policy_nodes(site),
        take_over=frozenset(k.lower() for k in take_over),
        force=force,
        site_health=site.cluster.health.site_program,
    )
    plan = plan_install(site, render_all(site), directory, read_site(site, directory), opts)
    if gres_changes:
        click.echo(collect_hostlist(list(plan.gres_changed)) if plan.gres_changed else "")
        return
    for change in plan.changes:
        click.echo(str(change))
    for note in plan.notes:
        click.echo(f"note: {note}")
    if plan.refusals:
        raise InstallError("refused, nothing written:\n" + "\n".join(f"  {r}" for r in plan.refusals))
    _write(plan, directory, dry_run)


def _write(plan, directory: Path, dry_run: bool) -> None:
    if not plan.files:
        click.echo(f"{directory}: nothing to do")
        return
    names = ", ".join(sorted(plan.files))
    if dry_run:
        click.echo(f"would write: {names}")
        return
    backup = execute_install(plan, directory)
    click.echo(f"wrote: {names}")
    click.echo(f"originals in {backup}; `gpushare install --slurm-conf-dir {directory} --rollback` restores them")
    click.echo("then: scontrol reconfigure (or restart slurmctld and the slurmds where GRES changed)")


COMMANDS = (install,)
