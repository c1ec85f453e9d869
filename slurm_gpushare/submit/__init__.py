"""Submission policy: parse a job's GPU requests and decide on them (pure).

The same rules in Lua are job_submit.lua, the file beside this one, which
`gpushare render` ships after a generated prelude of the policy tables
(render/jobsubmit.py); tests/cases/submit.yaml runs through both.
"""

from .decide import Decision, Violation, decide
from .options import OptionError, script_options, split_options, to_job
from .parse import BadRequest, Gres, Other, parse_field
from .tables import FIELDS, Tables, build_tables

__all__ = [
    "FIELDS",
    "BadRequest",
    "Decision",
    "Gres",
    "OptionError",
    "Other",
    "Tables",
    "Violation",
    "build_tables",
    "decide",
    "parse_field",
    "script_options",
    "split_options",
    "to_job",
]
