"""`gpushare node`: what runs on a GPU node (MIG layout, the node's gres.conf include,
repairs after crashed hooks, safe layout changes).

Thin: load the policy, pick the NVML backend (real, or the fake with
--fake-nvml / GPUSHARE_FAKE_NVML), call node.mig / node.gresconf, print.
Exit codes (cli/errors.py, the same for every command): 0 in sync / done,
1 differs, refused, or the policy has problems, 2 usage or other error.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import GpushareError
from .errors import ErrorsToExitCodes

FAKE_ENV = "GPUSHARE_FAKE_NVML"


class NodeError(GpushareError):
    """The node is not in the policy, or similar problems with the command's inputs."""


def _common(fn):
    """--policy, --node, --fake-nvml: every command that reads a node's GPUs takes them."""
    fn = click.option(
        "--fake-nvml",
        "fake_state",
        envvar=FAKE_ENV,
        type=click.Path(dir_okay=False),
        help=f"Use the fake NVML on this state file (env {FAKE_ENV}); for test clusters only.",
    )(fn)
    fn = click.option("--node", "node_name", default=None, help="Slurm node name (default: this host's short name).")(
        fn
    )
    return click.option(
        "--policy",
        "policy_path",
        required=True,
        type=click.Path(dir_okay=False),
        help="The site policy (e.g. /etc/gpushare/policy.yaml).",
    )(fn)


def _target(policy_path: str, node_name: str | None):
    """(site, node name, its GPU slots)."""
    from ..policy import load_file

    site = load_file(policy_path)
    node = node_name or socket.gethostname().split(".", 1)[0]
    try:
        group = site.group_for_node(node)
    except KeyError as exc:
        raise NodeError(f"{exc.args[0]} ({policy_path}); pass --node NAME") from None
    return site, node, group.gpus


def _backend(fake_state: str | None):
    from ..gpu import open_backend

    if fake_state is not None:
        click.echo(f"gpushare node: using fake NVML state {fake_state} (not the real GPUs)", err=True)
    return open_backend(fake_state)


@click.group(cls=ErrorsToExitCodes)  # its own translation too: `node` also runs without `gpushare`
def node() -> None:
    """Commands for a GPU node: check and apply the policy's MIG layout, write the
    node's gres.conf include from live MIG state, make the GPUs ready before slurmd
    starts (boot), repair what crashed hooks left (reconcile), change a layout safely
    (relayout), build a fake NVML for test clusters."""


@node.group()
def mig() -> None:
    """The policy's MIG layout on this node. Never changes MIG mode."""


@mig.command("assert")
@_common
def mig_assert(policy_path: str, node_name: str | None, fake_state: str | None) -> None:
    """Exit 0 if every GPU is as the policy says, else print the differences and exit 1."""
    from ..node.mig import differences, observe

    _site, name, slots = _target(policy_path, node_name)
    with _backend(fake_state) as backend:
        found = differences(slots, observe(backend, [s.index for s in slots]))
    if found:
        click.echo(f"node {name}: MIG layout differs from the policy:")
        for line in found:
            click.echo(f"  {line}")
        sys.exit(1)
    click.echo(f"node {name}: MIG layout matches the policy")


@mig.command("apply")
@_common
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
def mig_apply(policy_path: str, node_name: str | None, fake_state: str | None, dry_run: bool) -> None:
    """Bring the MIG layout to the policy, changing only GPUs that differ.

    Refused (exit 1) while processes run on a GPU that would change, or when
    MIG mode is off on a GPU the policy shares with MIG."""
    from ..node.mig import apply_actions, differences, observe

    _site, name, slots = _target(policy_path, node_name)
    indexes = [s.index for s in slots]
    with _backend(fake_state) as backend:
        actions = _plan_or_refuse(name, slots, observe(backend, indexes))
        if not actions:
            click.echo(f"node {name}: MIG layout already matches the policy; nothing to do")
            return
        for action in actions:
            click.echo(f"{'would ' if dry_run else ''}{action}")
        if dry_run:
            return
        apply_actions(backend, actions)
        left = differences(slots, observe(backend, indexes))
    if left:
        raise NodeError(f"node {name}: MIG layout still differs after apply:\n  " + "\n  ".join(left))
    click.echo(f"node {name}: MIG layout applied ({len(actions)} actions); now run `gpushare node gres-conf`")


def _plan_or_refuse(name: str, slots, state):
    """The plan, or MigRefused with every reason prefixed by the node name."""
    from ..node.mig import MigRefused, plan_mig

    try:
        return plan_mig(slots, state)
    except MigRefused as exc:
        raise MigRefused([f"node {name}: {r}" for r in exc.reasons]) from None


@node.command("gres-conf")
@_common
@click.option(
    "--out",
    "out",
    default=None,
    help="Where to write it (default: the policy's cluster.paths.gres_include; '-' for stdout).",
)
def gres_conf(policy_path: str, node_name: str | None, fake_state: str | None, out: str | None) -> None:
    """Write this node's gres.conf include (MIG devices) from live MIG state.

    Refused (exit 1) when the live layout differs from the policy, so it never
    disagrees with the slurm.conf `gpushare render` wrote."""
    from ..node.gresconf import live_gres_conf

    site, name, slots = _target(policy_path, node_name)
    with _backend(fake_state) as backend:
        text = live_gres_conf(name, slots, backend)
    if out == "-":
        click.echo(text, nl=False)
        return
    from ..atomic import atomic_write

    target = Path(out or site.cluster.paths.gres_include)
    atomic_write(target, text)
    click.echo(f"node {name}: wrote {target}")


# ---- boot: before slurmd starts (gpushare-node-boot.service) ------------------------------


@node.command("boot")
@click.option(
    "--node-config",
    "node_config",
    default=None,
    type=click.Path(dir_okay=False),
    help="The node hooks' config (default /etc/gpushare/node.yaml, or $GPUSHARE_NODE_CONFIG): the policy is "
    "its live_policy while that file exists, else its policy; its fake_nvml when --fake-nvml is not given.",
)
@click.option("--policy", "policy_path", default=None, type=click.Path(dir_okay=False), help="This policy instead.")
@click.option("--node", "node_name", default=None, help="Slurm node name (default: this host's short name).")
@click.option(
    "--fake-nvml",
    "fake_state",
    envvar=FAKE_ENV,
    type=click.Path(dir_okay=False),
    help=f"Use the fake NVML on this state file (env {FAKE_ENV}); for test clusters only.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done; change nothing.")
def boot(node_config: str | None, policy_path: str | None, node_name: str | None, fake_state, dry_run: bool) -> None:
    """Make this node's GPUs as the policy says before slurmd starts (the gpushare-node-boot
    systemd unit runs it): MIG mode on where the policy shares a GPU with MIG and the GPU
    needs no reset for it (Hopper and later), the MIG layouts, no instance on per-job MIG
    GPUs that no job's journal names, the MPS GPUs' compute modes, then the gres include
    from the live MIG state. Exit 1, changing nothing, when something blocks it (an A100
    or A30 whose MIG mode is off needs a GPU reset; processes on a GPU that would change;
    another GPU model): slurmd, which requires the unit, then stays down. On a node outside
    the policy (node.yaml outside_policy: yes) it changes nothing and exits 0."""
    from ..node.boot import run_boot, write_gres_include
    from ..node.journal import JournalStore
    from ..node.nodeconfig import config_path, read_config

    config = read_config(node_config or config_path())
    if config.outside_policy:  # the hooks do nothing of ours here either: no mode of a GPU is the policy's
        name = node_name or socket.gethostname().split(".", 1)[0]
        click.echo(f"node {name}: outside the policy (outside_policy in {config.path_str}): nothing to do at boot")
        return
    policy, which = _boot_policy(config, policy_path)
    site, name, slots = _target(policy, node_name)
    click.echo(f"node {name}: policy {policy} ({which})")
    if fake_state is None and config.fake_nvml_str is not None:
        fake_state = config.fake_nvml_str
    paths = site.cluster.paths
    with _backend(fake_state) as backend:
        changes = run_boot(name, slots, backend, JournalStore(paths.state_dir), paths.state_dir, click.echo, dry_run)
        if dry_run and changes:
            click.echo(f"would: then write the gres include {paths.gres_include} from the live MIG state")
        else:
            write_gres_include(name, slots, backend, paths.gres_include, click.echo, dry_run)
    done = f"{changes} change(s) {'planned' if dry_run else 'made'}" if changes else "nothing to change"
    click.echo(f"node {name}: {'would be ' if dry_run else ''}ready for slurmd ({done})")


def _boot_policy(config, policy_path: str | None) -> tuple[str, str]:
    """(the policy boot follows, which one it is and why)."""
    if policy_path is not None:
        return policy_path, "--policy"
    if config.live_policy_str is not None and config.policy_str == config.live_policy_str:
        return config.policy_str, f"the live planner's: live_policy in {config.path_str}"
    if config.live_policy_str is not None:
        return config.policy_str, f"the site's: live_policy {config.live_policy_str} not written yet"
    return config.policy_str, f"the site's: policy in {config.path_str}"


# ---- repairs and layout changes (run as root on the node) -------------------------------


@node.command("reconcile")
@_common
@click.option("--dry-run", is_flag=True, help="Print what would be repaired; change nothing.")
def reconcile(policy_path: str, node_name: str | None, fake_state: str | None, dry_run: bool) -> None:
    """Repair what crashed hooks left: journals of jobs Slurm no longer runs here
    (undone as the epilog would), MPS daemons no journal names, half-written files.

    Slurm's view comes from `squeue -w NODE`. MIG drift is reported, not changed
    (use `gpushare node relayout`). When the policy sets cluster.metrics, the
    dcgm-exporter job mapping is rewritten from the running jobs' journals and
    the run is counted in the textfile collector file. Exit 1 when something
    could not be repaired or the MIG layout drifted."""
    import time

    start = time.monotonic()
    seen: dict[str, Any] = {}  # what the run learnt, for its metrics: "site", then "mig"
    try:
        failed, drift = _reconcile(policy_path, node_name, fake_state, dry_run, seen)
    except Exception as exc:
        _reconcile_metrics(seen, exc, None, time.monotonic() - start, dry_run)
        raise
    reason = "unrepaired" if failed else "mig_drift" if drift else None
    _reconcile_metrics(seen, None, reason, time.monotonic() - start, dry_run)
    if failed or drift:
        sys.exit(1)


def _reconcile(policy_path, node_name, fake_state, dry_run: bool, seen: dict) -> tuple[list[str], list[str]]:
    from ..node.epilog import Killer
    from ..node.journal import JournalStore
    from ..node.mig import differences, observe
    from ..node.mps import MpsControl, mps_lock
    from ..node.reconcile import execute_reconcile, plan_for_node, running_jobs
    from ..proc import run
    from ..slurm.cli_backend import CliClient

    site, name, slots = _target(policy_path, node_name)
    seen["site"] = site
    store = JournalStore(site.cluster.paths.state_dir)
    with _backend(fake_state) as backend, store.locked(), mps_lock(site.cluster.paths.state_dir):
        journals = store.all()
        running = running_jobs(CliClient(run, timeout=30), name)
        per_job = tuple(s.index for s in slots if s.share.is_per_job_mig)
        plan = plan_for_node(journals, running, backend, site.cluster.paths.state_dir, store, per_job=per_job)
        live = observe(backend, [s.index for s in slots])
        plan.drift = differences(slots, live)
        seen["mig"] = {s.index: not differences([s], live) for s in slots if s.share.is_mig}
        for line in plan.lines(name):
            click.echo(f"{'would: ' if dry_run and 'kept' not in line else ''}{line}")
        for note in plan.notes:
            click.echo(f"node {name}: note: {note}")
        failed = [] if dry_run else execute_reconcile(plan, store, MpsControl(run), Killer(backend), journals)
        mapping = site.cluster.metrics.dcgm_job_mapping_dir
        if mapping is not None:
            from ..metrics.dcgmjobs import repair

            removed, added = repair(
                mapping, store.all().values() if not dry_run else journals.values(), running, dry_run=dry_run
            )
            for line in removed + added:
                click.echo(f"{'would: ' if dry_run else ''}node {name}: {line}")
        else:
            removed = added = []
    for line in failed:
        click.echo(f"node {name}: NOT repaired: {line}", err=True)
    if not (plan.orphans or plan.daemons or plan.strays or plan.drift or removed or added):
        click.echo(f"node {name}: nothing to reconcile")
    return failed, plan.drift


def _reconcile_metrics(seen: dict, error, reason: str | None, duration: float, dry_run: bool) -> None:
    """Count the run in the textfile collector file (never in a dry run); a failure here is a warning."""
    site = seen.get("site")
    if dry_run or site is None or site.cluster.metrics.textfile_dir is None:
        return
    from ..metrics import textfile

    state_dir = site.cluster.paths.state_dir
    try:
        from ..node.journal import JournalStore
        from ..node.mps import running_daemons

        store = JournalStore(state_dir)
        snapshot = textfile.NodeObservation(
            journals_present=len(store.job_ids()),
            mps_daemons_running=running_daemons(state_dir),
            mig=seen.get("mig", {}),
            replace_mig="mig" in seen,
        )
        try:
            snapshot.jobs = textfile.jobs_of(store.all().values())
        except GpushareError:
            pass
        if error is not None:
            reason = textfile.failure_reason(error)
        textfile.record(
            state_dir,
            site.cluster.metrics.textfile_dir,
            "reconcile",
            "ok" if error is None and reason is None else "failed",
            reason,
            duration,
            snapshot,
        )
    except Exception as exc:  # the repair's outcome is what counts
        click.echo(
            f"gpushare node reconcile: metrics file in {site.cluster.metrics.textfile_dir} not written: "
            f"{type(exc).__name__}: {exc}",
            err=True,
        )


@node.command("health")
@_common
@click.option("--dry-run", is_flag=True, help="Print what would be repaired, drained or resumed; change nothing.")
@click.option(
    "--lost-after",
    type=click.IntRange(1),
    default=None,
    help="Seconds a running batch job may go without its batch slurmstepd here before it is requeued as a "
    "lost launch (default 120).",
)
def health(
    policy_path: str, node_name: str | None, fake_state: str | None, dry_run: bool, lost_after: int | None
) -> None:
    """The health check (slurm.conf HealthCheckProgram; the console script gpushare-node-health
    runs the same from /etc/gpushare/node.yaml): repair what `reconcile` repairs, check the device
    files of this node's gres.conf, the GPUs and MIG layout against the policy and the MPS daemons
    of running jobs; drain with a "gpushare-health:" reason what cannot be repaired; resume a node
    this check drained once it is healthy; never resume a node drained for another reason."""
    from ..node.epilog import Killer
    from ..node.health import run_health
    from ..node.mps import MpsControl
    from ..proc import run
    from ..slurm.cli_backend import CliClient

    site, name, slots = _target(policy_path, node_name)
    paths = site.cluster.paths
    with _backend(fake_state) as backend:
        report = run_health(
            name,
            paths.state_dir,
            Path(paths.slurm_conf_dir) / "gres.conf",
            slots,
            CliClient(run, timeout=15),
            backend,
            MpsControl(run),
            Killer(backend),
            dry_run=dry_run,
            metrics=site.cluster.metrics,
            lost_after=lost_after,
        )
    for line in report.lines():
        click.echo(f"{'would: ' if dry_run else ''}{line}")


@node.command("relayout")
@_common
@click.option(
    "--timeout",
    type=click.FloatRange(1),
    default=600.0,
    show_default=True,
    help="Seconds to wait for GPU jobs to end, and again for the node to register.",
)
@click.option("--poll", type=click.FloatRange(0.1), default=2.0, show_default=True, help="Seconds between checks.")
@click.option(
    "--restart",
    type=click.Choice(["reconfigure", "sighup"]),
    default="reconfigure",
    show_default=True,
    help="How slurmd re-reads gres.conf: `scontrol reconfigure` (slurmctld too: use when slurm.conf "
    "changed), or SIGHUP to this node's slurmd.",
)
@click.option(
    "--slurmd-pid-file",
    default="/run/slurmd.pid",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="For --restart sighup.",
)
@click.option(
    "--node-config",
    "node_config",
    default=None,
    type=click.Path(dir_okay=False),
    help="The node hooks' config (node.yaml): refuse unless the hooks follow --policy (its live_policy, "
    "else policy), and take its fake_nvml when --fake-nvml is not given. The live planner's "
    "relayout job passes it.",
)
def relayout(
    policy_path: str,
    node_name: str | None,
    fake_state: str | None,
    timeout: float,
    poll: float,
    restart: str,
    slurmd_pid_file: str,
    node_config: str | None,
) -> None:
    """Change this node's MIG layout to the policy's, safely: drain, wait for GPU
    jobs, apply, write the gres include, make slurmd re-read it, wait for the
    node to register the new GRES counts, resume. On failure the node stays
    drained with a reason saying what happened (exit 1).

    The policy's slurm.conf (new GRES counts) must be in place on the nodes and
    the controller before this runs: the restart makes slurmctld read it."""
    from ..node.journal import JournalStore
    from ..node.relayout import Relayout
    from ..proc import run
    from ..slurm.cli_backend import CliClient

    if node_config is not None:
        fake_state = _follows(Path(node_config), Path(policy_path), fake_state)
    site, name, _slots = _target(policy_path, node_name)
    with _backend(fake_state) as backend:
        job = Relayout(
            site,
            name,
            backend,
            CliClient(run, timeout=60),
            JournalStore(site.cluster.paths.state_dir),
            restart=restart,
            pid_file=Path(slurmd_pid_file),
            timeout=timeout,
            poll=poll,
            say=click.echo,
        )
        for line in job.run():
            click.echo(line)


def _follows(config_file: Path, policy: Path, fake_state: str | None) -> str | None:
    """The fake NVML to use; NodeError when the node hooks (``config_file``) follow another policy than ``policy``:
    the relayout would apply a layout the prolog then refuses."""
    from ..node.nodeconfig import read_config
    from ..node.relayout import RelayoutError

    config = read_config(config_file)
    if config.policy.resolve() != policy.resolve():
        raise RelayoutError(
            f"{config_file}: the node hooks follow {config.policy}, not --policy {policy}; give "
            f"node.yaml live_policy: {policy} (docker/node-setup.sh writes it when live.enabled)"
        )
    if fake_state is None and config.fake_nvml is not None:
        return str(config.fake_nvml)
    return fake_state


@node.command("install")
@click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The site policy (e.g. /etc/gpushare/policy.yaml); node.yaml names it.",
)
@click.option(
    "--root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Prefix every path with this directory (image builds, tests).",
)
@click.option(
    "--fake-nvml",
    "fake_state",
    default=None,
    envvar=FAKE_ENV,
    help=f"Write fake_nvml: PATH into node.yaml (env {FAKE_ENV}, as the other node commands; test clusters only).",
)
@click.option("--mps-control", default=None, help="Write mps_control: PATH into node.yaml (default: found on PATH).")
@click.option("--force", is_flag=True, help="Replace files gpushare node install did not write (or that were edited).")
@click.option("--dry-run", is_flag=True, help="Print what would be done; change nothing.")
@click.option(
    "--outside-policy",
    is_flag=True,
    help="This node is not in the policy but the merged slurm.conf runs the product's hooks on it: install "
    "hooks that do nothing of gpushare's (the health check runs the site's program only).",
)
@click.option(
    "--node",
    "node_name",
    default=None,
    help="Slurm node name, checked against the policy (default: this host's short name; with --root and "
    "without --node, not checked).",
)
def install(
    policy_path: str,
    root: str,
    fake_state: str | None,
    mps_control: str | None,
    force: bool,
    dry_run: bool,
    outside_policy: bool,
    node_name: str | None,
) -> None:
    """Install what the node hooks need: the hook scripts (prolog, epilog, task
    prolog, health check, at the policy's paths: python -IS, for this
    interpreter and its import directories), /etc/gpushare/node.yaml, the state
    dir and the policy's metrics dirs, and the boot unit
    (/etc/systemd/system/gpushare-node-boot.service, `gpushare node boot` with
    this interpreter before slurmd starts, enabled: slurmd requires it),
    root-owned with fixed modes. A second run
    changes nothing. An interpreter or import directory that is not root's,
    or that its group or others may write (on any component up to /), is
    refused with each path and why, and nothing is written. Files it did
    not write are refused (exit 1) unless --force;
    pip's console script of the same hook at a hook's path is kept, a link to
    it replaced by the script.

    The node's name must be in the policy, else it refuses. On a node the
    policy does not describe that the site's merged slurm.conf reaches (it
    runs the product's Prolog, Epilog, TaskProlog and HealthCheckProgram
    there too), --outside-policy installs the same hook scripts and a
    node.yaml saying outside_policy: yes (with the site's health program),
    and an empty gres include where gres.conf includes one: the hooks then
    do nothing of gpushare's, and no GPU is touched."""
    from ..node import install as inst
    from ..policy import load_file

    site = load_file(policy_path)
    click.echo(_install_node(site, policy_path, node_name, root, outside_policy))
    try:
        _refuse_unsafe_code(inst)
        python, dirs = sys.executable, inst.probe_import_dirs(sys.executable)
        if outside_policy:
            wants = _outside_wants(site, python, dirs)
        else:
            wants = _policy_wants(site, _as_node_sees(policy_path, root), python, dirs, fake_state, mps_control)
    except ValueError as exc:
        raise NodeError(str(exc)) from None
    plan = inst.steps(wants, root, force)
    if not dry_run:
        inst.apply(plan, root)
    _say_installed(inst.lines(plan, root, dry_run), plan, dry_run)


def _install_node(site, policy_path: str, node_name: str | None, root: str, outside: bool) -> str:
    """What node install was told this node is, and why (a line to print); NodeError when the node's name says
    otherwise: a name the policy does not have is a node outside it only when the admin says so, never guessed
    (a typo in the policy's node names would otherwise leave a GPU node of the policy without its hooks)."""
    name = node_name or socket.gethostname().split(".", 1)[0]
    if node_name is None and str(Path(root).resolve()) != "/":
        mode = "outside the policy (--outside-policy)" if outside else "a node of the policy"
        return f"node install: for {mode}; node name not checked (--root without --node: an image)"
    try:
        group = site.group_for_node(name).name
    except KeyError:
        group = None
    if outside and group is not None:
        raise NodeError(
            f"node {name} is in node group {group} of the policy ({policy_path}): it needs the policy's hooks; "
            "run without --outside-policy (or give its Slurm name with --node)"
        )
    if outside:
        return (
            f"node {name}: outside the policy (--outside-policy; no node group of {policy_path} names it): "
            "the hooks do nothing of gpushare's here, the health check runs only the site's program"
        )
    if group is None:
        from hostlist import collect_hostlist

        nodes = collect_hostlist([n for g in site.groups for n in g.nodes])
        raise NodeError(
            f"node {name} is in no node group of the policy ({policy_path}: {nodes}). On a node the "
            "policy does not describe, which the merged slurm.conf still reaches, run `gpushare node install "
            "--outside-policy`; on a node of the policy whose Slurm name is not this host's, pass --node NAME"
        )
    return f"node {name}: node group {group} of the policy"


def _as_node_sees(policy_path: str, root: str) -> str:
    policy = str(Path(policy_path).resolve())
    top = str(Path(root).resolve()).rstrip("/")
    if top and (policy + "/").startswith(top + "/"):
        policy = policy[len(top) :]  # as the node will see it
    return policy


def _policy_wants(site, policy: str, python: str, dirs, fake_state: str | None, mps_control: str | None) -> list:
    """What a node of the policy needs (node.install.plan_install)."""
    from .. import systemd
    from ..live.view import live_policy_path
    from ..node import install as inst
    from ..render.context import job_container, ns_caps_path
    from ..systemd import BOOT_UNIT

    c = site.cluster
    return inst.plan_install(
        python=python,
        import_dirs=dirs,
        policy=policy,
        state_dir=c.paths.state_dir,
        task_prolog=c.hooks.task_prolog,
        prolog=c.hooks.prolog,
        epilog=c.hooks.epilog,
        textfile_dir=c.metrics.textfile_dir,
        dcgm_job_mapping_dir=c.metrics.dcgm_job_mapping_dir,
        fake_nvml=fake_state,
        mps_control=mps_control,
        health_program=c.health.program,
        live_policy=live_policy_path(site) if site.policy.live.enabled else None,
        boot_unit=(BOOT_UNIT, (systemd.DIR / BOOT_UNIT).read_text(encoding="utf-8")),
        ns_caps=ns_caps_path(site) if job_container(site) is not None else None,
    )


def _outside_wants(site, python: str, dirs) -> list:
    """What a node outside the policy needs (node.install.plan_outside): the hooks the merged slurm.conf names."""
    from ..node import install as inst
    from ..render.context import job_container, mig_nodes, ns_caps_path

    c = site.cluster
    return inst.plan_outside(
        python=python,
        import_dirs=dirs,
        task_prolog=c.hooks.task_prolog,
        prolog=c.hooks.prolog,
        epilog=c.hooks.epilog,
        health_program=c.health.program,
        site_health_program=c.health.site_program,
        ns_caps=ns_caps_path(site) if job_container(site) is not None else None,
        gres_include=c.paths.gres_include if mig_nodes(site) else None,
    )


def _refuse_unsafe_code(inst) -> None:
    """NodeError when the hooks would run as root code that others may change (each path and why)."""
    unsafe = inst.code_problems(sys.executable, *inst.probe_code(sys.executable))
    if unsafe:
        raise NodeError(
            "the hooks would run as root code that others may change; nothing installed:\n  "
            + "\n  ".join(unsafe)
            + "\n(make each path root's and not writable by its group or "
            "others, e.g. chown -R root: and chmod -R go-w, or install into a venv that is)"
        )


def _say_installed(lines: list[str], plan, dry_run: bool) -> None:
    """What node install did, path by path, and its outcome; exit 1 when it refused any path."""
    from ..systemd import BOOT_UNIT

    for line in lines:
        click.echo(line)
    if all(s.status == "unchanged" for s in plan):
        click.echo("nothing to do: everything is installed as wanted")
    elif not dry_run and any(s.want.path.endswith(BOOT_UNIT) and s.status in ("create", "update") for s in plan):
        click.echo(f"note: systemd reads {BOOT_UNIT} at the next boot, or now after `systemctl daemon-reload`")
    if any(s.status == "refuse" for s in plan):
        sys.exit(1)


# ---- fake NVML (test clusters) -------------------------------------------------------


def _indexes(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()] if value else []
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of GPU indexes, e.g. 0,1") from None


@node.group("fake-nvml")
def fake_nvml() -> None:
    """Build and poke a fake NVML state for test clusters. Only ever writes the
    state file you name (and its .mig-minors / .lock next to it); a real
    node's GPUs are never touched and never read."""


@fake_nvml.command("init")
@click.option("--state", required=True, type=click.Path(dir_okay=False), help="State file to create.")
@click.option("--model", required=True, help="Catalogue model, e.g. A100-SXM4-40GB (see `gpushare catalogue`).")
@click.option("--count", required=True, type=click.IntRange(1, 32), help="Number of GPUs.")
@click.option("--mig", "mig", default="", help="Comma-separated indexes of GPUs with MIG mode on, e.g. 0,1.")
@click.option("--minors", default="", help="Comma-separated device minors, one per GPU (default: the index).")
@click.option("--seed", default=None, help="Seed for the GPU UUIDs (default: this host's short name).")
@click.option("--force", is_flag=True, help="Replace an existing state file.")
def fake_init(state: str, model: str, count: int, mig: str, minors: str, seed: str | None, force: bool) -> None:
    """Create a fake NVML state: COUNT GPUs of MODEL, MIG mode on for --mig, no instances."""
    from ..gpu.fakenvml import FakeNvml

    path = Path(state)
    _check_replaceable(path, force)
    fake = FakeNvml.build(
        path,
        model=model,
        count=count,
        mig_enabled=_indexes(mig),
        minors=_indexes(minors) or None,
        seed=socket.gethostname().split(".", 1)[0] if seed is None else seed,
    )
    click.echo(
        f"fake NVML: {count} x {model} in {path} (MIG on: {mig or 'none'}); mig-minors at {fake.mig_minors_path}"
    )


def _check_replaceable(path: Path, force: bool) -> None:
    """--force replaces a fake NVML state, never some other file that happens to be there."""
    if not path.exists():
        return
    if not force:
        raise NodeError(f"{path} exists; pass --force to replace the fake NVML state")
    from ..gpu.fakenvml import READ_FORMATS

    try:
        is_fake = json.loads(path.read_text(encoding="utf-8")).get("format") in READ_FORMATS
    except (OSError, ValueError, AttributeError):
        is_fake = False
    if not is_fake:
        raise NodeError(f"{path} is not a fake NVML state; refusing to replace it")


@fake_nvml.command("reboot")
@click.option("--state", required=True, type=click.Path(exists=True, dir_okay=False), help="The fake NVML state.")
@click.option("--model", default=None, help="Refuse unless every GPU is of this catalogue model.")
@click.option("--count", default=None, type=click.IntRange(1, 32), help="Refuse unless there are this many GPUs.")
def fake_reboot(state: str, model: str | None, count: int | None) -> None:
    """Pretend the node restarted: every MIG instance and process gone, compute modes DEFAULT, MIG mode
    kept on A100/A30 and lost on Hopper and later (what `gpushare node boot` puts back). Exit 1 when
    --model or --count differ from the state's GPUs (build it again with `init --force`)."""
    from ..gpu.fakenvml import FakeNvml

    fake = FakeNvml(state)
    models = fake.gpu_models()
    if (count is not None and len(models) != count) or (model is not None and set(models) != {model}):
        raise NodeError(
            f"{state} holds {len(models)} x {', '.join(sorted(set(models)))}, not "
            f"{count or len(models)} x {model or ', '.join(sorted(set(models)))}; build it again with "
            "`gpushare node fake-nvml init --force`"
        )
    fake.reboot()
    click.echo(f"fake NVML {state}: rebooted ({len(models)} x {', '.join(sorted(set(models)))})")


@fake_nvml.command("add-process")
@click.option("--state", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--gpu", "index", required=True, type=int)
@click.option("--pid", required=True, type=int)
@click.option("--gi", type=int, default=None, help="GPU instance id (MIG GPUs).")
@click.option("--ci", type=int, default=None, help="Compute instance id (MIG GPUs).")
@click.option("--used-mib", type=int, default=0)
def fake_add_process(state: str, index: int, pid: int, gi: int | None, ci: int | None, used_mib: int) -> None:
    """Pretend a CUDA process PID runs on a GPU (or on one MIG device)."""
    from ..gpu.fakenvml import FakeNvml

    FakeNvml(state).add_process(index, pid, gi=gi, ci=ci, used_mib=used_mib)


@fake_nvml.command("remove-process")
@click.option("--state", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--pid", required=True, type=int)
def fake_remove_process(state: str, pid: int) -> None:
    """Pretend process PID exited."""
    from ..gpu.fakenvml import FakeNvml

    FakeNvml(state).remove_process(pid)


COMMANDS = (node,)
