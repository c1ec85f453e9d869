"""Rendered output of every example at every tested Slurm version, byte for byte.

A golden job_submit.lua holds only what is generated (the header and the prelude: the policy's tables, messages
and codes); the rendered file is that followed by the static program (slurm_gpushare/submit/job_submit.lua, a file
of the package, tested on its own in tests/lua), byte for byte.
"""

from __future__ import annotations

import pytest

from slurm_gpushare.policy import load_file
from slurm_gpushare.render.jobsubmit import prelude, program
from tests.regen_golden import COMMAND, GOLDEN, JOB_SUBMIT, VERSIONS, examples, expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("example", examples(), ids=lambda p: p.stem)
def test_golden(example, version):
    out = GOLDEN / example.stem / version
    rendered = expected(example, version)
    assert sorted(p.name for p in out.iterdir()) == sorted(rendered), f"golden set differs; regenerate: {COMMAND}"
    for name, text in rendered.items():
        want = (out / name).read_text(encoding="utf-8")
        if name == JOB_SUBMIT:
            want += program()  # the generated part, then the program unchanged
        assert text == want, (
            f"{example.name} {version} {name} differs from {out / name}; if intended, regenerate: {COMMAND}"
        )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("example", examples(), ids=lambda p: p.stem)
def test_the_golden_job_submit_lua_is_the_header_and_the_prelude(example, version):
    """What the golden holds is the generated part only: the generated-by header, then the prelude and the blank
    line before the program."""
    golden = (GOLDEN / example.stem / version / JOB_SUBMIT).read_text(encoding="utf-8")
    header, body = golden.split("\n", 4)[:4], golden.split("\n", 4)[4]
    assert all(line.startswith("-- ") for line in header)
    assert body == prelude(load_file(example, version)) + "\n"


def test_every_example_has_goldens():
    assert {p.stem for p in examples()} == {p.name for p in GOLDEN.iterdir()}
    assert len(examples()) >= 3
