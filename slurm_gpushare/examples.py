"""The example policies shipped with the package (etc/ in the source tree)."""

from __future__ import annotations

from pathlib import Path

DEFAULT = "small-lab.yaml"


def examples_dir() -> Path:
    packaged = Path(__file__).resolve().parent / "examples"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[1] / "etc"


def example(name: str = DEFAULT) -> Path:
    return examples_dir() / name


def names() -> list[str]:
    return sorted(p.name for p in examples_dir().glob("*.yaml"))
