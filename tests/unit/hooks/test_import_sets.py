"""The root hooks' start-up budget as a rule: what the prolog, epilog and health check load.

Each runs in a fresh interpreter, as root, on every job (the health check every interval); bench/node_hooks.py
times them. What a hook loads is its module and every module its functions import when they run (``from
..node.prolog import ...`` inside ``prolog()``), found here from the code, plus what the shared ``_common``
imports for every run (reading the node config, the guard, the runner). Imported together in a subprocess, as
test_taskprolog.py does for the task prolog, they must not pull in the heavy libraries, and the set of the
product's modules is pinned: a change names the modules added or gone. Two paths that only some runs take are
checked for the heavy libraries too: a failure (``_common.fail``: the drain reason through the Slurm client) and
node metrics (``_metrics``: the textfile and dcgm-exporter's job mapping).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[3] / "slurm_gpushare" / "hooks"
HEAVY = {"pydantic", "yaml", "jinja2", "click", "dataclasses", "inspect", "hostlist", "numpy"}
# _common's functions that every run calls (hooks.<hook>.main -> guarded -> load, run); fail and drain run
# only when the hook fails.
EVERY_RUN = {"load", "guarded", "run", "mps_command", "_no_gc"}
FAILURE = {"fail", "drain"}


def lazy_imports(module: str, functions: set[str] | None = None) -> set[str]:
    """The slurm_gpushare modules hooks/<module>.py imports inside its functions (all, or those named)."""
    tree = ast.parse((HOOKS / f"{module}.py").read_text(encoding="utf-8"))
    found = set()
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or (functions is not None and fn.name not in functions):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level:
                package = ["slurm_gpushare", "hooks"][: 3 - node.level]
                base = ".".join([*package, *([node.module] if node.module else [])])
                found.add(base)
                # ``from ..metrics import textfile``: a module named in the import is loaded too
                found.update(f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}"))
    return found


def _is_module(name: str) -> bool:
    path = HOOKS.parent.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def loaded_by(modules: set[str]) -> set[str]:
    code = f"import sys\nfor m in {sorted(modules)!r}: __import__(m)\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def every_run(hook: str) -> set[str]:
    return {f"slurm_gpushare.hooks.{hook}", *lazy_imports(hook), *lazy_imports("_common", EVERY_RUN)}


# The product's modules on every run's path, beside those of every root hook (COMMON).
COMMON = {
    "slurm_gpushare",
    "slurm_gpushare.atomic",
    "slurm_gpushare.errors",
    "slurm_gpushare.gpu",
    "slurm_gpushare.gpu.backend",
    "slurm_gpushare.gpu.migminors",
    "slurm_gpushare.hooks",
    "slurm_gpushare.hooks._common",
    "slurm_gpushare.hooks._metrics",
    "slurm_gpushare.node",
    "slurm_gpushare.node.jobenv",
    "slurm_gpushare.node.journal",
    "slurm_gpushare.node.mps",
    "slurm_gpushare.node.nodeconfig",
    "slurm_gpushare.node.observed",
    "slurm_gpushare.node.paths",
    "slurm_gpushare.node.procscan",
    "slurm_gpushare.policy",  # its __init__ loads its exports on first use: no pydantic, no YAML
    "slurm_gpushare.policy.share",  # a GPU's share (Mode, Share): the node spec's GPUs
    "slurm_gpushare.proc",
    "slurm_gpushare.records",
}
PINNED = {
    "prolog": {
        "slurm_gpushare.hooks.prolog",
        "slurm_gpushare.node.gresindex",
        "slurm_gpushare.node.mpsmem",
        "slurm_gpushare.node.perjob",  # per-job MIG (issue 35); the catalogue only when a slice is planned
        "slurm_gpushare.node.prolog",
        "slurm_gpushare.node.taskprolog",
    },
    "epilog": {
        "slurm_gpushare.hooks.epilog",
        "slurm_gpushare.node.aside",
        "slurm_gpushare.node.epilog",
        "slurm_gpushare.node.perjob",  # per-job MIG: DestroySlice
    },
    # job_container.conf CloneNSScript (per-job MIG isolation): the journal, the mig-minors table, nsenter
    "nscaps": {
        "slurm_gpushare.hooks.nscaps",
        "slurm_gpushare.node.nscaps",
    },
    # the health check sets and clears drains through the Slurm client on every run
    "health": {
        "slurm_gpushare.hooks.health",
        "slurm_gpushare.node.epilog",
        "slurm_gpushare.node.health",
        "slurm_gpushare.node.perjob",  # per-job MIG: the epilog's DestroySlice, for reconcile
        "slurm_gpushare.slurm",
        "slurm_gpushare.slurm.cli_backend",
        "slurm_gpushare.slurm.commands",
        "slurm_gpushare.slurm.model",
        "slurm_gpushare.slurm.parsable",
    },
}
# What a hook leaves out of COMMON: gpushare-ns-caps starts no MPS daemon and observes no GPU (its commands'
# PATH, procscan's, is imported when it runs them).
NOT_LOADED = {
    "nscaps": {"slurm_gpushare.node.mps", "slurm_gpushare.node.observed", "slurm_gpushare.node.procscan"},
}
# Known today, named so that nothing else joins them: the Slurm client's records (slurm/model.py) and the node
# textfile's (metrics/textfile.py) and node/health.py's are dataclasses, so the health check, a failing hook
# (its drain reason) and node metrics load dataclasses and inspect.
DATACLASSES = {"dataclasses", "inspect"}


@pytest.mark.parametrize("hook", sorted(PINNED))
def test_a_root_hook_loads_only_its_pinned_modules(hook):
    loaded = loaded_by(every_run(hook))
    heavy = HEAVY - DATACLASSES if hook == "health" else HEAVY
    assert not loaded & heavy, f"gpushare-{hook} loads {sorted(loaded & heavy)}"
    ours = {m for m in loaded if m.startswith("slurm_gpushare")}
    want = (COMMON | PINNED[hook]) - NOT_LOADED.get(hook, set())
    assert ours == want, f"gpushare-{hook}: added {sorted(ours - want)}, gone {sorted(want - ours)}"


@pytest.mark.parametrize("path", ["failure", "metrics"])
@pytest.mark.parametrize("hook", sorted(PINNED))
def test_a_failing_hook_and_node_metrics_load_no_heavy_library(hook, path):
    extra = lazy_imports("_common", FAILURE) if path == "failure" else lazy_imports("_metrics")
    loaded = loaded_by(every_run(hook) | extra)
    assert not loaded & (HEAVY - DATACLASSES), f"gpushare-{hook}, {path}: loads {sorted(loaded & HEAVY)}"


def test_the_pinned_sets_name_every_hook():
    """A new root hook (a module of hooks/ with a main) gets its own pinned set; the task prolog has its test."""
    hooks = {p.stem for p in HOOKS.glob("*.py") if not p.stem.startswith("_") and "def main(" in p.read_text()}
    assert hooks - {"taskprolog"} == set(PINNED)
