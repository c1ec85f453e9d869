"""`gpushare install`: join the site's slurm.conf directory, with a backup that rollback restores byte for byte.

``read_site`` reads what the directory holds today, and every file slurm.conf includes (as Slurm
resolves them); ``plan_install`` (pure) takes the policy, its rendered files and those texts, and
gives the files to write, every change with its reason, and what it refuses. Files slurm.conf
includes are read, never written. ``execute_install``
copies the original bytes (and modes) of every file it will change into
``DIR/.gpushare-backup/<timestamp>/`` with a manifest, then writes each file atomically.
``rollback`` restores the newest backup (files the install created are removed) and marks it
rolled back, so a second rollback undoes the install before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from hostlist import collect_hostlist, expand_hostlist

from ..errors import GpushareError
from ..policy import Site
from ..render.files import JOB_CONTAINER
from ..render.header import header_ok
from . import conf, includes
from .gres import plan_gres_conf
from .gresdiff import gres_changes as diff_gres
from .gresdiff import node_gres
from .jobcontainer import plan_job_container
from .jobsubmit import plan_job_submit
from .merge import OWNED, Change, Options, plan_slurm_conf, unmerge

BACKUP = ".gpushare-backup"
MANIFEST = "manifest.json"
FRAGMENT = "slurm-gpushare.conf"
_MARK = "# Merged by `gpushare install` for this directory's slurm.conf; content-sha256: "


class InstallError(GpushareError):
    """The install would take over what the site set, or cannot read or write the directory."""

    exit_code = 1


@dataclass
class Plan:
    files: dict[str, str] = field(default_factory=dict)  # absolute path -> text to write (changed ones only)
    changes: list[Change] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gres_changed: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (Gres now, Gres after)


def marked(text: str) -> str:
    return f"{_MARK}{hashlib.sha256(text.encode()).hexdigest()}\n{text}"


def marked_ok(text: str) -> bool:
    """The include as `gpushare install` wrote it, unedited."""
    first, _, body = text.partition("\n")
    return first.startswith(_MARK) and first[len(_MARK) :] == hashlib.sha256(body.encode()).hexdigest()


def paths_to_read(site: Site, directory: Path) -> list[Path]:
    own = ("slurm.conf", FRAGMENT, "gres.conf", "job_submit.lua", "cgroup.conf", JOB_CONTAINER)
    names = [directory / n for n in own]
    chained = site.policy.submission.site_lua
    return names + ([Path(chained.path)] if chained else [])


def read_site(site: Site, directory: Path) -> dict[str, str | None]:
    """What ``plan_install`` reads: the directory's files, and every file the site's slurm.conf includes."""
    existing = read_existing(paths_to_read(site, directory))
    top = existing.get(f"{directory}/slurm.conf")
    if top is not None:

        def read(path: str) -> str | None:
            if path not in existing:
                existing.update(read_existing([Path(path)]))
            return existing[path]

        includes.resolve(unmerge(top), str(directory), read)
    return existing


def read_existing(paths: list[Path]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for path in paths:
        try:
            out[str(path)] = path.read_bytes().decode("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            out[str(path)] = None
        except OSError as exc:
            raise InstallError(f"cannot read {path}: {exc.strerror}") from None
    return out


def plan_install(
    site: Site, rendered: dict[str, str], directory: Path, existing: dict[str, str | None], opts: Options
) -> Plan:
    """Every file the install writes and why (pure: ``existing`` is what each path holds, None if absent)."""
    plan, d = Plan(), str(directory)
    slurm_conf = existing.get(f"{d}/slurm.conf")
    if slurm_conf is None:
        raise InstallError(f"{d}/slurm.conf does not exist: a new cluster starts from `gpushare render`'s slurm.conf")
    merged = plan_slurm_conf(slurm_conf, rendered[FRAGMENT], opts, existing.get, d)
    plan.changes += merged.changes
    plan.refusals += merged.refusals
    plan.notes += [f"read {f.path} ({f.by.where} includes it); gpushare never edits it" for f in merged.included]
    plan.notes += merged.notes
    fragment_now = existing.get(f"{d}/{FRAGMENT}")
    if fragment_now is not None and not (marked_ok(fragment_now) or header_ok(fragment_now) or opts.force):
        plan.refusals.append(f"{d}/{FRAGMENT} was edited or not written by gpushare: move it away, or --force")
    site_nodes = frozenset(_site_nodes(merged.site))
    now = node_gres(merged.site) | node_gres(conf.parse(fragment_now) if fragment_now is not None else [])
    plan.gres_changed = diff_gres(now, node_gres(conf.parse(merged.fragment)), opts.policy_nodes)
    gres, gres_changes = plan_gres_conf(
        existing.get(f"{d}/gres.conf"), rendered["gres.conf"], opts.policy_nodes, site_nodes
    )
    plan.changes += gres_changes
    wanted = {f"{d}/slurm.conf": merged.slurm_conf, f"{d}/{FRAGMENT}": marked(merged.fragment), f"{d}/gres.conf": gres}
    if site.cluster.hooks.job_submit_lua:
        chained = site.policy.submission.site_lua
        site_lua = (chained.path, chained.order) if chained else None
        module_now = existing.get(chained.path) if chained else None
        files, changes, refusals = plan_job_submit(
            d, existing.get(f"{d}/job_submit.lua"), rendered["job_submit.lua"], site_lua, module_now, opts.force
        )
        wanted.update(files)
        plan.changes += changes
        plan.refusals += refusals
    if JOB_CONTAINER in rendered:
        text, changes, refusals = plan_job_container(
            existing.get(f"{d}/{JOB_CONTAINER}"), rendered[JOB_CONTAINER], opts
        )
        wanted[f"{d}/{JOB_CONTAINER}"] = text
        plan.changes += changes
        plan.refusals += refusals
    plan.files = {p: t for p, t in wanted.items() if existing.get(p) != t}
    plan.notes += _notes(site, existing.get(f"{d}/cgroup.conf"), gres, site_nodes - opts.policy_nodes)
    plan.notes += _gres_note(plan.gres_changed)
    return plan


def _gres_note(changed: dict[str, tuple[str, str]]) -> list[str]:
    if not changed:
        return []
    each = "; ".join(f"{node} {now} -> {after}" for node, (now, after) in changed.items())
    return [
        f"GRES change on {len(changed)} node(s): {collect_hostlist(list(changed))} ({each}): at the reconfigure "
        "Slurm requeues the jobs holding GRES there, so drain them and wait until they are empty first "
        "(`gpushare install POLICY --gres-changes` prints them as a hostlist; docs/admins/switching.md)"
    ]


def _site_nodes(site: list[conf.Line]) -> list[str]:
    """Every node the site's slurm.conf defines, in the files it includes too."""
    out = []
    for line in site:
        name = line.get("NodeName") if line.record == "nodename" else None
        if name and name.upper() != "DEFAULT":
            out += expand_hostlist(name)
    return out


def _notes(site: Site, cgroup: str | None, gres: str, outside: frozenset[str]) -> list[str]:
    notes = []
    constrained = cgroup is not None and any(
        p.name == "constraindevices" and p.value.lower() == "yes" for line in conf.parse(cgroup) for p in line.pairs
    )
    if not constrained:
        notes.append(
            "cgroup.conf has no ConstrainDevices=yes: jobs would see every GPU; "
            "add it (or copy the rendered cgroup.conf)"
        )
    if outside and f"Include {site.cluster.paths.gres_include}" in gres:
        notes.append(
            f"gres.conf includes {site.cluster.paths.gres_include} on every node: on the nodes outside the policy "
            f"({len(outside)}) it must exist, empty (`gpushare node install --outside-policy` writes it)"
        )
    hooks = outside_hooks(site)
    if outside and hooks:
        notes.append(
            f"nodes outside the policy ({len(outside)}): {collect_hostlist(sorted(outside))}: slurm.conf's "
            f"{', '.join(hooks)} run there too; on each, before the reconfigure, run `gpushare node install "
            "--outside-policy --policy POLICY` (the policy file as the node sees it): the hooks then do nothing of "
            "gpushare's there. Without them the node's first job fails the prolog and drains the node"
        )
    return notes


def outside_hooks(site: Site) -> list[str]:
    """The slurm.conf keys of the include naming a program of ours that slurmd runs on every node (the
    job_container.conf merge gives our clone script to the policy's nodes only)."""
    hooks, health = site.cluster.hooks, site.cluster.health
    named = {
        "Prolog": hooks.prolog,
        "Epilog": hooks.epilog,
        "TaskProlog": hooks.task_prolog,
        "HealthCheckProgram": health.program,
    }
    return [key for key, path in named.items() if path]


# ---- side effects ----------------------------------------------------------------------------------


def execute_install(plan: Plan, directory: Path, now: float | None = None) -> Path | None:
    """Back up every file the plan changes, then write each atomically. The backup directory, or None when
    nothing changes."""
    if not plan.files:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now if now is not None else time.time()))
    backup = directory / BACKUP / stamp
    n = 0
    while backup.exists():
        n += 1
        backup = directory / BACKUP / f"{stamp}.{n}"
    backup.mkdir(parents=True, mode=0o700)
    entries = []
    for i, path in enumerate(sorted(plan.files)):
        entries.append(_save(Path(path), backup, i))
    manifest = {"format": 1, "created": stamp, "files": entries}
    from ..atomic import atomic_write

    atomic_write(backup / MANIFEST, json.dumps(manifest, indent=2) + "\n", mode=0o600)
    for path, text in plan.files.items():
        mode = next((e["mode"] for e in entries if e["path"] == path and e["existed"]), 0o644)
        atomic_write(path, text.encode("utf-8", errors="surrogateescape"), mode=mode)
    return backup


def _save(path: Path, backup: Path, i: int) -> dict:
    from ..atomic import atomic_write

    try:
        data, st = path.read_bytes(), path.stat()
    except FileNotFoundError:
        return {"path": str(path), "existed": False}
    atomic_write(backup / f"file{i}", data, mode=0o600)
    sha = hashlib.sha256(data).hexdigest()
    return {"path": str(path), "existed": True, "copy": f"file{i}", "mode": st.st_mode & 0o7777, "sha256": sha}


def rollback(directory: Path) -> list[str]:
    """Restore the newest backup not yet rolled back; one line per file."""
    from ..atomic import atomic_write

    root = directory / BACKUP
    backups = (
        sorted(p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".rolled-back")) if root.is_dir() else []
    )
    if not backups:
        raise InstallError(f"no install to roll back in {root}")
    backup = backups[-1]
    manifest = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
    copies = {}
    for entry in manifest["files"]:
        if entry["existed"]:
            copies[entry["path"]] = data = (backup / entry["copy"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise InstallError(
                    f"{backup / entry['copy']}: not the bytes of {entry['path']} it backed up; nothing restored"
                )
    lines = []
    for entry in manifest["files"]:
        path = Path(entry["path"])
        if not entry["existed"]:
            path.unlink(missing_ok=True)
            lines.append(f"removed {path} (the install created it)")
            continue
        atomic_write(path, copies[entry["path"]], mode=entry["mode"])
        lines.append(f"restored {path} ({len(copies[entry['path']])} bytes, mode {entry['mode']:04o})")
    os.rename(backup, backup.with_name(backup.name + ".rolled-back"))
    return lines


__all__ = ["OWNED", "InstallError", "Plan", "execute_install", "plan_install", "read_existing", "rollback"]
