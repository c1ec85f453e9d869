"""The one place that talks to Slurm: the client (``client.make_client``), its backends, and the parsers.

Parsers are pure and tested on recorded output (tests/data/slurm/); the
clients take the Runner made at the entry point. Nothing here uses a
shell: every command is an argument list (``commands``). Names are
imported lazily, so a node hook that only needs ``commands`` pays for no
more.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "SlurmParseError": "parsable",
    "parse_duration": "parsable",
    "parse_time": "parsable",
    "parse_tres": "parsable",
    "FileSource": "sacct",
    "JobRecord": "sacct",
    "JobSource": "sacct",
    "PyslurmSource": "sacct",
    "SacctSource": "sacct",
    "parse_json": "sacct",
    "parse_parsable2": "sacct",
    "ShareRow": "sshare",
    "CliClient": "client",
    "make_client": "client",
    "Job": "model",
    "Node": "model",
    "Partition": "model",
    "GresUse": "model",
    "SlurmClient": "interface",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
