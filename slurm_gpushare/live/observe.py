"""Observing the cluster for the live planner, one way for the report (``gpushare live report``) and for apply.

What the cluster runs (the live policy file when it exists, else the admin's
policy), the apply side's state file (each node's last change, the weights it
set), the gpushare-relayout reservations (the nodes locked for a change), and
Slurm's queue, running jobs, nodes and recent history (``view.view_from_client``),
in one ``Observation``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import PolicyError, Problem
from ..policy import Site, load_file
from ..policy.load import parse_yaml
from ..slurm.interface import SlurmClient
from ..slurm.relayoutjob import lock_node, locks
from .state import State, StateFile
from .view import ClusterView, live_policy_path, view_from_client

ReadView = Callable[[SlurmClient, Site, float, dict, frozenset], ClusterView]


@dataclass(frozen=True)
class Observation:
    site: Site  # the policy the cluster runs
    doc: dict  # its document
    path: Path  # its file: the live policy, or the admin's when there is none yet
    state: State  # the apply side's state file
    locks: frozenset[str]  # nodes holding a gpushare-relayout reservation (less those released)
    view: ClusterView


def state_path(policy_file: Path) -> Path:
    """The apply side's state file: ``<live policy>-state.json`` beside the live policy."""
    return policy_file.with_name(policy_file.stem + "-state.json")


def policy_file_of(admin: Site) -> Path:
    """The live policy's path (``live.policy_file``, else gpushare-live.yaml beside slurm.conf)."""
    return Path(live_policy_path(admin))


def running_policy(admin: Site, admin_path: Path, policy_file: Path) -> tuple[Site, dict, Path]:
    """The policy the cluster runs now, its document and its file: the live policy when it exists, else the
    admin's."""
    path = policy_file if policy_file.is_file() else Path(admin_path)
    site = load_file(path) if path == policy_file else admin
    return site, policy_document(path), path


def policy_document(path: Path) -> dict:
    """The policy file's YAML document, to edit: a mapping, as loading the file found it (unless it has changed
    since to something no policy is)."""
    doc = parse_yaml(path.read_text(encoding="utf-8"), path.name)
    if not isinstance(doc, dict):
        raise PolicyError(path.name, [Problem("", "the policy must be a YAML mapping with 'version: 1' at the top")])
    return doc


def observe(
    client: SlurmClient,
    admin: Site,
    admin_path: Path,
    store: StateFile,
    now: float,
    *,
    policy_file: Path | None = None,
    release: Callable[[frozenset[str]], frozenset[str]] | None = None,
    read_view: ReadView = view_from_client,
) -> Observation:
    """One look at the cluster. ``release(nodes)``: called with the locked nodes no change in flight owns, before
    Slurm is read; returns those whose lock it deleted (apply releases them, the report leaves them)."""
    site, doc, path = running_policy(admin, admin_path, policy_file or policy_file_of(admin))
    state = store.read()
    locked = frozenset(lock_node(r) for r in locks(client))
    if release is not None:
        locked -= release(locked - set(state.in_flight()))
    view = read_view(client, site, now, state.changes(), locked)
    if state.weights:  # the nodes whose weight the planner set: it puts the policy's back when done
        view = replace(view, steered=dict(state.weights))
    return Observation(site, doc, path, state, locked, view)
