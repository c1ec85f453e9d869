"""Fixtures that other metrics test modules use, defined beside their own tests. A fixture is found by name in the
test's module or a conftest.py; imported here, its users need not import it (a test argument named like an import
redefines it)."""

from tests.unit.metrics.test_webserver import stacks as stacks
