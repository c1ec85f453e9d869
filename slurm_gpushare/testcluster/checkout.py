"""Where the test cluster's docker/ directory is: in a slurm-gpushare source checkout.

The Dockerfiles, compose file and fakes are not in the wheel (they build an
image from the checkout's own wheel), so `gpushare testcluster` needs the
checkout. It looks, in order, at ``$GPUSHARE_CHECKOUT``, the current
directory and the directories above it (the README runs `pip install .` in
the checkout, then the testcluster commands there), and the directory the
package itself lives in (an editable install).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CHECKOUT_ENV = "GPUSHARE_CHECKOUT"
_NAME = 'name = "slurm-gpushare"'


def is_checkout(path: Path) -> bool:
    """A slurm-gpushare source tree: its pyproject.toml names the project, and docker/ has the compose file."""
    try:
        project = (path / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return _NAME in project and (path / "docker" / "docker-compose.yml").is_file()


def candidates(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    found = [Path(environ[CHECKOUT_ENV])] if environ.get(CHECKOUT_ENV) else []
    found += [cwd, *cwd.parents]
    found.append(Path(__file__).resolve().parents[2])  # editable install: the package is in the checkout
    return found


def find_checkout(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The checkout to build the test cluster from, or None (``$GPUSHARE_CHECKOUT``, when set, must be one)."""
    environ = os.environ if environ is None else environ
    looked = candidates(Path.cwd() if cwd is None else cwd, environ)
    if environ.get(CHECKOUT_ENV):
        return looked[0] if is_checkout(looked[0]) else None
    return next((p for p in looked if is_checkout(p)), None)
