"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from tests.unit.hooks_support import HookNode, stop_daemons


@pytest.fixture
def mps_node(tmp_path):
    """A small-lab MPS test node in tmp_path; quits the fake MPS daemons its test started."""
    node = HookNode(tmp_path, "lab-mps01")
    yield node
    stop_daemons(node.state_dir)
