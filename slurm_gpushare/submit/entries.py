"""The entries of a tres_per_* string as ``parse`` reads them: a GRES request, or another TRES kept as written.

Records only, importing nothing of submit/: ``routes`` (which ``tables`` imports) rewrites them, ``parse`` (which
imports ``tables``) makes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gres:
    """One GRES request: ``name[:type]:count`` from entry ``raw`` of ``field``."""

    field: str
    name: str
    type: str
    count: int
    raw: str
    alias: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}:{self.type}" if self.type else self.name

    def text(self, prefix: str) -> str:
        return f"{prefix}{self.key}:{self.count}"


@dataclass(frozen=True)
class Other:
    """A non-GRES TRES entry, kept as written."""

    raw: str
