"""`gpushare slurm dump`: the Slurm client's normalised view as JSON (what the contract tests compare)."""

from __future__ import annotations

import json

import click

from .common import SLURM_BACKEND, get_client, get_now, parse_when

PARTS = ("jobs", "nodes", "partitions", "associations", "usage")
CHOICES = PARTS + ("job-summaries",)  # only when asked: the jobs as the exporter reads them (no device indexes)


@click.group("slurm")
def slurm() -> None:
    """Read Slurm through the product's client (the same reads the node runtime and reports use)."""


@slurm.command("dump")
@click.option(
    "--part",
    "parts",
    multiple=True,
    type=click.Choice(CHOICES),
    help="What to read (repeatable; default: all but job-summaries). usage needs --since.",
)
@click.option("--cluster", help="Associations of this cluster only (default: all clusters).")
@click.option("--since", help="usage: sacct records of jobs that ran after this (now, 7d, 12h, an ISO time).")
@click.option("--until", default="now", show_default=True, help="usage: window end.")
@SLURM_BACKEND
@click.pass_context
def dump(ctx, parts, cluster, since, until) -> None:
    """Print jobs, nodes, partitions, associations and usage records as one JSON object, sorted.

    Machine-readable and backend-independent: `--slurm-backend cli` and
    `--slurm-backend pyslurm` print the same document (but for "backend")
    on the same Slurm state. Shapes: slurm_gpushare/slurm/model.py.
    """
    from ..slurm.client import dump as read

    if "usage" in parts and since is None:
        raise click.UsageError("--part usage needs --since")
    parts = parts or PARTS
    window = None
    if since is not None:
        hi = parse_when(until, get_now(ctx))
        window = (parse_when(since, hi), hi)
    doc = read(get_client(ctx), cluster=cluster, usage_window=window, parts=parts)
    click.echo(json.dumps(doc, indent=1, sort_keys=True))


COMMANDS = (slurm,)
