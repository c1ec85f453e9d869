"""The one translation of gpushare's errors into messages and exit codes, for every command group.

Exit codes, for every `gpushare` command:

- 0: done, or the thing checked is as it should be;
- 1: a definite no: the policy has problems (``PolicyError``), the live state
  differs from the policy, a submission would be rejected, or the command
  refused to act (an edited file, a busy GPU, a node not safe);
- 2: the command could not answer: bad arguments (click's usage errors), an
  input it cannot read or use, Slurm or NVML failing.

An error class states its code (``GpushareError.exit_code``, 2 unless the
class says 1); this module only prints and exits, so a command's code does
not depend on which group runs it.
"""

from __future__ import annotations

import sys

import click

from ..errors import GpushareError, PolicyError

OK, NO, CANNOT = 0, 1, 2


def report(exc: GpushareError, prog: str) -> int:
    """Print ``exc`` for a person (a policy's every problem, else one line) and return its exit code."""
    text = exc.report() if isinstance(exc, PolicyError) else f"{prog}: error: {exc}"
    click.echo(text, err=True)
    return exc.exit_code


class ErrorsToExitCodes(click.Group):
    """A click group whose commands' errors become a message on stderr and an exit code, no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GpushareError as exc:
            sys.exit(report(exc, ctx.command_path))
