"""slurm.conf and gres.conf lines read as Slurm reads them (src/common/parse_config.c).

A line holds ``Key=Value`` pairs separated by blanks; keys are case-insensitive; a value may be
double-quoted; ``#`` starts a comment (``\\#`` is a literal ``#``). A line whose first key is
NodeName, PartitionName, NodeSet, DownNodes or (in gres.conf) carries Name= is one record: its
pairs belong together. Every other pair is a key of its own. The raw text of each line is kept,
so a merge can leave a line exactly as the site wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOP = "slurm.conf"  # Line.file of the top file's lines
RECORD_KEYS = frozenset({"nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"})
_PAIR = re.compile(r'\s*([A-Za-z][A-Za-z0-9_]*)(?:=("(?:[^"]*)"|\S*))?')
_INCLUDE = re.compile(r"(include)\s+(\S+)", re.IGNORECASE)  # parse_config.c _parse_include_directive


@dataclass(frozen=True)
class Pair:
    key: str  # as written
    value: str  # quotes removed
    quoted: bool = False  # written in double quotes (kept so when written again)

    @property
    def name(self) -> str:
        return self.key.lower()


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in its file
    raw: str  # the line as written, without its newline
    pairs: tuple[Pair, ...]
    file: str = TOP  # the file it is in: TOP, or the path of a file slurm.conf includes

    @property
    def included(self) -> bool:
        """In a file slurm.conf includes (gpushare never edits those)."""
        return self.file != TOP

    @property
    def where(self) -> str:
        return f"{self.file} line {self.number}"

    @property
    def record(self) -> str | None:
        """'nodename', 'partitionname', ... when the line is one record, else None."""
        return self.pairs[0].name if self.pairs and self.pairs[0].name in RECORD_KEYS else None

    @property
    def first(self) -> Pair | None:
        return self.pairs[0] if self.pairs else None

    def get(self, name: str) -> str | None:
        return next((p.value for p in self.pairs if p.name == name.lower()), None)


def strip_comment(text: str) -> str:
    """The text before an unescaped '#' (Slurm's _strip_comments)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 2] == "#":
            out.append("#")
            i += 2
            continue
        if text[i] == "#":
            break
        out.append(text[i])
        i += 1
    return "".join(out)


def parse_pairs(text: str) -> tuple[Pair, ...]:
    body, pairs, pos = strip_comment(text).strip(), [], 0
    include = _INCLUDE.match(body)
    if include:
        return (Pair(include[1], include[2]),)
    while pos < len(body):
        m = _PAIR.match(body, pos)
        if m is None or m.end() == pos:
            break
        value = m[2] or ""
        quoted = len(value) > 1 and value.startswith('"') and value.endswith('"')
        pairs.append(Pair(m[1], value[1:-1] if quoted else value, quoted))
        pos = m.end()
    return tuple(pairs)


def parse(text: str, file: str = TOP) -> list[Line]:
    """Every line of ``text`` (comments and blanks too, with no pairs); ``file``: where it is."""
    return [Line(i, raw, parse_pairs(raw), file) for i, raw in enumerate(text.splitlines(), 1)]


def keys(lines: list[Line]) -> dict[str, list[tuple[Line, Pair]]]:
    """The plain keys (not records) by lower-case name, each with every line that sets it, in order."""
    out: dict[str, list[tuple[Line, Pair]]] = {}
    for line in lines:
        if line.record is None:
            for pair in line.pairs:
                out.setdefault(pair.name, []).append((line, pair))
    return out


def quote(value: str) -> str:
    """A value as slurm.conf needs it written: quoted when it holds a blank."""
    return f'"{value}"' if any(c.isspace() for c in value) else value


def render_pairs(pairs: list[Pair]) -> str:
    return " ".join(f'{p.key}="{p.value}"' if p.quoted else f"{p.key}={quote(p.value)}" for p in pairs)


def items(value: str) -> list[str]:
    """A comma-separated list's items, blanks dropped."""
    return [x.strip() for x in value.split(",") if x.strip()]
