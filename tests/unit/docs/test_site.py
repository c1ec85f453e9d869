"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing page or a page left
out of the navigation fails the build (mkdocs.yml's validation settings)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (site / "index.html").is_file()
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "gpushare node mig apply" in cli, "the CLI reference (mkdocs-click) is missing a command"
    assert (site / "reference" / "policy.schema.json").is_file(), "the JSON Schema is not published with the site"


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The check above can fail: the same configuration with a page that links to nothing does not build."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "RESULTS.md", copy / "bench" / "RESULTS.md")
    (copy / "docs" / "index.md").write_text((copy / "docs" / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
                          cwd=copy, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr
