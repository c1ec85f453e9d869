"""The Jinja environment: StrictUndefined, no autoescape (these are config files), small filters."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from ..policy.billing import fmt


def template_dir() -> Path:
    """Templates ship inside the wheel; in a source checkout they sit at the top level."""
    packaged = Path(__file__).resolve().parent.parent / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


def kv(pairs) -> str:
    """[('CPU', 1.0), ('GRES/gpu', 0.5)] -> 'CPU=1,GRES/gpu=0.5' (Mem weights carry Slurm's G suffix)."""
    return ",".join(f"{k}={fmt(v)}{'G' if k == 'Mem' else ''}" for k, v in pairs)


def yesno(value: bool) -> str:
    return "YES" if value else "NO"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(kv=kv, yesno=yesno, num=fmt)
    return env
