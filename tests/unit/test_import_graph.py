"""The package edges of ARCHITECTURE.md, checked on the import graph (tests/unit/import_graph.py).

General on purpose: the rules name packages, not modules, so a new module or
package (planner/, metrics/, ...) is held to them the day it is added.
"""

from __future__ import annotations

import pytest

from tests.unit import import_graph as ig

# Packages whose code runs on a node's critical path or as root: they never load the renderer or Jinja.
NODE_SIDE = ("node", "hooks")
NO_RENDER = ("slurm_gpushare.render", "jinja2")
# Pure packages (data in, figures or plans out): nothing in them runs a command.
PURE = ("planner", "policy", "accounting", "hardware", "submit", "render")
RUNS_COMMANDS = ("subprocess", "slurm_gpushare.proc")
# Known, and to be moved into slurm/ (issue: Slurm commands outside slurm/); remove an entry once it is.
STILL_RUNS_COMMANDS: set[str] = set()


def _in(package: str) -> list[str]:
    return [m for m in ig.modules() if m == f"slurm_gpushare.{package}" or m.startswith(f"slurm_gpushare.{package}.")]


def test_the_graph_sees_the_package():
    assert len(ig.modules()) > 50
    assert "slurm_gpushare.render.header" in ig.graph()["slurm_gpushare.render.files"]
    assert "jinja2" in ig.reachable("slurm_gpushare.render.files")


def test_no_import_cycles():
    assert ig.cycles() == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in ig.cycles())


def test_every_package_has_a_layer():
    assert ig.unplaced() == [], "add these to import_graph.LAYERS (ARCHITECTURE.md's dependency direction)"
    assert all(ig.layer_of(m) is not None for m in ig.modules())


def test_nothing_imports_upward():
    """cli, hooks -> (render, submit, node, accounting, planner, live, metrics, testcluster) -> sim -> (policy,
    hardware, gpu, slurm) -> (proc, atomic, errors): e.g. sim/ never imports submit/ or planner/."""
    assert ig.upward_imports() == []


def test_the_layer_rule_sees_an_upward_import():
    assert ig.layer_of("slurm_gpushare.sim.slurmmodel") > ig.layer_of("slurm_gpushare.planner.plan")
    assert ig.layer_of("slurm_gpushare.sim.slurmmodel") > ig.layer_of("slurm_gpushare.live.plan")
    assert ig.layer_of("slurm_gpushare.sim.slurmmodel") < ig.layer_of("slurm_gpushare.slurm.constraint")
    assert ig.layer_of("slurm_gpushare.cli.plan") < ig.layer_of("slurm_gpushare.planner.plan")
    assert ig.layer_of("slurm_gpushare") == len(ig.LAYERS) - 1


def test_no_product_module_imports_the_papers_harness():
    """sim/paper/ (FGD, BestFit, Random, their GPU state, the MIG what-if stand-ins) is for bench/ and tests only:
    it is left out of the wheel, so a product module importing it would fail where the package is installed."""
    assert any(m.startswith(ig.HARNESS + ".") for m in ig.modules())
    assert ig.harness_importers() == []


def test_no_product_module_reads_the_checkouts_tests():
    """A path into tests/ (the paper's trace copies) exists only in a checkout: only sim/paper/, which the wheel
    leaves out, may build one (a string "tests" or "tests/..." in its source)."""
    import ast

    def names_tests(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split("/")[0] == "tests"

    found = sorted(
        name
        for name, path in ig.modules().items()
        if not name.startswith(ig.HARNESS)
        and any(names_tests(n) for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    )
    assert found == []


@pytest.mark.parametrize("package", NODE_SIDE)
def test_node_side_never_imports_the_renderer(package):
    found = []
    for module in _in(package):
        reach = ig.reachable(module)
        found += [" -> ".join(ig.path_to(module, t)) for t in reach if t.startswith(NO_RENDER)]
    assert found == []


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_run_no_commands(package):
    """No module of a pure package imports subprocess or the runner itself (directly: a parser module
    of slurm/ that also holds a query function may be imported for its parser)."""
    found = sorted(
        f"{m} imports {t}"
        for m in _in(package)
        if m not in STILL_RUNS_COMMANDS
        for t in ig.graph()[m]
        if t in RUNS_COMMANDS
    )
    assert found == []


def test_the_known_exceptions_are_still_needed():
    for module in STILL_RUNS_COMMANDS:
        if module in ig.graph():
            assert ig.graph()[module] & set(RUNS_COMMANDS), (
                f"{module} no longer runs commands: drop it from STILL_RUNS_COMMANDS"
            )


def test_the_wheel_leaves_the_harness_out():
    """pyproject.toml excludes sim/paper from the wheel (a wheel built from it has sim/ without paper/)."""
    import tomllib

    config = tomllib.loads((ig.SOURCE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    wheel = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["exclude"] == [ig.HARNESS.replace(".", "/")]
