"""What the CLI's command modules share: the context's test doubles, the Slurm client, --slurm-backend, times.

The entry point puts nothing in ``ctx.obj``; a test may put a fake runner
(``runner``) or clock (``clock``) there, and every command reaches Slurm and
the time only through these helpers.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from .. import proc
from ..errors import GpushareError
from ..slurm.interface import SlurmClient


def context_obj(ctx: click.Context) -> dict:
    """The root context's object (a dict of test doubles), or {} when there is none."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, dict) else {}


def get_runner(ctx: click.Context) -> proc.Runner:
    """The subprocess runner: the real one unless the caller (a test) put another in ctx.obj."""
    return context_obj(ctx).get("runner", proc.run)


def _remember_backend(ctx: click.Context, _param, value):
    if value is not None:
        ctx.meta["gpushare.slurm_backend"] = value
    return value


SLURM_BACKEND = click.option(
    "--slurm-backend",
    type=click.Choice(["cli", "pyslurm", "auto"]),
    expose_value=False,
    callback=_remember_backend,
    help="How to read Slurm: cli (its commands, the default), pyslurm (libslurm; must match this Slurm), "
    "auto (pyslurm when it imports here). Default: $GPUSHARE_SLURM_BACKEND, else cli.",
)


def get_client(ctx: click.Context) -> SlurmClient:
    """The Slurm client of --slurm-backend (or $GPUSHARE_SLURM_BACKEND), over the runner."""
    from ..slurm.client import make_client

    return make_client(ctx.meta.get("gpushare.slurm_backend"), get_runner(ctx))


def get_now(ctx: click.Context) -> float:
    return context_obj(ctx).get("clock", time.time)()


def zone(name: str | None) -> tzinfo | None:
    """--tz: the zone naive times are in (recorded files, --since/--until); None is this host's."""
    if name is None:
        return None
    if name.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise GpushareError(f"--tz {name!r} is not a time zone; use e.g. UTC or Europe/Berlin") from None


_AGO = re.compile(r"^(\d+(?:\.\d+)?)([dhm])$")


def parse_when(text: str, now: float, tz: tzinfo | None = None) -> float:
    """``now``, ``7d`` / ``12h`` / ``30m`` before now, or an ISO date or time (naive: in ``tz``)."""
    text = text.strip()
    if text == "now":
        return now
    m = _AGO.match(text)
    if m:
        return now - float(m[1]) * {"d": 86400, "h": 3600, "m": 60}[m[2]]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise GpushareError(f"{text!r} is not a time: use now, 7d, 12h, 30m, 2025-03-01 or 2025-03-01T08:00") from None
    if when.tzinfo is None and tz is not None:
        when = when.replace(tzinfo=tz)
    return when.timestamp()
