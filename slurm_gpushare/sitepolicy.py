"""Which site policy a user's command reads: --policy, else $GPUSHARE_POLICY, else /etc/gpushare/policy.yaml.

A command a user runs on a login node (`gpushare check`, `gpushare offers`)
must answer for this cluster's policy, never silently for an example, and
say which file it read. Stdlib only: no I/O beyond looking whether a file is there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .errors import GpushareError

SITE_POLICY = Path("/etc/gpushare/policy.yaml")
ENV = "GPUSHARE_POLICY"


class PolicyNotFound(GpushareError):
    """No policy was named and the site's default file is not there."""

    exit_code = 2


def find_policy(
    explicit: str | os.PathLike | None, environ: Mapping[str, str], default: Path = SITE_POLICY
) -> tuple[Path, str]:
    """(the policy file, how it was chosen): ``explicit`` (--policy), else $GPUSHARE_POLICY, else ``default``.

    ``how`` is a few words for the user ("--policy", "$GPUSHARE_POLICY", "the
    site's default"). A named file is returned as named (reading it reports a
    missing one); with nothing named, a missing default is an error that says
    the three ways to name one.
    """
    if explicit is not None and str(explicit) != "":
        return Path(explicit), "--policy"
    named = environ.get(ENV, "")
    if named.strip():
        return Path(named), f"${ENV}"
    if default.is_file():
        return default, "the site's default"
    raise PolicyNotFound(
        f"no site policy: {default} is not there and ${ENV} is not set; name one with --policy FILE "
        f"or export {ENV}=FILE (ask your cluster admins where it is), or install it at {default}"
    )


def describe(path: Path, how: str) -> str:
    """The line a command prints first: 'policy: /etc/gpushare/policy.yaml (the site's default)'."""
    return f"policy: {path} ({how})"
