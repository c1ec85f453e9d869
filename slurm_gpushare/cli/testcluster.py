"""`gpushare testcluster`: the dockerized Slurm test cluster (needs the source checkout: testcluster/checkout.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import examples
from ..testcluster.checkout import CHECKOUT_ENV, find_checkout
from ..testcluster.cluster import TestCluster

PROJECT_ENV = "GPUSHARE_TESTCLUSTER_PROJECT"
_PROJECT = click.option(
    "--project",
    default="lab",
    show_default=True,
    envvar=PROJECT_ENV,
    help=f"docker-compose project name (env {PROJECT_ENV}).",
)
_SUITE = click.option(
    "--suite",
    type=click.Choice(["trixie", "sid"]),
    default="trixie",
    show_default=True,
    help="Debian suite of the Slurm image: trixie = Slurm 24.11, sid = 26.05.",
)
_POLICY = click.option(
    "--policy",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Site policy (default: the bundled small lab).",
)


def _cluster(policy: Path | None, project: str, suite: str) -> TestCluster:
    checkout = find_checkout()
    if checkout is None:
        raise click.ClickException(
            f"no slurm-gpushare source checkout in {Path.cwd()}, above it, or in {CHECKOUT_ENV}: the test cluster's "
            "Dockerfiles and compose file are not in the wheel; run this in the checkout you installed from, "
            f"or set {CHECKOUT_ENV}=/path/to/checkout"
        )
    return TestCluster(policy or examples.example(), project=project, suite=suite, docker_dir=checkout / "docker")


@click.group()
def testcluster() -> None:
    """Bring a real Slurm cluster (slurmctld, slurmdbd, MariaDB, fake-GPU nodes) up in docker from a policy.

    Every node of the policy becomes a container; the configuration is
    `gpushare render`'s output. See docker/README.md.
    """


@testcluster.command()
@_POLICY
@_PROJECT
@_SUITE
@click.option("--build/--no-build", default=True, show_default=True, help="Build the images first (idempotent).")
@click.option(
    "--prometheus",
    is_flag=True,
    help="Add a Prometheus server (service prometheus) scraping `gpushare exporter`, started in slurmctld, "
    "and every node's node_exporter.",
)
def up(policy, project, suite, build, prometheus) -> None:
    """Build the images, render the policy, start the cluster and wait until every node is idle."""
    c = _cluster(policy, project, suite)
    c.prometheus = prometheus
    if build:
        c.build()
    c.up()
    c.wait_idle(timeout=240)
    c.slurm(["gpushare", "accounts", "apply", "/etc/gpushare/policy.yaml"], timeout=120)
    extra = ""
    if prometheus:
        c.start_exporter()
        extra = (
            "; gpushare exporter started in slurmctld, Prometheus in service prometheus (:9090 on the cluster network)"
        )
    click.echo(f"cluster {project} is up: {', '.join(c.nodes())} idle; accounts applied{extra}")


@testcluster.command(context_settings={"ignore_unknown_options": True})
@_POLICY
@_PROJECT
@click.option("--user", help="Run as this user (e.g. alice).")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run(policy, project, user, argv) -> None:
    """Run a command in slurmctld, e.g. `gpushare testcluster run --user alice -- sbatch ...`."""
    res = _cluster(policy, project, "trixie").slurm(list(argv), user=user, check=False, timeout=600)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    sys.exit(res.returncode)


@testcluster.command()
@_POLICY
@_PROJECT
def down(policy, project) -> None:
    """Stop the cluster and remove its containers, network and volumes."""
    _cluster(policy, project, "trixie").down()
    click.echo(f"cluster {project} removed")


COMMANDS = (testcluster,)
