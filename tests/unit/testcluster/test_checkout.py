"""`gpushare testcluster` finds the source checkout whether the package is installed editable or not."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slurm_gpushare.cli import testcluster as testcluster_cli
from slurm_gpushare.testcluster.checkout import find_checkout, is_checkout
from tests.conftest import ROOT


def fake_checkout(path: Path) -> Path:
    (path / "docker").mkdir(parents=True)
    (path / "docker" / "docker-compose.yml").write_text("services: {}\n")
    (path / "pyproject.toml").write_text('[project]\nname = "slurm-gpushare"\n')
    return path


def test_this_tree_is_a_checkout():
    assert is_checkout(ROOT)


def test_found_from_the_checkout_or_below_it(tmp_path):
    root = fake_checkout(tmp_path / "clone")
    (root / "etc").mkdir()
    assert find_checkout(root, {}) == root
    assert find_checkout(root / "etc", {}) == root


def test_the_environment_names_it_and_must_be_right(tmp_path):
    root = fake_checkout(tmp_path / "clone")
    assert find_checkout(Path("/"), {"GPUSHARE_CHECKOUT": str(root)}) == root
    assert find_checkout(root, {"GPUSHARE_CHECKOUT": str(tmp_path)}) is None


def test_another_project_is_not_a_checkout(tmp_path):
    other = fake_checkout(tmp_path / "other")
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert not is_checkout(other)


def test_without_a_checkout_the_command_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUSHARE_CHECKOUT", str(tmp_path))
    res = CliRunner().invoke(testcluster_cli.testcluster, ["down"])
    assert res.exit_code == 1 and "GPUSHARE_CHECKOUT" in res.output and "not in the wheel" in res.output
