"""A job's ``--constraint`` (job_submit's ``features``) as far as the submission rules read it. Pure.

The expression's syntax and what it allows are Slurm's (``slurm/constraint.py``:
names joined by '|' or by '&'; an expression mixing both is not read, every
node group is allowed and Slurm alone applies it). The submission rules add
one bound: a text longer than ``MAX_LEN`` is not read either (the rules stay
bounded), as in job_submit.lua.
"""

from __future__ import annotations

from ..slurm.constraint import Constraint, parse
from .tables import MAX_LEN

__all__ = ["Constraint", "read"]


def read(text: str | None) -> Constraint | None:
    """The constraint of a job, None when it has none (absent or empty) or it is too long to read."""
    if not isinstance(text, str) or text == "" or len(text.encode("utf-8")) > MAX_LEN:
        return None
    return parse(text)
