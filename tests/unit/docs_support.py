"""What the documentation tests share: the runnable blocks of the Markdown pages and the README's command table."""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from slurm_gpushare.cli import main
from tests.conftest import ROOT

DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- runnable(?: exit=(\d+))? -->$")
# Blocks a test cluster runs (tests/cluster/test_install_plain_slurm.py): node=controller (the slurmctld
# host), gpu (every GPU node of the policy), outside (the site's nodes the policy does not describe), all (every
# one of them), mig (the GPU nodes with MIG GPUs).
CLUSTER_MARKER = re.compile(r"^<!-- cluster-runnable node=([a-z]+) -->$")
CLUSTER_ROLES = ("controller", "gpu", "outside", "all", "mig")


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
    return [
        Block(name, line, int(m[1] or 0), script) for name, line, m, script in marked_blocks(path, MARKER, "runnable")
    ]


@dataclass(frozen=True)
class ClusterBlock:
    """A ```sh block marked `<!-- cluster-runnable node=ROLE -->`: run as root, as written, on every node of ROLE
    of a test cluster (tests/cluster/test_install_plain_slurm.py)."""

    page: str
    line: int
    node: str  # one of CLUSTER_ROLES
    script: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def cluster_blocks(path: Path) -> list[ClusterBlock]:
    """Every ```sh block right after a `<!-- cluster-runnable node=ROLE -->` line, in page order."""
    found = marked_blocks(path, CLUSTER_MARKER, "cluster-runnable")
    blocks = [ClusterBlock(name, line, m[1], script) for name, line, m, script in found]
    for b in blocks:
        if b.node not in CLUSTER_ROLES:
            raise ValueError(f"{b.id}: node={b.node} is not one of {', '.join(CLUSTER_ROLES)}")
    return blocks


def marked_blocks(path: Path, marker: re.Pattern, what: str) -> list[tuple[str, int, re.Match, str]]:
    """(page, marker line, the marker's match, the script) of every ```sh block right after a line ``marker``
    matches; a marker followed by anything else, or a block left open, is an error naming the line."""
    lines = path.read_text().splitlines()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    found = []
    for i, line in enumerate(lines):
        m = marker.match(line.strip())
        if not m:
            continue
        where = f"{name}:{i + 1}"
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            raise ValueError(f"{where}: a {what} marker must be followed at once by a ```sh block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{where}: the ```sh block after the {what} marker is not closed")
        found.append((name, i + 1, m, "\n".join(lines[i + 2 : end])))
    return found


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


def gpushare_command_problem(line: str) -> str:
    """For a shell line `gpushare WORDS ... --options`: "" when `gpushare WORDS --help` works and lists every
    option the line gives; what is wrong otherwise."""
    words = shlex.split(line, comments=True)
    path = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z-]*", w), words[1:4]))
    done = CliRunner().invoke(main, [*path, "--help"])
    if done.exit_code != 0 or "Usage: " not in done.output:
        return f"{line}: {done.output}"
    missing = [o for o in (w.split("=", 1)[0] for w in words if w.startswith("--")) if o not in done.output]
    return f"{', '.join(missing)} not options of `gpushare {' '.join(path)}`" if missing else ""
