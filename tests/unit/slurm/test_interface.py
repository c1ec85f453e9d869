"""SlurmClient (slurm/interface.py) is the client's whole interface: each backend has every method, same signature."""

from __future__ import annotations

import inspect

import pytest

from slurm_gpushare.slurm.cli_backend import CliClient
from slurm_gpushare.slurm.interface import SlurmClient
from slurm_gpushare.slurm.pyslurm_backend import PyslurmClient


def _methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(cls).items() if callable(fn) and not name.startswith("_")}


PROTOCOL = _methods(SlurmClient)


def test_the_protocol_names_every_public_method_of_the_cli_client():
    assert sorted(PROTOCOL) == sorted(_methods(CliClient))
    assert "backend" in SlurmClient.__annotations__ and CliClient.backend == "cli"


@pytest.mark.parametrize("cls", [CliClient, PyslurmClient])
def test_each_backend_method_takes_the_protocols_parameters(cls):
    for name, signature in _methods(cls).items():
        want = [(p.name, p.kind, p.default) for p in PROTOCOL[name].parameters.values()]
        got = [(p.name, p.kind, p.default) for p in signature.parameters.values()]
        assert got == want, f"{cls.__name__}.{name}{signature} differs from SlurmClient.{name}{PROTOCOL[name]}"
