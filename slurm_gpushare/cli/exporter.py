"""`gpushare exporter`: the Prometheus exporter of the controller's view (metrics/). Thin: options, wiring, serve."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from ..errors import GpushareError
from ..metrics.defaults import DEFAULT_INTERVAL, DEFAULT_LISTEN, DEFAULT_TIMEOUT
from ..policy import load_file
from ..slurm.cli_backend import SlurmClientError
from ..slurm.client import make_client
from .common import SLURM_BACKEND, context_obj, get_runner

_POLICY = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("exporter")
@click.option(
    "--policy",
    required=True,
    type=_POLICY,
    help="Site policy (e.g. /etc/gpushare/policy.yaml): GPU-equivalent fractions, MIG types, tiers, cluster name.",
)
@click.option(
    "--web.listen-address",
    "listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="ADDR:PORT",
    help="Where to serve /metrics. The default is this host only, on port 9877 (:9877: every IPv4 "
    "interface; [::]:9877: IPv6). Beyond loopback it needs a --web.config.file with TLS, or "
    "--web.insecure-plain-http.",
)
@click.option("--listen", "listen_old", metavar="ADDR:PORT", hidden=True, help="Former name of --web.listen-address.")
@click.option(
    "--web.config.file",
    "web_config",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="TLS, client certificates and basic auth, in Prometheus' exporter-toolkit web configuration "
    "format (as node_exporter's --web.config.file). Default: plain HTTP, no authentication.",
)
@click.option(
    "--web.insecure-plain-http",
    "insecure",
    is_flag=True,
    help="Serve plain HTTP on a --web.listen-address beyond loopback (without TLS every client on the "
    "network can read the metrics, and a basic-auth password goes in the clear). Without it such "
    "an address is refused unless the web config has tls_server_config.",
)
@click.option(
    "--slurm.read-interval",
    "read_interval",
    type=click.FloatRange(min=0),
    default=DEFAULT_INTERVAL,
    show_default=True,
    metavar="SECONDS",
    help="Read Slurm at most once per this many seconds: every scrape in between, however many, gets "
    "the same snapshot; scrapes that come during a read wait for it.",
)
@click.option(
    "--slurm.timeout",
    "slurm_timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="The most one Slurm command may run (it is killed then); a whole read of Slurm at most 4 "
    "times this. A scrape waits for a read at most the scrape timeout Prometheus sends "
    "(X-Prometheus-Scrape-Timeout-Seconds), which bounds that scrape only, never the read.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Scrape once, print the exposition text to stdout and exit (cron, debugging, tests); "
    "exit status 1 if a part could not be read.",
)
@SLURM_BACKEND
@click.pass_context
def exporter(ctx, policy, listen, listen_old, web_config, insecure, read_interval, slurm_timeout, once) -> None:
    """Serve Slurm's GPU sharing state as Prometheus metrics.

    Run it on the controller or a login node, as a user that may run
    squeue, scontrol, sshare and sacctmgr (sshare shows every association
    only to an operator). A read of Slurm has four parts: jobs, nodes,
    sshare and associations; it happens at most once per
    --slurm.read-interval, whatever the number of scrapers. A part that
    fails is counted in gpushare_exporter_scrape_errors_total{part} and the
    rest is still served, each failed part from its last good read with
    its age (gpushare_exporter_part_age_seconds{part}). It listens on
    127.0.0.1 unless told otherwise; on a network give it a
    --web.config.file with TLS and basic auth (docs/admins/exporter.md).

    \b
    Metrics (all gauges but the counters; docs/admins/exporter.md has the list):
      gpushare_gpu_equivalents_allocated{tenant,user,tier,kind,gres_type}
      gpushare_gres_configured|allocated|free{node,gres,gres_type}
      gpushare_node_info{node,state,reason}, gpushare_node_drained{node,reason}
      gpushare_jobs_pending / gpushare_pending_gpu_equivalents{gres,gres_type,reason}
      gpushare_pending_oldest_age_seconds{gres,gres_type}
      gpushare_stranded_units{node,gres,gres_type}
      gpushare_fairshare_level_fs / gpushare_fairshare_factor{account,user}
      gpushare_quota_used / gpushare_quota_limit{account,tres}
      gpushare_exporter_scrape_duration_seconds, gpushare_exporter_last_scrape_success,
      gpushare_exporter_snapshot_timestamp_seconds, gpushare_exporter_slurm_reads_total,
      gpushare_exporter_scrape_errors_total{part}, gpushare_exporter_part_age_seconds{part}

    \b
    Examples:
      gpushare exporter --policy /etc/gpushare/policy.yaml --web.listen-address :9877 \
          --web.config.file /etc/gpushare/web.yml
      gpushare exporter --policy etc/small-lab.yaml --slurm-backend pyslurm
      gpushare exporter --policy etc/small-lab.yaml --once
    """
    from ..metrics.exporter import CommandTimeouts, SlurmCollector, exposition, registry_for

    option, addr, port, web = _where(listen, listen_old, web_config, insecure, once)
    site = load_file(policy)
    obj = context_obj(ctx)
    timeouts = CommandTimeouts(get_runner(ctx), slurm_timeout)
    client = make_client(ctx.meta.get("gpushare.slurm_backend"), timeouts)
    collector = SlurmCollector(client, site, clock=obj.get("clock", time.time))
    if once:
        return _once(collector, exposition(registry_for(collector)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = _serve(collector, timeouts, web, addr, port, read_interval, option)
    scheme = "https" if web and web.tls else "http"
    auth = f", basic auth for {len(web.users)} user(s)" if web and web.users else ""
    click.echo(
        f"gpushare exporter: serving {scheme}://{listen_old or listen}/metrics{auth} (policy {policy}, "
        f"Slurm backend {collector.client.backend}, one read per {read_interval:g} s)",
        err=True,
    )
    server.serve_forever()


def _where(listen: str, listen_old: str | None, web_config: Path | None, insecure: bool, once: bool):
    """(the listen option's name, address, port, web config or None); refuses plain HTTP beyond loopback
    unless asked for (or --once, which serves nothing)."""
    from ..metrics import webconfig
    from ..metrics.exporter import parse_listen, plain_http_problem

    option = "--listen" if listen_old else "--web.listen-address"
    try:
        addr, port = parse_listen(listen_old or listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    web = webconfig.load(web_config) if web_config else None
    problem = None if once else plain_http_problem(addr, port, web, insecure)
    if problem:
        raise click.UsageError(problem)
    return option, addr, port, web


def _once(collector, text: str) -> None:
    click.echo(text, nl=False)
    failed = [part for part, n in collector.errors.items() if n]
    if failed:
        raise SlurmClientError(
            f"--once: could not read {', '.join(failed)} from Slurm (the metrics of the other "
            "parts were printed; the warnings above say why)"
        )


def _serve(collector, timeouts, web, addr: str, port: int, interval: float, option: str):
    from ..metrics.exporter import Exporter, ExporterServer, SharedSnapshot
    from ..metrics.webconfig import ssl_context

    snapshot = SharedSnapshot(collector, interval, timeouts=timeouts, read_budget=4 * timeouts.limit)
    exporter = Exporter(snapshot, web, wait=4 * timeouts.limit)
    tls = web.tls if web else None
    try:
        return ExporterServer(addr, port, exporter, ssl_context(tls) if tls else None, tls)
    except OSError as exc:
        raise GpushareError(f"{option} {addr}:{port}: cannot serve there: {exc.strerror or exc}") from None


COMMANDS = (exporter,)
