"""A job's ``--constraint`` expression as Slurm reads it, as far as the product's rules need it. Pure.

Every node carries its GPU model's feature (the model's Slurm type, e.g.
``a30``) beside the policy's own features (``policy.Group.features``), so a
job that may run on any of several GPU models asks ``--constraint=a30|l40s``:
Slurm (24.11 src/slurmctld/job_scheduler.c ``_feature_string2list``) reads
feature names joined by ``&`` (and) and ``|`` (or), grouped by ``( )`` and
``[ ]``, a name optionally followed by ``*count``; it refuses a name no node
has (``_valid_feature_list``) and compares names case-sensitively.

What is read here (by the submission rules, ``submit/constraint.py``, and by
the Slurm placement model, ``sim/slurmmodel.py``; job_submit.lua alike):

- the names (the text split at ``& | ( ) [ ]``, a ``*count`` dropped; empty
  pieces skipped, Slurm refuses those itself);
- which nodes it allows: with only ``|`` (or a single name) a node having any
  of the names, with only ``&`` a node having all of them. An expression
  mixing ``&`` and ``|`` is not read (``op`` ''): every node is allowed and
  Slurm alone applies it. Brackets and counts ask how several nodes match
  each other; one node still has one of the names, so they do not change
  which nodes are allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPLIT = re.compile(r"[&|()\[\]]")
_COUNT = re.compile(r"\*[0-9]*\Z")


@dataclass(frozen=True)
class Constraint:
    """The names of a constraint and how they combine: '|' (any, also for one name), '&' (all), '' (not read)."""

    text: str
    names: tuple[str, ...]
    op: str

    def allows(self, features) -> bool:
        """Whether a node with these features can satisfy the constraint (always, when it is not read)."""
        if self.op == "|":
            return any(n in features for n in self.names)
        if self.op == "&":
            return all(n in features for n in self.names)
        return True


def parse(text: str) -> Constraint:
    """The names of a non-empty constraint expression and how they combine."""
    names = tuple(dict.fromkeys(n for piece in _SPLIT.split(text) if (n := _COUNT.sub("", piece))))
    ands, ors = "&" in text, "|" in text
    op = "" if ands and ors else "&" if ands else "|"
    return Constraint(text, names, op)
