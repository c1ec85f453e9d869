"""The static program slurm_gpushare/submit/job_submit.lua: a Lua file of its own, shipped unchanged after its
prelude."""

from __future__ import annotations

import shutil
import sys
import zipfile

import pytest

from slurm_gpushare import proc
from slurm_gpushare.render.jobsubmit import prelude, program, render_body
from tests.conftest import ROOT
from tests.lua.harness import FAKE_SLURM, VERSIONS, Script, runtime
from tests.unit.submit_corpus import site_of

pytestmark = pytest.mark.lua

PROGRAM = ROOT / "slurm_gpushare" / "submit" / "job_submit.lua"
# The smallest prelude the program loads after: the three locals, with the one table it walks at load time.
STUB_PRELUDE = "local P = { tiers = {} }\nlocal M = {}\nlocal C = {}\n"
LUACS = [name for name in ("luac5.1", "luac5.4", "luac") if shutil.which(name)]


def test_the_program_is_the_file_in_the_package():
    assert program() == PROGRAM.read_text(encoding="utf-8")
    assert "{{" not in program() and "{%" not in program()  # no template syntax left in it


@pytest.mark.parametrize("version", VERSIONS)
def test_the_program_alone_is_valid_lua(version):
    """It compiles on its own (P, M and C are then globals), as a Lua editor or linter reads it."""
    lua = runtime(version)
    assert callable(lua.compile(program()))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_program_loads_after_a_stub_prelude(version):
    script = Script(version, STUB_PRELUDE + program())
    assert callable(script.g.slurm_job_submit) and callable(script.g.slurm_job_modify)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_program_without_its_prelude_fails_to_load(version):
    """Installed without the prelude it does not load (slurmctld then rejects submissions), never passes jobs."""
    lua = runtime(version)
    lua.execute(FAKE_SLURM)
    with pytest.raises(Exception, match="global 'P'"):
        lua.execute(program())
    assert lua.globals().slurm_job_submit is None


def test_the_rendered_script_is_the_prelude_then_the_program_unchanged():
    site = site_of()
    body = render_body(site)
    assert body == prelude(site) + "\n" + program()
    assert body.endswith(program())
    assert "{{" not in prelude(site)


@pytest.mark.skipif(not LUACS, reason="no luac on this machine: the lupa tests above compile the program")
@pytest.mark.parametrize("luac", LUACS or ["luac"])
def test_luac_accepts_the_program_and_the_rendered_script(luac, tmp_path):
    rendered = tmp_path / "job_submit.lua"
    rendered.write_text(render_body(site_of()), encoding="utf-8")
    for path in (PROGRAM, rendered):
        proc.run([shutil.which(luac), "-p", str(path)])


def test_the_program_and_its_prelude_are_in_the_wheel(tmp_path):
    """`gpushare render` from an installed wheel reads both: the program as package data, the prelude as a template."""
    proc.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)], timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("slurm_gpushare/submit/job_submit.lua").decode("utf-8")
        assert "slurm_gpushare/templates/job_submit.prelude.lua.j2" in zf.namelist()
    assert shipped == program()
