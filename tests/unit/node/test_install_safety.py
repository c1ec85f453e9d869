"""`gpushare node install` refuses to have root run code that others may change: an interpreter, an import
directory or the package's tree that is not root's, or that a group or others may write, on any component of
its path up to / (as ssh's StrictModes).

The files are real, under tmp_path; what lies above tmp_path (/tmp among it, which everyone may write) is shown
to the check as root's 0755 directories through ``Trust.lstat``, and ``Trust.owner`` stands in for root where a
test shows the owner refusal (the tests run as root)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli.node import node
from slurm_gpushare.node import install as inst
from tests.unit.node.test_install import policy  # noqa: F401 - fixture


def trust_below(top: Path, owner: int | None = None) -> inst.Trust:
    """The disk as it is below ``top``; above it, root's 0755 directories."""
    here = str(top)

    def lstat(path: str) -> os.stat_result:
        if path == here or path.startswith(here + "/"):
            return os.lstat(path)
        return os.stat_result((stat.S_IFDIR | 0o755, 0, 0, 2, 0, 0, 4096, 0, 0, 0))

    return inst.Trust(owner=os.geteuid() if owner is None else owner, lstat=lstat)


@pytest.fixture
def venv(tmp_path) -> dict[str, Path]:
    """A venv-like tree: bin/python (a link to a real file), lib/site-packages, the package in it."""
    top = tmp_path / "opt" / "env"
    (top / "bin").mkdir(parents=True)
    real = top / "bin" / "python3.13"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    (top / "bin" / "python").symlink_to("python3.13")
    site = top / "lib" / "site-packages"
    (site / "slurm_gpushare" / "hooks").mkdir(parents=True)
    for f in (site / "slurm_gpushare" / "__init__.py", site / "slurm_gpushare" / "hooks" / "prolog.py"):
        f.write_text("")
        f.chmod(0o644)
    for d in (
        tmp_path / "opt",
        top,
        top / "bin",
        top / "lib",
        site,
        site / "slurm_gpushare",
        site / "slurm_gpushare" / "hooks",
    ):
        d.chmod(0o755)
    tmp_path.chmod(0o755)
    return {
        "top": top,
        "python": top / "bin" / "python",
        "real": real,
        "site": site,
        "package": site / "slurm_gpushare",
        "prolog": site / "slurm_gpushare" / "hooks" / "prolog.py",
    }


def problems(venv, trust) -> list[str]:
    return inst.code_problems(str(venv["python"]), [str(venv["site"])], str(venv["package"]), trust)


def test_a_root_owned_tree_nobody_else_may_write_is_accepted(tmp_path, venv):
    assert problems(venv, trust_below(tmp_path)) == []


def test_a_group_writable_venv_directory_is_refused_naming_the_path(tmp_path, venv):
    (venv["top"] / "lib").chmod(0o775)
    got = problems(venv, trust_below(tmp_path))
    lib = venv["top"] / "lib"
    assert f"import directory {venv['site']}: {lib} is writable by its group or others (mode 0775)" in got
    assert f"package directory {venv['package']}: {lib} is writable by its group or others (mode 0775)" in got
    assert not any(str(venv["python"]) in p for p in got)  # the interpreter's path does not pass through lib


def test_an_interpreter_others_may_write_is_refused(tmp_path, venv):
    venv["real"].chmod(0o757)
    got = problems(venv, trust_below(tmp_path))
    assert got == [f"interpreter {venv['python']}: {venv['real']} is writable by its group or others (mode 0757)"]


def test_a_world_writable_directory_high_up_the_path_is_refused(tmp_path, venv):
    tmp_path.chmod(0o777)
    got = problems(venv, trust_below(tmp_path))
    assert f"interpreter {venv['python']}: {tmp_path} is writable by its group or others (mode 0777)" in got


def test_an_interpreter_reached_through_a_link_is_checked_where_the_link_leads(tmp_path, venv):
    elsewhere = tmp_path / "user-owned"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    (elsewhere / "python").write_text("#!/bin/sh\n")
    venv["python"].unlink()
    venv["python"].symlink_to(elsewhere / "python")
    got = problems(venv, trust_below(tmp_path))
    assert f"interpreter {venv['python']}: {elsewhere} is writable by its group or others (mode 0777)" in got


def test_a_package_file_others_may_write_is_refused(tmp_path, venv):
    venv["prolog"].chmod(0o666)
    got = problems(venv, trust_below(tmp_path))
    assert got == [f"package file {venv['prolog']}: {venv['prolog']} is writable by its group or others (mode 0666)"]


def test_code_not_owned_by_root_is_refused(tmp_path, venv):
    other = os.geteuid() + 1  # as if root were someone else: everything made here is then another user's
    got = problems(venv, trust_below(tmp_path, owner=other))
    assert f"interpreter {venv['python']}: {venv['real']} is owned by uid {os.geteuid()}, not uid {other}" in got
    assert f"import directory {venv['site']}: {venv['site']} is owned by uid {os.geteuid()}, not uid {other}" in got


def test_a_missing_import_directory_is_judged_by_its_parents(tmp_path, venv):
    missing = venv["top"] / "lib" / "python313.zip"
    assert inst.path_problems(str(missing), "import directory", trust_below(tmp_path)) == []
    (venv["top"] / "lib").chmod(0o777)
    assert inst.path_problems(str(missing), "import directory", trust_below(tmp_path)) == [
        f"import directory {missing}: {venv['top'] / 'lib'} is writable by its group or others (mode 0777)"
    ]


def test_this_interpreter_is_probed_for_every_import_directory():
    import slurm_gpushare

    import_path, package = inst.probe_code(sys.executable)
    assert package == slurm_gpushare.__path__[0]
    assert set(inst.probe_import_dirs(sys.executable)) <= set(import_path)


def test_the_cli_refuses_and_writes_nothing(tmp_path, policy, monkeypatch):  # noqa: F811 - the fixture
    other = os.geteuid() + 1
    monkeypatch.setattr(inst, "TRUST", inst.Trust(owner=other))
    root = tmp_path / "root"
    result = CliRunner().invoke(node, ["install", "--policy", str(policy), "--root", str(root)])
    assert result.exit_code != 0
    assert "the hooks would run as root code that others may change; nothing installed" in result.output
    assert f"interpreter {sys.executable}: " in result.output and f"not uid {other}" in result.output
    assert not root.exists()
