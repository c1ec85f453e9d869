"""`gpushare exporter`: the Prometheus exporter of the controller's view (metrics/). Thin: options, wiring, serve."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from ..errors import GpushareError
from ..policy import load_file
from ..slurm.cli_backend import SlurmClientError
from .usage import SLURM_BACKEND, _obj, get_client

_POLICY = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("exporter")
@click.option("--policy", required=True, type=_POLICY,
              help="Site policy (e.g. /etc/gpushare/policy.yaml): GPU-equivalent fractions, MIG types, tiers, cluster name.")
@click.option("--listen", default="0.0.0.0:9877", show_default=True, metavar="ADDR:PORT",
              help="Where to serve /metrics ([::]:PORT for IPv6).")
@click.option("--once", is_flag=True,
              help="Scrape once, print the exposition text to stdout and exit (cron, debugging, tests); "
                   "exit status 1 if a part could not be read.")
@SLURM_BACKEND
@click.pass_context
def exporter(ctx, policy, listen, once) -> None:
    """Serve Slurm's GPU sharing state as Prometheus metrics.

    Run it on the controller or a login node, as a user that may run
    squeue, scontrol, sshare and sacctmgr (sshare shows every association
    only to an operator). Each scrape reads Slurm once: jobs, nodes, sshare
    and associations. A part that fails is counted in
    gpushare_exporter_scrape_errors_total{part} and the rest is still served.

    \b
    Metrics (all gauges but the error counter; README "Metrics" has the table):
      gpushare_gpu_equivalents_allocated{tenant,user,tier,kind,gres_type}
      gpushare_gres_configured|allocated|free{node,gres,gres_type}
      gpushare_node_info{node,state,reason}, gpushare_node_drained{node,reason}
      gpushare_jobs_pending / gpushare_pending_gpu_equivalents{gres,gres_type,reason}
      gpushare_pending_oldest_age_seconds{gres,gres_type}
      gpushare_stranded_units{node,gres,gres_type}
      gpushare_fairshare_level_fs / gpushare_fairshare_factor{account,user}
      gpushare_quota_used / gpushare_quota_limit{account,tres}
      gpushare_exporter_scrape_duration_seconds, gpushare_exporter_last_scrape_success,
      gpushare_exporter_scrape_errors_total{part}

    \b
    Examples:
      gpushare exporter --policy /etc/gpushare/policy.yaml
      gpushare exporter --policy etc/small-lab.yaml --listen 127.0.0.1:9877 --slurm-backend pyslurm
      gpushare exporter --policy etc/small-lab.yaml --once
    """
    from ..metrics.exporter import SlurmCollector, exposition, parse_listen, registry_for, serve

    try:
        addr, port = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    site = load_file(policy)
    obj = _obj(ctx)
    collector = SlurmCollector(get_client(ctx), site, clock=obj.get("clock", time.time))
    registry = registry_for(collector)
    if once:
        click.echo(exposition(registry), nl=False)
        failed = [part for part, n in collector.errors.items() if n]
        if failed:
            raise SlurmClientError(f"--once: could not read {', '.join(failed)} from Slurm (the metrics of the other "
                                "parts were printed; the warnings above say why)")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        serve(registry, addr, port)
    except OSError as exc:
        raise GpushareError(f"--listen {listen}: cannot serve there: {exc.strerror or exc}") from None
    click.echo(f"gpushare exporter: serving http://{addr}:{port}/metrics (policy {policy}, "
               f"Slurm backend {collector.client.backend})", err=True)
    while True:
        time.sleep(3600)


COMMANDS = (exporter,)
