"""Each submission message is written once (submit/tables.py) and used by both the Python rules and job_submit.lua."""

from __future__ import annotations

import ast
import re

import pytest

from slurm_gpushare.render.jobsubmit import job_submit_lua, lua_function
from slurm_gpushare.submit import tables as tb
from tests.conftest import ROOT
from tests.unit.submit_corpus import site_of

PYTHON = [ROOT / "slurm_gpushare" / "submit" / name for name in ("decide.py", "parse.py")]
PROGRAM = ROOT / "slurm_gpushare" / "submit" / "job_submit.lua"  # the static Lua program
PRELUDE = ROOT / "templates" / "job_submit.prelude.lua.j2"
_PY_USE = re.compile(r"\b(?:message|code|violation)\(\s*\"([a-z_]+)\"")
_LUA_USE = re.compile(r"\b(?:msg|violation)\(\"([a-z_]+)\"|\b[MC]\.([a-z_]+)\(")


def python_uses() -> set[str]:
    return {m[1] for path in PYTHON for m in _PY_USE.finditer(path.read_text(encoding="utf-8"))}


def lua_uses() -> set[str]:
    return {m[1] or m[2] for m in _LUA_USE.finditer(PROGRAM.read_text(encoding="utf-8"))}


def test_every_shared_message_is_used_by_both_python_and_lua():
    shared = set(tb.MESSAGES) | set(tb.CODES)
    assert python_uses() == shared, "messages not used in Python: " + ", ".join(sorted(shared - python_uses()))
    assert lua_uses() - set(tb.SCRIPT_MESSAGES) == shared, "messages not used in job_submit.lua: " + ", ".join(
        sorted(shared - lua_uses())
    )
    assert set(tb.SCRIPT_MESSAGES) <= lua_uses()
    assert not set(tb.SCRIPT_MESSAGES) & shared


@pytest.mark.parametrize("policy", ["small-lab", "mixed-production", "mps-inference", "perjob-lab"])
def test_every_message_is_in_the_rendered_script(policy):
    """Per-job MIG's messages only where a tier has per-job GPUs (the others' preludes stay as they were)."""
    text = job_submit_lua(site_of(policy))
    per_job = policy == "perjob-lab"
    for name, template in {**tb.MESSAGES, **tb.SCRIPT_MESSAGES, **tb.CODES}.items():
        if per_job or not name.startswith("per_job_"):
            assert lua_function(template) in text, name
        else:
            assert lua_function(template) not in text, name


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("path", [PROGRAM, PRELUDE], ids=lambda p: p.name)
def test_the_lua_program_holds_no_text(path):
    """A sentence typed into the program or its prelude would be a second copy: only patterns and short tokens are
    literals."""
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', path.read_text(encoding="utf-8"))
    assert [s for s in literals if _words(s) >= 3] == []


def test_the_python_rules_hold_no_text():
    """decide.py and parse.py format messages only through tables.message/code."""
    for path in PYTHON:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        texts = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in docstrings
            and _words(n.value) >= 3
        ]
        fstrings = [  # Slurm syntax such as f"{name}:{type}" is no message: only words or spaces make one
            ast.unparse(n)
            for n in ast.walk(tree)
            if isinstance(n, ast.JoinedStr)
            and any(isinstance(c, ast.Constant) and re.search(r"[A-Za-z ]", c.value) for c in n.values)
        ]
        assert texts == [] and fstrings == [], (path.name, texts, fstrings)


def test_pieces_alternate_literals_and_names():
    assert tb.pieces("{n} shards are not {n} GPUs") == ["", "n", " shards are not ", "n", " GPUs"]
    assert tb.message("over_shard", n=2, whole="gpu:1").startswith("2 shards are not 2 GPUs")
    assert tb.code("scope", name="shard", field="tres_per_task") == "SCOPE shard tres_per_task"
