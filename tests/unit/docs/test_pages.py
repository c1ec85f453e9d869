"""The documentation says what the product does and what was measured: no path outside the repository, no
word about how it was written; the layout page names every package and module as the code has them."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.unit.docs_support import DOCS

OWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "RESULTS.md", *sorted(p for p in DOCS.rglob("*.md"))]
# Paths of the machines the product was built on, and words about how the work was done.
FORBIDDEN = [
    r"/work/",
    r"\.\./shared/",
    r"readme-L\d",
    r"\bthis (pass|stop|session)\b",
    r"\bengineers?\b",
    r"\bhelpers?' ",
    r"\bother helpers\b",
]


def test_no_outside_paths_or_work_notes():
    found = []
    for page in OWN:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for pattern in FORBIDDEN:
                if re.search(pattern, line, re.IGNORECASE):
                    found.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert found == [], "\n".join(found)


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_layout_page_names_every_package_and_module():
    block = (DOCS / "development" / "layout.md").read_text().split("```", 2)[1]
    package = ROOT / "slurm_gpushare"
    names = {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    listed = set(re.findall(r"^  (\S+)", block, re.MULTILINE))
    assert sorted(names - listed) == [], "add these to docs/development/layout.md"
    assert sorted(listed - names) == [], "docs/development/layout.md lists what slurm_gpushare/ no longer has"


def test_nav_names_each_page_once():
    import yaml

    pages = re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert len(pages) == len(set(pages)), sorted(p for p in pages if pages.count(p) > 1)
    assert yaml.safe_load((ROOT / "mkdocs.yml").read_text())["strict"] is True
