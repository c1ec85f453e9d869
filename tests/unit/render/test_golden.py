"""Rendered output of every example at every tested Slurm version, byte for byte."""

from __future__ import annotations

import pytest

from tests.regen_golden import COMMAND, GOLDEN, VERSIONS, examples, expected


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("example", examples(), ids=lambda p: p.stem)
def test_golden(example, version):
    out = GOLDEN / example.stem / version
    rendered = expected(example, version)
    assert sorted(p.name for p in out.iterdir()) == sorted(rendered), f"golden set differs; regenerate: {COMMAND}"
    for name, text in rendered.items():
        want = (out / name).read_text(encoding="utf-8")
        assert text == want, (
            f"{example.name} {version} {name} differs from {out / name}; if intended, regenerate: {COMMAND}"
        )


def test_every_example_has_goldens():
    assert {p.stem for p in examples()} == {p.name for p in GOLDEN.iterdir()}
    assert len(examples()) >= 3
