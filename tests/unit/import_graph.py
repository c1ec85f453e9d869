"""The import graph of slurm_gpushare, read from the source (nothing is imported): who imports whom.

Every import counts, at module level or inside a function (a lazy import is
still an edge: it runs when the function does). ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = "slurm_gpushare"
SOURCE = Path(__file__).resolve().parents[2] / PACKAGE


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def _base(name: str, path: Path, level: int) -> str:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


@cache
def graph() -> dict[str, frozenset[str]]:
    """module -> every module it imports (ours by full name, others by their top-level name)."""
    known = modules()
    out = {}
    for name, path in known.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(a.name if a.name.startswith(PACKAGE + ".") else a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _base(name, path, node.level) if node.level else (node.module or "")
                target = f"{base}.{node.module}" if node.level and node.module else base
                if not target.startswith(PACKAGE):
                    edges.add(target.split(".")[0])
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in known else target)
        edges.discard(name)
        out[name] = frozenset(edges)
    return out


def reachable(start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not: module -> the module that imports it (for a path)."""
    g, seen, todo = graph(), {start: ""}, [start]
    while todo:
        cur = todo.pop()
        for nxt in sorted(g.get(cur, ())):
            # importing a.b.c runs a/__init__ and a/b/__init__ too
            for mod in [".".join(nxt.split(".")[:i]) for i in range(2, nxt.count(".") + 1)] + [nxt]:
                if mod not in seen:
                    seen[mod] = cur
                    todo.append(mod)
    del seen[start]
    return seen


def path_to(start: str, target: str) -> list[str]:
    via, chain = reachable(start), [target]
    while chain[-1] != start:
        chain.append(via[chain[-1]] or start)
    return chain[::-1]


def cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    g = {k: [v for v in vs if v in graph()] for k, vs in graph().items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


# ARCHITECTURE.md's dependency direction, top to bottom: a module may import its own layer's packages and the
# layers below, never one above. Each entry is a package or top-level module of slurm_gpushare ("" is the package's
# own __init__). sim.paper (the paper's baselines, the MIG what-if stand-ins) sits with sim but no product module
# imports it: it is for bench/ and tests only, and is left out of the wheel.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "hooks"),
    (
        "render",
        "submit",
        "node",
        "accounting",
        "planner",
        "live",
        "metrics",
        "testcluster",
        "outfiles",
        "examples",
        "systemd",
        "siteconf",
    ),
    ("sim",),
    ("policy", "hardware", "gpu", "slurm", "slurmversion", "sitepolicy"),
    ("proc", "atomic", "errors", "records", ""),
)
HARNESS = f"{PACKAGE}.sim.paper"


def unit_of(module: str) -> str:
    """The LAYERS entry a module belongs to: its package or top-level module under slurm_gpushare ('' for it)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module of ours (0 the top), None when its package is in no layer."""
    unit = unit_of(module)
    return next((i for i, layer in enumerate(LAYERS) if unit in layer), None)


def unplaced() -> list[str]:
    """Packages and top-level modules of slurm_gpushare that no layer names."""
    return sorted({unit_of(m) for m in modules()} - {u for layer in LAYERS for u in layer})


def upward_imports() -> list[str]:
    """'a imports b' for every import of a module in a higher layer than the importer's."""
    found = []
    for module, targets in graph().items():
        for target in targets:
            if target.startswith(PACKAGE) and (layer_of(target) or 0) < (layer_of(module) or 0):
                found.append(f"{module} imports {target}")
    return sorted(found)


def harness_importers() -> list[str]:
    """'a imports b' for every product module (outside sim.paper) that imports sim.paper."""
    inside = lambda m: m == HARNESS or m.startswith(HARNESS + ".")  # noqa: E731
    return sorted(f"{m} imports {t}" for m, ts in graph().items() if not inside(m) for t in ts if inside(t))
