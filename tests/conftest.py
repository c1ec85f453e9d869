"""Shared fixtures. A tier's own conftest decides whether it can run."""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import pytest

# Helper modules that hold asserts (not named test_*.py, so not collected): full assert messages there too.
pytest.register_assert_rewrite("tests.unit.submit_corpus", "tests.unit.hooks_support", "tests.unit.slurm_fakes")

ROOT = Path(__file__).resolve().parents[1]
_OWN_BASETEMP = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A short base for tmp_path, one per run: the MPS tests put unix sockets under tmp_path, and a socket path
    has at most 107 characters (pytest's own base, with pytest-xdist's popen-gwN under it, went past that). Two
    runs side by side (CI's Slurm 26.05 subset) each get their own; a passing run's is removed at its end."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="gpt-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session, exitstatus):
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)


def minimal_policy() -> dict:
    """The smallest valid policy; tests copy it and break one thing."""
    return {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {
                "name": "g",
                "nodes": "gpu-[01-02]",
                "gpu": {"model": "A100-SXM4-40GB", "count": 4},
                "cpus": 16,
                "memory_mb": 64000,
                "sharing": [
                    {"gpus": "0-1", "mode": "exclusive"},
                    {"gpus": 2, "mode": "mig", "layout": ["3g.20gb", "3g.20gb"]},
                    {"gpus": 3, "mode": "shard", "replicas": 4},
                ],
            }
        ],
        "tenants": [{"name": "a", "shares": 1}],
        "tiers": [{"name": "batch", "node_groups": ["g"]}],
    }


@pytest.fixture
def policy() -> dict:
    return copy.deepcopy(minimal_policy())
