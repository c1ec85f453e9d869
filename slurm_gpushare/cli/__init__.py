"""`gpushare`: one click group; each command group lives in its own module."""

from __future__ import annotations

import click

from .. import __version__
from .errors import ErrorsToExitCodes


@click.group(cls=ErrorsToExitCodes, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Share GPUs on Slurm from one site policy.

    Describe exclusive GPUs, MIG layouts, MPS and time-sliced shards once in a
    policy file (see etc/ for examples), check it with `gpushare validate`, and
    render slurm.conf, gres.conf and cgroup.conf from it with `gpushare render`.
    """


def _register() -> None:
    from . import (
        accounts,
        catalogue,
        check,
        config,
        exporter,
        install,
        live,
        node,
        offers,
        schema,
        slurm,
        testcluster,
        usage,
    )
    from . import plan as planning

    for cmd in (
        *config.COMMANDS,
        *install.COMMANDS,
        catalogue.catalogue,
        *node.COMMANDS,
        *check.COMMANDS,
        accounts.accounts,
        *usage.COMMANDS,
        *slurm.COMMANDS,
        *testcluster.COMMANDS,
        *planning.COMMANDS,
        *live.COMMANDS,
        *exporter.COMMANDS,
        *schema.COMMANDS,
        *offers.COMMANDS,
    ):
        main.add_command(cmd)


_register()
