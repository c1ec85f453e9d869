"""`gpushare node install`: what a GPU node needs on disk besides the package.

``plan_install`` is pure: the policy's values in, the paths to write out
(``Want``: a file with its text, or a directory; mode and owner), in node
terms (no root prefix). ``decide`` compares one ``Want`` with what is there
(``Found``, read by ``observe``) and says what to do; ``apply`` does it,
files through ``atomic.atomic_write``. ``--root`` prefixes every path (image
builds, tests); the node config still names paths as the node sees them.

The interpreter and every directory it imports from (and the package's own
tree) must be root's and writable by nobody else, on every component of
their paths up to / (``code_problems``): the hooks run that code as root on
every node, so a group-writable venv would give that group root. Anything
else is refused with each path and its reason, and nothing is written.

What is installed:

- the hook scripts, each ``#!<python> -IS`` and four lines (README "Node
  runtime"): the prolog and epilog at the policy's ``cluster.hooks.prolog`` /
  ``cluster.hooks.epilog`` (when set), the task prolog at
  ``cluster.hooks.task_prolog`` (default /usr/local/bin/gpushare-task-prolog),
  the health check at ``cluster.health.program`` (when the policy turns it
  on; the path the rendered ``HealthCheckProgram`` names), root 0755. ``-I``
  ignores the environment, ``-S`` skips ``site`` (its .pth files: setuptools'
  distutils hack, editable finders), so the script puts back the import
  directories ``site`` gives the installing interpreter (``probe_import_dirs``,
  at install time) with one ``sys.path.extend`` line. A file already at a
  hook's path that runs the same entry point (pip's console script, when the
  policy names it) is kept; a symbolic link to such a script is replaced by the
  lean script (the script it points to stays);
- ``/etc/gpushare/node.yaml`` (``nodeconfig``): ``policy``, ``state_dir``
  (and ``fake_nvml``, ``mps_control`` when given), root 0644 (the hooks refuse
  a config another user could write);
- the state dir (``cluster.paths.state_dir``), root 0711: a job's user
  reaches its MPS pipe directory and task file by name, but lists nothing;
  the textfile collector and dcgm job mapping dirs when ``cluster.metrics``
  sets them, root 0755 (their exporters read them);
- the boot unit, ``/etc/systemd/system/gpushare-node-boot.service`` (the
  shipped one, ``slurm_gpushare/systemd/``, its ``ExecStart`` running this
  interpreter: ``python -I -m slurm_gpushare.cli node boot``), root 0644,
  enabled as ``systemctl enable`` would: links in ``slurmd.service.requires/``
  (slurmd does not start when it fails) and ``multi-user.target.wants/``.
  systemd reads it at the next boot, or after ``systemctl daemon-reload``.

On a node the policy does not describe (``--outside-policy``: ``plan_outside``)
it installs the same hook scripts, a node config saying ``outside_policy:
yes`` (and the site's health program), and an empty gres include where
gres.conf includes one; nothing else.

Files it writes carry ``# written by gpushare node install`` and a
``# content-sha256:`` line over the rest: such a file, unedited, is replaced
when the wanted text changes; any other file (someone else's, or ours
edited) is refused unless ``force``. A second run finds everything as wanted
and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write, trust_problem
from .paths import NODE_CONFIG, OUTSIDE, SCRIPT_MODULES, _absolute

MARK = "# written by gpushare node install"
_HASH = "# content-sha256: "
DEFAULT_TASK_PROLOG = "/usr/local/bin/gpushare-task-prolog"
ROOT_UID = ROOT_GID = 0


@dataclass(frozen=True)
class Want:
    path: str  # as the node sees it
    kind: str  # "file", "dir" or "link" (``text``: where it leads, as the node sees it)
    mode: int
    what: str
    text: str | None = None
    uid: int = ROOT_UID
    gid: int = ROOT_GID
    accepts: str | None = None  # a line whose presence makes another script at the path (or a link to one) as good


@dataclass(frozen=True)
class Found:
    kind: str  # "missing", "file", "dir", "link", "other"
    mode: int = 0
    uid: int = -1
    gid: int = -1
    text: str | None = None  # a file's text; a link's: that of the regular file it leads to
    target: str | None = None  # a link's: where it leads


@dataclass(frozen=True)
class Step:
    want: Want
    status: str  # "create", "update", "fix", "unchanged", "refuse"
    detail: str = ""


# ---- the marked files ---------------------------------------------------------------


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def marked(body: str, shebang: str | None = None) -> str:
    """``body`` with the mark and its hash (after the shebang line, which must stay first)."""
    head = [] if shebang is None else [shebang + "\n"]
    rest = body.splitlines(keepends=True)
    return "".join(head + [MARK + "\n", _HASH + _digest(head + rest) + "\n"] + rest)


def ours(text: str) -> bool:
    """Written by us and not edited since: the mark, and a hash that matches everything else."""
    lines = text.splitlines(keepends=True)
    at = 1 if lines and lines[0].startswith("#!") else 0
    if len(lines) < at + 2 or lines[at].rstrip("\n") != MARK or not lines[at + 1].startswith(_HASH):
        return False
    return lines[at + 1][len(_HASH) :].strip() == _digest(lines[:at] + lines[at + 2 :])


# ---- planning (pure) ------------------------------------------------------------------


PROLOG, EPILOG, TASK_PROLOG, HEALTH, NS_CAPS = (
    SCRIPT_MODULES[k] for k in ("prolog", "epilog", "task_prolog", "health", "ns_caps")
)
# pip's console scripts import the same modules, but for the task prolog's, which goes through slurm_gpushare.hooks
TASK_PROLOG_CONSOLE = "slurm_gpushare.hooks.taskprolog"


def entry(module: str) -> str:
    """The line that imports a hook's ``main``: pip's console script for it has the same line."""
    return f"from {module} import main"


def hook_script(python: str, import_dirs: Sequence[str], module: str) -> str:
    """A hook as a lean script. ``-IS`` is one word: the kernel passes whatever follows the interpreter on the
    ``#!`` line as a single argument, and Python reads ``-I -S`` there as an unknown option."""
    path = f"import sys\nsys.path.extend({list(import_dirs)!r})\n" if import_dirs else ""
    return marked(f"{path}{entry(module)}\nraise SystemExit(main())\n", f"#!{python} -IS")


def import_dirs(bare: Sequence[str], with_site: Sequence[str], package: str) -> list[str]:
    """What ``site`` adds to an interpreter's import path (``with_site`` beyond ``bare``, in order, once each):
    what a ``-S`` script must add itself. ``package``: the directory slurm_gpushare was imported from; ValueError
    when neither list leads to it (an import hook that a .pth file installs, e.g. an editable install's finder,
    which ``-S`` skips)."""
    added = list(dict.fromkeys(d for d in with_site if d and d not in bare))
    if os.path.dirname(package.rstrip("/")) not in (*bare, *added):
        raise ValueError(
            f"slurm_gpushare is imported from {package} through an import hook (a .pth file), which the "
            "hook scripts (python -S) skip: install the package so that its parent directory is on the "
            "import path (pip install without -e, or an editable install in compat mode)"
        )
    return added


_PROBE = (
    "import json, sys; bare = list(sys.path); import site; site.main(); import slurm_gpushare; "
    "print(json.dumps([bare, sys.path, slurm_gpushare.__path__[0]]))"
)


def probe_import_dirs(python: str, runner=None) -> list[str]:
    """``import_dirs`` of ``python`` as the hook scripts start it (``-I -S``, then ``site.main()``: what ``-S``
    skipped), measured in a fresh process: the caller's own path (its script's directory, PYTHONPATH, what it
    inserted) stays out. ValueError when the interpreter cannot import the package."""
    from ..proc import run

    done = (runner or run)([python, "-I", "-S", "-c", _PROBE], env={}, timeout=60, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise ValueError(
            f"{python} -I cannot import slurm_gpushare ({tail[-1] if tail else f'exit {done.returncode}'})"
        )
    bare, with_site, package = json.loads(done.stdout)
    return import_dirs(bare, with_site, package)


# ---- the code root runs: root's, and nobody else may change it ---------------------------------------


@dataclass(frozen=True)
class Trust:
    """Whose code root may run: files and directories owned by ``owner`` (root) that neither their group nor
    others may write, on every component of the path up to / (as ssh's StrictModes). ``lstat`` and
    ``realpath`` read the disk (tests pass stand-ins)."""

    owner: int = ROOT_UID
    lstat: Callable[[str], os.stat_result] = os.lstat
    realpath: Callable[[str], str] = os.path.realpath


TRUST = Trust()
PACKAGE_ENTRIES = 20000  # the most entries of the package's tree checked (a wheel has a few hundred)


def path_problems(path: str, what: str, trust: Trust | None = None) -> list[str]:
    """Why root must not run or import ``path`` (an empty list: it may): each component, of the path as named
    and of the file it leads to, must be ``trust.owner``'s and, but for a symbolic link, writable by nobody
    else. A component that does not exist is skipped (its parent is checked)."""
    trust = trust or TRUST
    out: list[str] = []
    for named in dict.fromkeys([os.path.abspath(path), trust.realpath(path)]):
        for part in _components(named):
            problem = _component_problem(part, trust)
            if problem:
                out.append(f"{what} {path}: {problem}")
    return list(dict.fromkeys(out))


def _components(path: str) -> list[str]:
    """``path`` and each directory above it, up to /."""
    out = [path]
    while out[-1] != os.path.dirname(out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out


def _component_problem(part: str, trust: Trust) -> str | None:
    try:
        info = trust.lstat(part)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{part} cannot be checked ({exc.strerror or exc})"
    return trust_problem(info, part, trust.owner)


def code_problems(python: str, import_path: Sequence[str], package: str, trust: Trust | None = None) -> list[str]:
    """Why the hook scripts must not run ``python`` with ``import_path`` (every directory the interpreter
    imports from) and the package at ``package`` as root: a list naming each path and its reason (empty: they
    may). Whoever may change any of them would run code as root on every job's start and end."""
    trust = trust or TRUST
    out = path_problems(python, "interpreter", trust)
    for where in import_path:
        out += path_problems(where, "import directory", trust)
    out += path_problems(package, "package directory", trust)
    return list(dict.fromkeys(out + _tree_problems(package, trust)))


def _tree_problems(top: str, trust: Trust) -> list[str]:
    """Each file and directory below ``top`` (links not followed), checked as ``_component_problem`` does."""
    out: list[str] = []
    seen, pending = 0, [top]
    while pending and seen < PACKAGE_ENTRIES:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            problem = _component_problem(entry.path, trust)
            if problem:
                out.append(f"package file {entry.path}: {problem}")
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return out


_TRUST_PROBE = (
    "import json, sys; import site; site.main(); import slurm_gpushare; "
    "print(json.dumps([sys.path, slurm_gpushare.__path__[0]]))"
)


def probe_code(python: str, runner=None) -> tuple[list[str], str]:
    """(every directory ``python`` imports from as a hook script starts it, the package's directory)."""
    from ..proc import run

    done = (runner or run)([python, "-I", "-S", "-c", _TRUST_PROBE], env={}, timeout=60, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise ValueError(
            f"{python} -I cannot import slurm_gpushare ({tail[-1] if tail else f'exit {done.returncode}'})"
        )
    import_path, package = json.loads(done.stdout)
    return [d for d in import_path if d], package


def node_config_text(values: dict[str, str]) -> str:
    body = "# read by the gpushare node hooks (format: slurm_gpushare/node/nodeconfig.py)\n"
    body += "".join(f"{key}: {value}\n" for key, value in values.items())
    return marked(body)


def script_wants(
    *,
    python: str,
    import_dirs: Sequence[str],
    task_prolog: str | None = None,
    prolog: str | None = None,
    epilog: str | None = None,
    health_program: str | None = None,
    ns_caps: str | None = None,
) -> list[Want]:
    """The hook scripts at the given paths (None: not installed; the task prolog has a default). ``ns_caps``:
    job_container.conf's CloneNSScript where per-job MIG isolates its jobs (render.context.ns_caps_path)."""
    _check_paths(
        python=python,
        prolog=prolog,
        epilog=epilog,
        task_prolog=task_prolog,
        health_program=health_program,
        ns_caps=ns_caps,
    )
    for where in import_dirs:
        if not _absolute(where):
            raise ValueError(
                f"{python}'s import path has {where!r}, not an absolute path of letters, digits and "
                "_./+- (the hook scripts carry it in their source as it is): install the package under "
                "a path that needs no quoting"
            )
    scripts = [
        (prolog, "prolog (cluster.hooks.prolog)", PROLOG, PROLOG),
        (epilog, "epilog (cluster.hooks.epilog)", EPILOG, EPILOG),
        (
            task_prolog or DEFAULT_TASK_PROLOG,
            "task prolog (cluster.hooks.task_prolog)",
            TASK_PROLOG,
            TASK_PROLOG_CONSOLE,
        ),
        (health_program, "health check (cluster.health.program, HealthCheckProgram)", HEALTH, HEALTH),
        (ns_caps, "namespace capabilities (job_container.conf CloneNSScript)", NS_CAPS, NS_CAPS),
    ]
    return [
        Want(path, "file", 0o755, what, hook_script(python, import_dirs, module), accepts=entry(console))
        for path, what, module, console in scripts
        if path
    ]


def _check_paths(**values: str | None) -> None:
    for name, value in values.items():
        if value is not None and not _absolute(value):
            raise ValueError(
                f"{name}: {value!r} is not an absolute path of letters, digits and _./+- (what node.yaml accepts)"
            )


def plan_install(
    *,
    python: str,
    import_dirs: Sequence[str],
    policy: str,
    state_dir: str,
    task_prolog: str | None = None,
    prolog: str | None = None,
    epilog: str | None = None,
    textfile_dir: str | None = None,
    dcgm_job_mapping_dir: str | None = None,
    fake_nvml: str | None = None,
    mps_control: str | None = None,
    node_config: str = NODE_CONFIG,
    health_program: str | None = None,
    live_policy: str | None = None,
    boot_unit: tuple[str, str] | None = None,
    ns_caps: str | None = None,
) -> list[Want]:
    """What a node needs, in order (directories before what may lie in them). ``import_dirs``: what ``site``
    gives ``python`` (``probe_import_dirs``), written into the hook scripts. ``prolog``, ``epilog``: the
    policy's ``cluster.hooks`` (None: not installed). ``health_program``: the policy's
    ``cluster.health.program`` (None: the health check is off, nothing installed for it). ``live_policy``: the
    file the live planner writes when the policy turns it on (node.yaml names it, so the hooks follow the
    live layout while it exists; None: the live planner is off). ``boot_unit``: (name, text) of the shipped
    boot unit, installed and enabled (``boot_unit_wants``; None: not installed)."""
    _check_paths(
        policy=policy, state_dir=state_dir, fake_nvml=fake_nvml, mps_control=mps_control, live_policy=live_policy
    )
    values = {"policy": policy, "state_dir": state_dir.rstrip("/") or "/"}
    extra = {"fake_nvml": fake_nvml, "mps_control": mps_control, "live_policy": live_policy}
    values.update({key: value for key, value in extra.items() if value})
    wants = [Want(values["state_dir"], "dir", 0o711, "state dir (cluster.paths.state_dir)")]
    if textfile_dir:
        wants.append(
            Want(textfile_dir.rstrip("/"), "dir", 0o755, "textfile collector dir (cluster.metrics.textfile_dir)")
        )
    if dcgm_job_mapping_dir:
        wants.append(
            Want(
                dcgm_job_mapping_dir.rstrip("/"),
                "dir",
                0o755,
                "dcgm job mapping dir (cluster.metrics.dcgm_job_mapping_dir)",
            )
        )
    wants.append(Want(node_config, "file", 0o644, "node config", node_config_text(values)))
    if boot_unit is not None:
        wants += boot_unit_wants(python, boot_unit[1], boot_unit[0], node_config)
    return wants + script_wants(
        python=python,
        import_dirs=import_dirs,
        task_prolog=task_prolog,
        prolog=prolog,
        epilog=epilog,
        health_program=health_program,
        ns_caps=ns_caps,
    )


def plan_outside(
    *,
    python: str,
    import_dirs: Sequence[str],
    task_prolog: str | None = None,
    prolog: str | None = None,
    epilog: str | None = None,
    health_program: str | None = None,
    site_health_program: str | None = None,
    ns_caps: str | None = None,
    gres_include: str | None = None,
    node_config: str = NODE_CONFIG,
) -> list[Want]:
    """What a node outside the policy needs, which the merged slurm.conf still gives the product's hooks: the
    same hook scripts (Slurm runs them there too), a node config that says ``outside_policy: yes`` (with the
    site's health program, which ours runs alone there), and, where gres.conf includes ``gres_include`` on every
    node, that file empty. No state dir, metrics dirs or boot unit: nothing of ours runs there."""
    _check_paths(site_health_program=site_health_program, gres_include=gres_include)
    values = {OUTSIDE: "yes"}
    if health_program and site_health_program:
        values["site_health_program"] = site_health_program
    wants = [Want(node_config, "file", 0o644, "node config (outside the policy)", node_config_text(values))]
    if gres_include:
        what = "gres include (cluster.paths.gres_include), empty: gres.conf includes it on every node"
        wants.append(Want(gres_include, "file", 0o644, what, ""))
    scripts = script_wants(
        python=python,
        import_dirs=import_dirs,
        task_prolog=task_prolog,
        prolog=prolog,
        epilog=epilog,
        health_program=health_program,
        ns_caps=ns_caps,
    )
    # no cluster.hooks.task_prolog: slurm.conf names no TaskProlog of ours, so none at the default path either
    return wants + [w for w in scripts if task_prolog or w.accepts != entry(TASK_PROLOG_CONSOLE)]


SYSTEMD_DIR = "/etc/systemd/system"


def boot_unit_wants(python: str, unit: str, name: str, node_config: str = NODE_CONFIG) -> list[Want]:
    """The boot unit (``unit``: the shipped text, called ``name``) with its ExecStart running ``python``, and
    the links that enable it, as ``systemctl enable`` makes them from its [Install] section."""
    start = f"ExecStart={python} -I -m slurm_gpushare.cli node boot --node-config {node_config}"
    lines = [start if line.startswith("ExecStart=") else line for line in unit.splitlines()]
    path = f"{SYSTEMD_DIR}/{name}"
    wants = [Want(path, "file", 0o644, "boot unit (gpushare node boot before slurmd)", marked("\n".join(lines) + "\n"))]
    for key, suffix in (("RequiredBy", "requires"), ("WantedBy", "wants")):
        for by in (w for line in lines if line.startswith(f"{key}=") for w in line.split("=", 1)[1].split()):
            folder = f"{SYSTEMD_DIR}/{by}.{suffix}"
            wants.append(Want(folder, "dir", 0o755, f"systemd {by} {key} directory"))
            wants.append(Want(f"{folder}/{name}", "link", 0o777, f"boot unit enabled ({key}={by})", path))
    return wants


def decide(want: Want, found: Found, force: bool = False, owners: bool = True) -> Step:
    """What to do with one path. ``owners``: whether owners can be set (root) and so are compared."""
    if want.kind == "link":
        return _decide_link(want, found, force)
    owner_ok = not owners or (found.uid, found.gid) == (want.uid, want.gid)
    attrs_ok = found.mode == want.mode and owner_ok
    attrs = _attrs(want, found, owners)
    if want.kind == "dir":
        if found.kind == "missing":
            return Step(want, "create")
        if found.kind != "dir":
            return Step(want, "refuse", f"is a {found.kind}, not a directory: remove it, then run again")
        return Step(want, "unchanged") if attrs_ok else Step(want, "fix", attrs)
    if found.kind == "missing":
        return Step(want, "create")
    if found.kind == "link" and _runs_entry(want, found):
        return Step(
            want,
            "update",
            "a link to a script that runs the same entry point (the package's console "
            "script); replaced by the lean script, the script it leads to stays",
        )
    if found.kind != "file":
        return Step(want, "refuse", f"is a {found.kind}, not a regular file: remove it, then run again")
    if found.text == want.text:
        return Step(want, "unchanged") if attrs_ok else Step(want, "fix", attrs)
    if _runs_entry(want, found) and found.text is not None and not ours(found.text):  # a script: it has text
        detail = "another script that runs the same entry point (the package's console script), kept"
        return Step(want, "unchanged", detail) if attrs_ok else Step(want, "fix", f"{attrs}; {detail}")
    if found.text is not None and ours(found.text):
        return Step(want, "update", "content changed")
    why = (
        "edited since gpushare node install wrote it"
        if found.text and MARK in found.text
        else "not written by gpushare node install"
    )
    if force:
        return Step(want, "update", f"{why}; replaced (--force)")
    return Step(want, "refuse", f"{why}: move it away or merge it by hand, or run again with --force to replace it")


def _decide_link(want: Want, found: Found, force: bool) -> Step:
    if found.kind == "missing":
        return Step(want, "create")
    if found.kind == "link" and found.target == want.text:
        return Step(want, "unchanged")
    what = f"a link to {found.target}" if found.kind == "link" else f"a {found.kind}"
    if force:
        return Step(want, "update", f"{what}; replaced (--force)")
    return Step(want, "refuse", f"is {what}, not a link to {want.text}: remove it, or run again with --force")


def _runs_entry(want: Want, found: Found) -> bool:
    """What was found is a script (``#!``) with the line ``want`` accepts as one of its lines."""
    lines = (found.text or "").splitlines()
    return bool(want.accepts and lines and lines[0].startswith("#!") and want.accepts in (x.strip() for x in lines))


def _attrs(want: Want, found: Found, owners: bool) -> str:
    parts = []
    if found.mode != want.mode:
        parts.append(f"mode {found.mode:04o} -> {want.mode:04o}")
    if owners and (found.uid, found.gid) != (want.uid, want.gid):
        parts.append(f"owner {found.uid}:{found.gid} -> {want.uid}:{want.gid}")
    return ", ".join(parts)


# ---- the disk -----------------------------------------------------------------------------


def on_disk(root: str | Path, path: str) -> Path:
    """``path`` under ``root`` ("/" means the path itself)."""
    return Path(str(root).rstrip("/") + path) if str(root).rstrip("/") else Path(path)


def observe(target: Path) -> Found:
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return Found("missing")
    mode, uid, gid = stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid
    if stat.S_ISLNK(info.st_mode):
        return Found("link", mode, uid, gid, _text(target) if target.is_file() else None, os.readlink(target))
    if stat.S_ISDIR(info.st_mode):
        return Found("dir", mode, uid, gid)
    if not stat.S_ISREG(info.st_mode):
        return Found("other", mode, uid, gid)
    return Found("file", mode, uid, gid, _text(target))


def _text(target: Path) -> str | None:
    try:
        return target.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def can_set_owners() -> bool:
    return os.geteuid() == 0


def steps(wants: list[Want], root: str | Path = "/", force: bool = False) -> list[Step]:
    owners = can_set_owners()
    return [decide(w, observe(on_disk(root, w.path)), force, owners) for w in wants]


def apply(plan: list[Step], root: str | Path = "/") -> None:
    """Carry out every step but the unchanged and refused ones."""
    owners = can_set_owners()
    for step in plan:
        want, target = step.want, on_disk(root, step.want.path)
        if step.status in ("unchanged", "refuse"):
            continue
        if want.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
            os.chmod(target, want.mode)
        elif want.kind == "link":
            assert want.text is not None  # a wanted link has its target
            _link(target, want.text)
        elif step.status in ("create", "update"):
            assert want.text is not None  # only a file is created or updated, and a wanted file has its text
            atomic_write(target, want.text, want.mode)
        else:
            os.chmod(target, want.mode)
        if owners:
            os.chown(target, want.uid, want.gid, follow_symlinks=False)


def _link(target: Path, to: str) -> None:
    """A symbolic link at ``target`` to ``to``, put in place by a rename (a link or file there is replaced)."""
    temporary = target.with_name(f".{target.name}.gpushare-new")
    temporary.unlink(missing_ok=True)
    os.symlink(to, temporary)
    os.replace(temporary, target)


def lines(plan: list[Step], root: str | Path = "/", dry_run: bool = False) -> list[str]:
    """One line per path: what was (or would be) done."""
    done = {"create": "created", "update": "updated", "fix": "fixed", "unchanged": "unchanged", "refuse": "refused"}
    would = {"create": "would create", "update": "would update", "fix": "would fix"}
    out = []
    for step in plan:
        verb = would.get(step.status, done[step.status]) if dry_run else done[step.status]
        detail = f" ({step.detail})" if step.detail else ""
        out.append(f"{verb}: {on_disk(root, step.want.path)}: {step.want.what}{detail}")
    if not can_set_owners():
        out.append(f"note: not root (uid {os.geteuid()}): owners left as they are; run as root on a node")
    return out
