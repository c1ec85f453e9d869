"""The Slurm client: one interface for everything the product reads from and changes in Slurm.

Two backends give the same answers (``model``'s plain data):

- ``CliClient`` (the default; works wherever the Slurm commands do) runs
  them through the Runner and parses ``--json`` (squeue, scontrol show
  node/partition, sshare); sacct and sacctmgr stay ``--parsable2``
  (sacct's JSON is ~25x the bytes for the same jobs and cannot be streamed
  per day as cheaply; sacctmgr's is what ``accounts apply`` was built and
  tested on and its format= columns are exactly the ones compared);
- ``PyslurmClient`` (``pyslurm_backend``) reads jobs, nodes, partitions,
  associations and sacct records through libslurm; what pyslurm does not
  offer (sshare, QOS preemption fields) and every change goes through the
  CLI.

``make_client`` picks one: ``--slurm-backend cli|pyslurm|auto`` or
``$GPUSHARE_SLURM_BACKEND``; ``auto`` takes pyslurm when a child process
could import it (``import pyslurm`` reads slurm.conf at import and kills
the process outright where there is none, so it is never tried in-process),
the answer cached per Slurm configuration in the user's cache directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..proc import Runner, run
from . import commands
from .cli_backend import CliClient, SlurmClientError  # noqa: F401  (the interface's names)
from .interface import SlurmClient
from .model import gres_from_tres

BACKENDS = ("cli", "pyslurm", "auto")
BACKEND_ENV = "GPUSHARE_SLURM_BACKEND"


# ---- the normalised view (`gpushare slurm dump`) ---------------------------------------------------


def dump(
    client: SlurmClient,
    *,
    cluster: str | None = None,
    usage_window: tuple[float, float] | None = None,
    parts: Sequence[str] = ("jobs", "nodes", "partitions", "associations", "usage"),
) -> dict:
    """The client's view as plain JSON-able data, sorted, so two backends can be compared with ==.
    ``job-summaries`` (not in the default parts): the jobs as pollers read them (``job_summaries``)."""
    out: dict = {"backend": client.backend}
    if "jobs" in parts:
        out["jobs"] = [j.to_dict() for j in sorted(client.jobs(), key=lambda j: j.job_id)]
    if "job-summaries" in parts:
        out["job-summaries"] = [j.to_dict() for j in sorted(client.job_summaries(), key=lambda j: j.job_id)]
    if "nodes" in parts:
        out["nodes"] = [n.to_dict() for n in sorted(client.nodes(), key=lambda n: n.name)]
    if "partitions" in parts:
        out["partitions"] = [p.to_dict() for p in sorted(client.partitions(), key=lambda p: p.name)]
    if "associations" in parts:
        rows = client.associations(cluster)
        out["associations"] = sorted(
            (
                {
                    "account": a.account,
                    "user": a.user,
                    "parent": a.parent,
                    "fairshare": a.fairshare,
                    "grp_tres": dict(sorted(a.grp_tres.items())),
                }
                for a in rows
            ),
            key=lambda a: (a["account"], a["user"] or ""),
        )
    if "usage" in parts and usage_window is not None:
        recs = client.usage_source().records(*usage_window)
        out["usage"] = sorted(
            (
                {
                    "job_id": r.job_id,
                    "user": r.user,
                    "account": r.account,
                    "partition": r.partition,
                    "state": r.state.split()[0] if r.state else "",
                    "start": r.start,
                    "end": r.end,
                    "gres": gres_from_tres(r.tres()),
                }
                for r in recs
            ),
            key=lambda r: r["job_id"],
        )
    return out


# ---- choosing a backend -----------------------------------------------------------------------


def make_client(backend: str | None = None, runner: Runner = run, environ=None) -> SlurmClient:
    """The client for ``backend`` ('cli', 'pyslurm', 'auto'; None: $GPUSHARE_SLURM_BACKEND, else 'cli')."""
    environ = os.environ if environ is None else environ
    choice = (backend or environ.get(BACKEND_ENV) or "cli").lower()
    if choice not in BACKENDS:
        raise SlurmClientError(
            f"Slurm backend {choice!r}: expected one of {', '.join(BACKENDS)} (--slurm-backend or ${BACKEND_ENV})"
        )
    if choice == "auto":
        choice = "pyslurm" if pyslurm_usable(environ=environ) else "cli"
    if choice == "pyslurm":
        problem = pyslurm_problem(environ=environ)
        if problem:
            raise SlurmClientError(f"--slurm-backend pyslurm: {problem}; use --slurm-backend cli")
        from .pyslurm_backend import PyslurmClient

        return PyslurmClient(runner)
    return CliClient(runner)


# Every backend is held to the interface by the type checker (mypy in .ci/run): a backend that lacks one of
# SlurmClient's methods, or answers with another signature, fails there. pyslurm_backend is not imported at run
# time here (``import pyslurm`` may end the process).
if TYPE_CHECKING:
    from .pyslurm_backend import PyslurmClient

    _BACKENDS: tuple[type[SlurmClient], ...] = (CliClient, PyslurmClient)


_PROBE = "import pyslurm; print(pyslurm.__version__, '%d.%d' % pyslurm.slurm_api_version()[:2])"


def pyslurm_problem(*, environ=None, runner: Runner = run, cache_dir: Path | None = None) -> str | None:
    """None when pyslurm imports in a child process and matches the Slurm it loads; else why not (cached)."""
    environ = os.environ if environ is None else environ
    key = _cache_key(environ)
    cache = (cache_dir or _cache_dir(environ)) / f"pyslurm-probe-{key}.json"
    try:
        return json.loads(cache.read_text())["problem"]
    except (OSError, ValueError, KeyError):
        pass
    problem = _probe(runner)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"problem": problem}))
    except OSError:
        pass
    return problem


def pyslurm_usable(**kw) -> bool:
    return pyslurm_problem(**kw) is None


def _probe(runner: Runner) -> str | None:
    res = runner([sys.executable, "-c", _PROBE], timeout=30, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()
        return "pyslurm does not import here" + (f" ({tail[-1]})" if tail else f" (exit {res.returncode})")
    words = res.stdout.split()
    if len(words) != 2 or not words[0].startswith(words[1] + "."):
        return f"pyslurm {words[0] if words else '?'} was built for Slurm {' '.join(words[1:]) or '?'}"
    ver = runner(list(commands.VERSION), timeout=30, check=False).stdout.split()  # "slurm 24.11.5"
    running = ver[-1] if ver else "?"
    if not running.startswith(words[1] + "."):
        return f"pyslurm {words[0]} is for Slurm {words[1]}, this host runs Slurm {running}"
    return None


def _cache_dir(environ) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or "/tmp", ".cache")
    return Path(base) / "gpushare"


def _cache_key(environ) -> str:
    """Changes when the Python, the Slurm configuration or the installed pyslurm change."""
    import hashlib

    conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    parts = [sys.executable, conf]
    for path in (conf, *_pyslurm_files()):
        try:
            st = os.stat(path)
            parts.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append(f"{path}:-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _pyslurm_files() -> Iterator[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyslurm")  # finds, never imports
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        yield spec.origin
