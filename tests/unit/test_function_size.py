"""The house's function-size rule as a test: every function and method of the package is at most 60 lines.

Measured from its ``def`` line to its last line (``end_lineno``), docstring and nested functions included;
decorators not. Small functions are the house style (docs/development/layout.md; submitit's median is 6 lines):
a longer one is split into named steps.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurm_gpushare"
LIMIT = 60


def function_sizes(path: Path) -> list[tuple[int, str, int]]:
    """(line of the def, qualified name, lines) of every function and method in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                out.append((child.lineno, prefix + child.name, child.end_lineno - child.lineno + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def over_the_limit() -> dict[str, tuple[int, int]]:
    """{"path name": (line, size)} of every function over the limit."""
    return {
        f"{path.relative_to(ROOT)} {name}": (line, size)
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name, size in function_sizes(path)
        if size > LIMIT
    }


def test_no_function_is_longer_than_60_lines():
    over = over_the_limit()
    offenders = [f"{key.replace(' ', f':{line} ', 1)}: {size} lines" for key, (line, size) in over.items()]
    assert not offenders, f"functions over {LIMIT} lines (split them into named steps):\n" + "\n".join(offenders)


def test_the_measure_counts_from_def_to_the_last_line(tmp_path):
    source = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    source.write_text(
        f"@decorated\ndef f():\n{body}\n\nclass C:\n    def g(self):\n        def h():\n            pass\n"
    )
    assert function_sizes(source) == [(2, "f", 4), (9, "C.g", 3), (10, "C.g.h", 2)]
