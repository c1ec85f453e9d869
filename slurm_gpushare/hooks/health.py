"""`gpushare-node-health`: slurm.conf HealthCheckProgram (root, every HealthCheckInterval seconds).

slurmd passes no arguments: the node config (/etc/gpushare/node.yaml) names
the policy, and the cached node spec gives this node's GPUs without loading
the policy, as for the prolog. Node name: SLURMD_NODENAME when slurmd sets
it, else this host's short name. Exit 0 when the run decided (a drain is a
decision); 1, with one line on stderr, when it could not run at all.
"""

from __future__ import annotations

import os
import sys


def health(environ, runner=None, mps=None, kill=None, is_device=None, out=print):
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
    spec = node_spec(config, node)
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


def main(environ=None, runner=None, mps=None, kill=None, is_device=None) -> int:
    from ..errors import GpushareError

    environ = dict(os.environ if environ is None else environ)
    try:
        health(environ, runner, mps, kill, is_device)
    except (GpushareError, OSError) as exc:  # an OSError names its path; the next run tries again
        print(f"gpushare-node-health: {exc}", file=sys.stderr)
        return 1
    return 0
