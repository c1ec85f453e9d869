"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing page or a page left
out of the navigation fails the build (mkdocs.yml's validation settings)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (site / "index.html").is_file()
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "gpushare node mig apply" in cli, "the CLI reference (mkdocs-click) is missing a command"
    assert (site / "reference" / "policy.schema.json").is_file(), "the JSON Schema is not published with the site"
    assert backslash_pipes_in_code(site) == [], (
        "a code element of the built site shows '\\|' (a table's escaped pipe inside backticks keeps its "
        "backslash, so the copied command is wrong): write '|' inside backticks"
    )


_CODE = re.compile(r"<code\b[^>]*>(.*?)</code>", re.DOTALL)


def backslash_pipes_in_code(site: Path) -> list[str]:
    """'page: code text' for every <code> element of the built site whose text holds a backslash-pipe."""
    found = []
    for page in sorted(site.rglob("*.html")):
        for m in _CODE.finditer(page.read_text(encoding="utf-8")):
            text = html.unescape(re.sub(r"<[^>]+>", "", m[1]))
            if "\\|" in text:
                found.append(f"{page.relative_to(site)}: {text.strip()[:80]}")
    return found


def test_the_code_check_finds_a_backslash_pipe(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        "<td><code>--constraint='a30\\|l40s'</code></td><pre><code><span>x</span> \\&#124;</code></pre>"
        "<td><code>--constraint='a30|l40s'</code> a \\| b</td>"
    )
    assert backslash_pipes_in_code(tmp_path) == ["a/index.html: --constraint='a30\\|l40s'", "a/index.html: x \\|"]


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
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr
