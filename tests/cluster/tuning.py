"""Slurm settings lowered for a test cluster of its own, so a test waits on events rather than on defaults.

Some scenarios wait for Slurm's clocks: a requeued job may start again only ``cred_expire + 1`` seconds after
its requeue (``AuthInfo=cred_expire``, default 120 s; job_mgr.c, Slurm 24.11), and slurmd runs the health
check only every ``HealthCheckInterval``. A module that does not depend on those defaults runs its own
compose project with them lowered: the policy's rendering with ``Key=Value`` lines replaced (or, when the
rendering has no such key, appended under a comment that says so). The product's rendering for sites is
unchanged; only the test cluster's conf dir differs, and its slurm.conf then reads as an edited file.

    write, files = tuned(lambda work: my_policy(work / "p.yaml"), {"AuthInfo": "cred_expire=30"})
    yield from own_cluster("name", PROJECT, write, "KEEP_ENV", conf_files=files)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from slurm_gpushare.policy import Site, load_file
from slurm_gpushare.render import render_all

# A requeued job starts again cred_expire + 1 s after its requeue; 30 s leaves room for a prolog on a loaded
# machine (the credential must still be valid when slurmd checks it) and spares 90 s per requeue.
FAST_REQUEUE = {"AuthInfo": "cred_expire=30"}


def set_keys(conf: str, settings: dict[str, str]) -> str:
    """``conf`` (slurm.conf text) with each ``Key=Value`` of ``settings`` in place of the key's line, or
    appended under a test-only comment when the text has none."""
    added = []
    for key, value in settings.items():
        line = f"{key}={value}"
        pattern = re.compile(rf"^{re.escape(key)}=.*$", re.M | re.I)
        if pattern.search(conf):
            conf = pattern.sub(line.replace("\\", "\\\\"), conf, count=1)
        else:
            added.append(line)
    if added:
        conf = conf.rstrip("\n") + "\n\n# ---- test cluster only (tests/cluster/tuning.py): shorter waits ----\n"
        conf += "\n".join(added) + "\n"
    return conf


def tuned_files(site: Site, settings: dict[str, str]) -> dict[str, str]:
    """The site's rendered conf dir with ``settings`` set in slurm.conf."""
    files = render_all(site)
    files["slurm.conf"] = set_keys(files["slurm.conf"], settings)
    return files


def tuned(write_policy: Callable[[Path], Path], settings: dict[str, str]):
    """``(write_policy, conf_files)`` for ``own_cluster``: the files are filled when own_cluster writes the
    policy (before it writes the cluster's config), from that policy, with ``settings`` set."""
    files: dict[str, str] = {}

    def write(work: Path) -> Path:
        path = write_policy(work)
        files.clear()
        files.update(tuned_files(load_file(path), settings))
        return path

    return write, files
