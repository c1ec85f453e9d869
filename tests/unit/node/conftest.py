"""Fixtures that other node test modules use, defined beside their own tests. A fixture is found by name in the
test's module or a conftest.py; imported here, its users need not import it (a test argument named like an import
redefines it)."""

from tests.unit.node.test_health import excl_node as excl_node
from tests.unit.node.test_pipe_dir_contents import outside as outside
