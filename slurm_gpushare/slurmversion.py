"""Slurm release numbers, compared as tuples (24.11 < 24.11.5 < 26.05)."""

from __future__ import annotations

import re
from typing import NamedTuple

_RE = re.compile(r"^(\d{2})\.(\d{2})(?:\.(\d+))?$")

OLDEST_SUPPORTED: SlurmVersion  # set below, after the class
TESTED = ("24.11", "26.05")


class SlurmVersion(NamedTuple):
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str | float) -> SlurmVersion:
        """Accept '24.11', '24.11.5' (YAML may hand us 24.11 as a float: refuse that ambiguity)."""
        if not isinstance(text, str):
            raise ValueError(f'{text!r} is not a string; quote it, e.g. "24.11" (YAML reads 24.10 as 24.1)')
        m = _RE.match(text.strip())
        if not m:
            raise ValueError(f'{text!r} is not a Slurm release like "24.11" or "24.11.5"')
        return cls(int(m[1]), int(m[2]), int(m[3] or 0))

    def at_least(self, text: str) -> bool:
        return self >= SlurmVersion.parse(text)

    def __str__(self) -> str:
        base = f"{self.major:02d}.{self.minor:02d}"
        return f"{base}.{self.micro}" if self.micro else base


OLDEST_SUPPORTED = SlurmVersion(23, 11)
