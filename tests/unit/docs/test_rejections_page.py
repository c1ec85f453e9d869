"""docs/users/rejections.md lists every code the submission filter emits (collected from submit/tables.CODES, the
one table both the Python decision and job_submit.lua take their codes from), and no code it does not emit."""

from __future__ import annotations

import re

from slurm_gpushare.submit import tables
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "users" / "rejections.md"


def page_codes() -> list[str]:
    """The codes in the first column of the page's table (a cell may hold several: `A` / `B`, `A` (or `b`))."""
    cells = [line.split("|")[1] for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    return [code for cell in cells for code in re.findall(r"`([^`]+)`", cell) if re.match(r"[A-Z_]{3,}( |$)", code)]


def pattern(template: str) -> re.Pattern:
    """A code template ('PER_JOB gpu:{type}={n}') as a pattern its written forms match ('PER_JOB gpu:T=N')."""
    parts = tables.pieces(template)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else r"[^\s`]+" for i, p in enumerate(parts)))


def test_every_code_the_filter_emits_is_on_the_page():
    codes = page_codes()
    missing = [t for t in tables.CODES.values() if not any(pattern(t).fullmatch(c) for c in codes)]
    assert not missing, f"{PAGE.name} lacks a row for: {missing}"
    assert {t.split()[0] for t in tables.CODES.values()} >= {"PER_JOB", "PER_JOB_EXTRA", "UNTYPED", "MPS_RANGE"}


def test_every_code_on_the_page_is_one_the_filter_emits():
    stale = [c for c in page_codes() if not any(pattern(t).fullmatch(c) for t in tables.CODES.values())]
    assert not stale, f"{PAGE.name} lists codes the filter never emits: {stale}"
