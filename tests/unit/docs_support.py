"""What the documentation tests share: the runnable blocks of the Markdown pages and the README's command table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- runnable(?: exit=(\d+))? -->$")


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository
    line: int  # the marker's line, 1-based
    exit: int
    script: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def runnable_blocks(path: Path) -> list[Block]:
    """Every ```sh block right after a `<!-- runnable -->` line; a marker before anything else is an error."""
    lines = path.read_text().splitlines()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        where = f"{name}:{i + 1}"
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            raise ValueError(f"{where}: a runnable marker must be followed at once by a ```sh block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{where}: the ```sh block after the runnable marker is not closed")
        blocks.append(Block(name, i + 1, int(m[1] or 0), "\n".join(lines[i + 2:end])))
    return blocks


def command_table(text: str, heading: str = "## Commands") -> dict[str, str]:
    """The first column's `gpushare ...` command (words up to the first option or argument) -> the row."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(gpushare(?: [a-z][a-z-]*)+)(?:[ `])", line)
        if m:
            words = [w for w in m[1].split() if w == w.lower()]
            rows[" ".join(words)] = line
    return rows
