"""The import graph of slurm_gpushare, read from the source (nothing is imported): who imports whom.

Every import counts, at module level or inside a function (a lazy import is
still an edge: it runs when the function does). ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = "slurm_gpushare"
SOURCE = Path(__file__).resolve().parents[2] / PACKAGE


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def _base(name: str, path: Path, level: int) -> str:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


@lru_cache(maxsize=None)
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
