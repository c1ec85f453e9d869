"""`gpushare-node-health`: slurm.conf HealthCheckProgram (root, every HealthCheckInterval seconds).

slurmd passes no arguments: the node config (/etc/gpushare/node.yaml) names
the policy, and the cached node spec gives this node's GPUs without loading
the policy, as for the prolog. Node name: SLURMD_NODENAME when slurmd sets
it, else this host's short name. Exit 0 when the run decided (a drain is a
decision); 1, with one line on stderr, when it could not run at all.

A site's own health program (``cluster.health.site_program``, e.g. NHC) runs
first, with slurmd's environment: its output and exit code are printed as its
own (``site health program PATH: ...``), and the drains it makes carry its
own reasons, which ours never resumes (node/health.py). The exit code is ours
when ours failed, else the site program's. On a node outside the policy
(node.yaml ``outside_policy: yes``) only the site's program runs, the one
node.yaml names (``site_health_program``), with the same output and exit code.
"""

from __future__ import annotations

import os
import sys

SITE_TIMEOUT = 120.0  # seconds the site's health program may take (NHC's own default timeout is 30)


def run_site_program(program: str, environ, runner, out=print) -> int:
    """Run the site's health program; its lines and exit code are printed as its own. 0: it passed."""
    from ..proc import CommandError, run

    try:
        result = (runner or run)([program], check=False, timeout=SITE_TIMEOUT, env=environ)
    except CommandError as exc:  # could not start, or timed out
        out(f"site health program {program}: {exc}")
        return 1
    for line in (result.stdout + result.stderr).splitlines():
        out(f"site health program {program}: {line}")
    if result.returncode:
        out(f"site health program {program}: exited {result.returncode}")
    return result.returncode


def health(environ, runner=None, mps=None, kill=None, is_device=None, out=print, site_rc=None):
    import socket
    from pathlib import Path

    from ..gpu import open_backend
    from ..node.epilog import Killer
    from ..node.health import device_ok, run_health, slots_from_spec
    from ..node.jobenv import node_name_or_none, slurm_conf
    from ..node.mps import SAFE_PATH, MpsControl
    from ..node.nodeconfig import config_path, node_spec, read_config
    from ..proc import run
    from ..slurm.cli_backend import CliClient
    from ._common import mps_command

    node = node_name_or_none(environ) or socket.gethostname().split(".", 1)[0]
    config = read_config(config_path(environ))
    if config.outside_policy:
        return outside(node, config, environ, runner, out, site_rc)
    spec = node_spec(config, node)
    if spec.site_health_program:
        rc = run_site_program(spec.site_health_program, environ, runner, out)
        if site_rc is not None:
            site_rc.append(rc)
    env = {"PATH": SAFE_PATH}
    if slurm_conf(environ) is not None:
        env["SLURM_CONF"] = slurm_conf(environ)
    client = CliClient(runner or run, timeout=15, env=env)
    mps = mps or MpsControl(runner or run, **mps_command(config))
    with open_backend(config.fake_nvml_str) as backend:
        report = run_health(
            node,
            spec.state_dir,
            Path(spec.slurm_conf_dir) / "gres.conf",
            slots_from_spec(spec),
            client,
            backend,
            mps,
            Killer(backend, kill=kill),
            is_device or device_ok,
            metrics=spec,
        )
    for line in report.lines():
        out(line)
    return report


def outside(node: str, config, environ, runner, out, site_rc) -> None:
    """A node outside the policy (node.yaml ``outside_policy: yes``): the site's health program, when node.yaml
    names one, and nothing of ours (no GPU, no drain, no resume)."""
    program = config.site_health_program_str
    out(
        f"node {node}: outside the policy ({config.path_str}): no gpushare checks; "
        + (f"the site's health program {program} runs" if program else "no site health program")
    )
    if program:
        rc = run_site_program(program, environ, runner, out)
        if site_rc is not None:
            site_rc.append(rc)


def main(environ=None, runner=None, mps=None, kill=None, is_device=None) -> int:
    from ..errors import GpushareError

    environ = dict(os.environ if environ is None else environ)
    site_rc: list[int] = []
    try:
        health(environ, runner, mps, kill, is_device, site_rc=site_rc)
    except (GpushareError, OSError) as exc:  # an OSError names its path; the next run tries again
        print(f"gpushare-node-health: {exc}", file=sys.stderr)
        return 1
    return site_rc[0] if site_rc else 0
