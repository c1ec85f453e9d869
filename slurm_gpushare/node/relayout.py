"""`gpushare node relayout`: change a node's MIG layout without Slurm scheduling onto a moving target.

Observe, plan, execute, as the prolog and reconcile: ``observe_relayout``
reads the node (its MIG state through the GPU backend, the gres include on
disk and the one the live state gives, the node as Slurm has it);
``plan_relayout`` (pure) says what differs and which steps follow;
``execute_relayout`` carries the steps out, each one that waits re-reading
what it waits for. The steps, each checked before the next:

1. compare: live layout vs policy, the gres include on disk vs what it
   would be now, the GRES Slurm has for the node vs the policy's; all equal:
   nothing to do, the node is not touched;
2. drain the node (``scontrol update state=drain``, reason ``DRAIN_REASON``);
3. wait until no job holding GPUs runs on it (``squeue -w``; and no journal
   of such a job is left), up to a timeout;
4. apply the layout (``mig.plan_mig``: refused while processes run), check
   that no difference is left;
5. write the gres.conf include from the new live state (``gresconf``),
   after checking that every device file it names exists (a missing one
   makes slurmd exit);
6. make slurmd re-read it: ``scontrol reconfigure``, which in Slurm 23.11+
   re-executes slurmctld and every slurmd (seen on 24.11 in the test cluster:
   the node's "Final gres.conf list" is logged again with the new file,
   same pid); slurmctld reads the new slurm.conf at the same moment, so the
   new policy's slurm.conf must already be in place (render and distribute
   it first). ``--restart sighup`` signals only this node's slurmd (SIGHUP
   also re-reads gres.conf on 24.11), for layouts whose slurm.conf is unchanged;
7. wait until Slurm shows the node with the policy's GRES counts and not
   INVAL, then resume it and check the drain is gone.

Any failure after step 2 leaves the node drained, its reason replaced by
"gpushare relayout failed: <what happened>"; when even that drain fails, the
error names both. No shell, no restart command taken from the user: Slurm
is reached through the Slurm client only.

A crash (the process killed at any point) converges by re-observation, the
alternative ARCHITECTURE's reliability rules allow to an intent journal:
every side effect leaves a trace the next run observes before it plans, and
the first one records the intent. The drain is made first and carries
``DRAIN_REASON``: Slurm keeps it, and its reason names the relayout as the
drain's owner; a MIG action is NVML's state, from which the next run's
``plan_mig`` starts; the include is written atomically; the reconfigure
shows in the GRES Slurm registers; the resume in the node's state. So a run
killed after any step leaves either a difference (the next run drains
again, an idempotent step, and goes on from what it finds) or, once Slurm
has the new counts, a node in sync but drained with ``DRAIN_REASON``: the
next run finishes that one (waits for the registration, resumes). A node
drained with any other reason (an admin's, a failed relayout's) is left as
it is by a run that finds nothing to change. The node-local lock (below)
makes the reading safe: while a run holds it no other relayout acts on the
node, so a drain with ``DRAIN_REASON`` it finds is one a dead run left.
tests/unit/node/test_relayout_crash.py kills a run after each side effect
and checks that the next run converges.

One relayout at a time on a node: the whole workflow holds an exclusive
``flock`` on ``<state_dir>/relayout.lock`` (root's directory; opened without
following a link). A second run (a second relayout job, an admin's run by
hand) waits for it up to ``timeout``, then compares afresh (usually: nothing
to do); one that still finds it held exits 1 naming the holder's pid,
without draining the node or touching it. The lock goes with the process
that holds it, whatever kills it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GpushareError

if TYPE_CHECKING:
    from ..gpu.backend import NvmlBackend
    from ..policy.site import GpuSlot, Group, Site
    from ..slurm.interface import SlurmClient
    from ..slurm.model import Node
    from .journal import JournalStore
    from .mig import GpuState

GPU_GRES = re.compile(r"(^|,)(gres/)?(gpu|mps|shard)[:=]")
LOCK_NAME = "relayout.lock"  # in the node's state_dir
DRAIN_REASON = "gpushare relayout: changing the MIG layout"  # the intent, kept by Slurm with the drain
FAILED_REASON = "gpushare relayout failed: "
UNREGISTERED = frozenset({"INVAL", "NOT_RESPONDING", "DOWN"})


class RelayoutError(GpushareError):
    exit_code = 1


def parse_node_gres(text: str) -> dict[tuple[str, str], int]:
    """Slurm's node Gres= ('gpu:l40s:2,shard:l40s:4(S:0)') as {(name, type): count}; shared GRES untyped."""
    out: dict[tuple[str, str], int] = {}
    for item in re.sub(r"\([^)]*\)", "", text or "").split(","):
        parts = item.strip().split(":")
        if len(parts) < 2 or parts[0] in ("(null)", "") or not parts[-1].isdigit():
            continue
        name, count = parts[0], int(parts[-1])
        gtype = parts[1] if len(parts) == 3 and name == "gpu" else ""
        out[name, gtype] = out.get((name, gtype), 0) + count
    return out


def gres_counts(gres: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """A node's GRES as the Slurm client reads them ({'gpu:l40s': 2, 'shard:l40s': 4}) as the policy counts
    them ({(name, type): count}, shared GRES untyped): what ``parse_node_gres`` makes of Slurm's Gres= text."""
    out: dict[tuple[str, str], int] = {}
    for key, count in gres.items():
        parts = key.split(":")
        if parts[0] in ("(null)", ""):
            continue
        gtype = parts[1] if len(parts) == 2 and parts[0] == "gpu" else ""
        out[parts[0], gtype] = out.get((parts[0], gtype), 0) + count
    return out


def fmt_gres(gres: dict[tuple[str, str], int]) -> str:
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in sorted(gres.items())) or "(none)"


def shown(node: Node) -> str:
    """The node as Slurm shows it, for an error: Gres=, State= and Reason=."""
    gres = ",".join(f"{k}:{v}" for k, v in node.gres.items())
    return f"Gres={gres} State={'+'.join(node.state)} Reason={node.reason}"


def missing_devices(gres_text: str, root: str = "/") -> list[str]:
    """Device files a gres.conf text names that are not character devices here: a missing
    one makes slurmd exit after ~20 s (Slurm 24.11 src/common/gres.c: it waits for the file, then
    fatal "can't stat gres.conf file"; seen on the test cluster)."""
    import stat

    from .gresindex import expand

    missing = []
    for _key, value in re.findall(r"\b(MultipleFiles|Files?)=(\S+)", gres_text):
        for path in expand(value):
            try:
                ok = stat.S_ISCHR(os.stat(os.path.join(root, path.lstrip("/"))).st_mode)
            except OSError:
                ok = False
            if not ok and path not in missing:
                missing.append(path)
    return missing


def sighup_slurmd(pid_file: Path, name: str = "slurmd", uid: int = 0) -> None:
    """SIGHUP the slurmd whose pid ``pid_file`` holds, through a pidfd, and only while that pid is still the
    slurmd that wrote the file (``procscan.pid_file_problem``: root's, executing a file called slurmd, started
    before the file was written): a stale file's pid, taken by another process since, is never signalled."""
    from .procscan import pid_file_problem, signal_checked

    try:
        pid = int(Path(pid_file).read_text().strip())
        written = os.stat(pid_file).st_mtime
    except (OSError, ValueError) as exc:
        raise RelayoutError(f"cannot read slurmd's pid from {pid_file}: {exc}") from None
    problems: list[str | None] = []

    def still_slurmd() -> bool:  # checked once a pidfd pins the pid
        problems.append(pid_file_problem(pid, written, name, uid))
        return problems[-1] is None

    if not signal_checked(pid, still_slurmd, signal.SIGHUP):
        why = problems[-1] if problems and problems[-1] else "is not running"
        raise RelayoutError(
            f"slurmd not signalled: pid {pid} from {pid_file} {why}; start slurmd, or use --restart reconfigure"
        )


# ---- observe ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the policy says the node is: its GPUs, the GRES Slurm must register, where its include lives."""

    node: str
    slots: tuple[GpuSlot, ...]
    gres: dict[tuple[str, str], int]
    include: Path

    @classmethod
    def of(cls, site: Site, node: str) -> Target:
        group: Group = site.group_for_node(node)
        return cls(node, tuple(group.gpus), dict(group.gres), Path(site.cluster.paths.gres_include))


@dataclass(frozen=True)
class NodeView:
    """One look at the node. ``include_now``: the include the live MIG state gives; None while the MIG layout
    differs from the policy (no include can be written for it then)."""

    mig: Mapping[int, GpuState]
    include_on_disk: str
    include_now: str | None
    slurm: Node


def include_text(target: Target, backend: NvmlBackend) -> str:
    """The gres include of the node's live MIG state (``gresconf.node_gres_conf``)."""
    from ..gpu import read_mig_minors
    from .gresconf import node_gres_conf

    minors = read_mig_minors(backend.mig_minors_path) if any(s.share.is_mig for s in target.slots) else {}
    return node_gres_conf(target.node, target.slots, backend, minors)


def slurm_node(client: SlurmClient, name: str) -> Node:
    from ..slurm.cli_backend import SlurmClientError

    try:
        return client.node(name)
    except SlurmClientError as exc:
        raise RelayoutError(str(exc)) from None


def observe_relayout(target: Target, backend: NvmlBackend, client: SlurmClient) -> NodeView:
    from .mig import differences, observe

    mig = observe(backend, [s.index for s in target.slots])
    try:
        on_disk = target.include.read_text(encoding="utf-8")
    except FileNotFoundError:
        on_disk = ""
    now = None if differences(target.slots, mig) else include_text(target, backend)
    return NodeView(mig, on_disk, now, slurm_node(client, target.node))


# ---- plan (pure) ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    reason: str = DRAIN_REASON


@dataclass(frozen=True)
class WaitForJobs:
    pass


@dataclass(frozen=True)
class ApplyMig:
    pass


@dataclass(frozen=True)
class WriteInclude:
    pass


@dataclass(frozen=True)
class Restart:
    method: str  # "reconfigure" or "sighup"


@dataclass(frozen=True)
class WaitRegistered:
    pass


@dataclass(frozen=True)
class Resume:
    pass


Step = Drain | WaitForJobs | ApplyMig | WriteInclude | Restart | WaitRegistered | Resume


@dataclass(frozen=True)
class RelayoutPlan:
    differences: tuple[str, ...]  # what differs from the policy (none: in sync)
    steps: tuple[Step, ...]  # none: nothing to do
    unfinished: bool = False  # in sync, but drained by a relayout that did not finish: only registered and resumed


def differences(target: Target, view: NodeView) -> list[str]:
    """What differs now ([] when the node already is as the policy says)."""
    from .mig import differences as mig_differences

    found = mig_differences(target.slots, view.mig)
    if found:
        return found
    if view.include_on_disk != view.include_now:
        found.append(f"{target.include} differs from the live MIG state")
    have = gres_counts(view.slurm.gres)
    if have != target.gres:
        found.append(f"Slurm has Gres={fmt_gres(have)}, the policy says {fmt_gres(target.gres)}")
    return found


def drained_by_relayout(node: Node) -> bool:
    """Drained with the reason a relayout drains with: a relayout that did not finish (its process killed)."""
    return "DRAIN" in node.state and node.reason.startswith(DRAIN_REASON)


def plan_relayout(target: Target, view: NodeView, restart: str = "reconfigure") -> RelayoutPlan:
    if restart not in ("reconfigure", "sighup"):
        raise RelayoutError(f"unknown restart method {restart!r}; use reconfigure or sighup")
    found = tuple(differences(target, view))
    if found:
        steps = (Drain(), WaitForJobs(), ApplyMig(), WriteInclude(), Restart(restart), WaitRegistered(), Resume())
        return RelayoutPlan(found, steps)
    if drained_by_relayout(view.slurm):
        return RelayoutPlan((), (WaitRegistered(), Resume()), unfinished=True)
    return RelayoutPlan((), ())


# ---- execute ----------------------------------------------------------------------------------------


@dataclass
class Relayout:
    """One run for one node: under the node-local lock, observe, plan, execute. ``backend`` is open; ``store``
    the node's journals; ``client`` the Slurm client made at the entry point."""

    site: Site
    node: str
    backend: NvmlBackend
    client: SlurmClient
    store: JournalStore
    restart: str = "reconfigure"
    pid_file: Path = Path("/run/slurmd.pid")
    timeout: float = 600
    poll: float = 2.0
    say: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    missing: Callable[[str], list[str]] = missing_devices  # gres text -> the device files it names not present
    lock_path: Path | None = None  # the node-local lock (default: <state_dir>/relayout.lock)

    def run(self) -> list[str]:
        """The whole workflow under the node-local lock; returns what was done. RelayoutError leaves the node
        drained, unless the lock stayed held by another run (then nothing was touched)."""
        path = Path(self.lock_path or Path(self.site.cluster.paths.state_dir) / LOCK_NAME)
        with node_lock(path, self.node, self.timeout, self.clock, self.sleep, self.poll, self.say):
            target = Target.of(self.site, self.node)
            plan = plan_relayout(target, observe_relayout(target, self.backend, self.client), self.restart)
            return execute_relayout(plan, target, self)


def execute_relayout(plan: RelayoutPlan, target: Target, run: Relayout) -> list[str]:
    node = target.node
    if not plan.steps:
        return [f"node {node}: layout, gres include and Slurm's GRES match the policy; nothing to do"]
    for line in plan.differences:
        run.say(f"node {node}: {line}")
    if plan.unfinished:
        run.say(f"node {node}: in sync, still drained by a relayout that did not finish: finishing it")
    done: list[str] = []
    try:
        for step in plan.steps:
            done += STEPS[type(step)](step, target, run)
    except GpushareError as exc:
        fail(run, node, str(exc))
        raise RelayoutError(f"node {node}: relayout failed, node left drained: {exc}") from None
    return done


def fail(run: Relayout, node: str, why: str) -> None:
    """Drain the node with the failure's reason; an error naming both when Slurm refuses even that."""
    try:
        run.client.drain(node, (FAILED_REASON + why)[:200])
    except GpushareError as exc:
        raise RelayoutError(
            f"node {node}: relayout failed: {why}; and the node could not be drained with that reason: {exc}"
        ) from None


def do_drain(step: Drain, target: Target, run: Relayout) -> list[str]:
    run.client.drain(target.node, step.reason[:200])
    return [f"node {target.node}: drained"]


def wait_for_jobs(step: WaitForJobs, target: Target, run: Relayout) -> list[str]:
    deadline = run.clock() + run.timeout
    while True:
        jobs = {int(j) for j, tres in run.client.gpu_job_lines(target.node) if j.isdigit() and GPU_GRES.search(tres)}
        jobs |= {j for j, jr in run.store.all().items() if jr.devices or jr.mps}
        if not jobs:
            return [f"node {target.node}: no GPU jobs left"]
        if run.clock() > deadline:
            raise RelayoutError(
                f"timed out after {run.timeout:g} s waiting for GPU jobs {', '.join(map(str, sorted(jobs)))} to end"
            )
        run.say(f"node {target.node}: waiting for GPU jobs {', '.join(map(str, sorted(jobs)))}")
        run.sleep(run.poll)


def apply_mig(step: ApplyMig, target: Target, run: Relayout) -> list[str]:
    from .mig import apply_actions, observe, plan_mig
    from .mig import differences as mig_differences

    indexes = [s.index for s in target.slots]
    actions = plan_mig(target.slots, observe(run.backend, indexes))
    apply_actions(run.backend, actions)
    left = mig_differences(target.slots, observe(run.backend, indexes))
    if left:
        raise RelayoutError("MIG layout still differs after apply: " + "; ".join(left))
    return [f"node {target.node}: {a}" for a in actions]


def write_include(step: WriteInclude, target: Target, run: Relayout) -> list[str]:
    from ..atomic import atomic_write

    text = include_text(target, run.backend)
    missing = run.missing(text)
    if missing:
        raise RelayoutError(
            f"the new gres include names device files that do not exist: {', '.join(missing)} "
            "(slurmd would exit after 20 s); create them (nvidia-modprobe) and run relayout again"
        )
    atomic_write(target.include, text)
    return [f"node {target.node}: wrote {target.include}"]


def restart(step: Restart, target: Target, run: Relayout) -> list[str]:
    if step.method == "reconfigure":
        run.client.reconfigure()
    else:
        sighup_slurmd(run.pid_file)
    return [f"node {target.node}: slurmd re-read its configuration ({step.method})"]


def wait_registered(step: WaitRegistered, target: Target, run: Relayout) -> list[str]:
    deadline = run.clock() + run.timeout
    while True:
        node = slurm_node(run.client, target.node)
        if gres_counts(node.gres) == target.gres and not set(node.state) & UNREGISTERED:
            if "reported lower" not in node.reason:
                return [f"node {target.node}: registered Gres={fmt_gres(target.gres)}"]
        if run.clock() > deadline:
            raise RelayoutError(
                f"the node did not register Gres={fmt_gres(target.gres)} within {run.timeout:g} s: "
                f"Slurm shows {shown(node)}"
            )
        run.sleep(run.poll)


def resume(step: Resume, target: Target, run: Relayout) -> list[str]:
    """Resume the node, unless it turned out undrained. Seen on 24.11 (tests/cluster/test_live_planner.py, an
    exclusive GPU turned into shards): `state=resume` right after the re-registration failed "Invalid node state
    specified" on a node shown drained; it is retried until the timeout, the node's state in the error."""
    deadline = run.clock() + run.timeout
    while True:
        if "DRAIN" not in slurm_node(run.client, target.node).state:  # `state=resume` of an undrained node is refused
            return [f"node {target.node}: not drained any more after the reconfigure: nothing to resume"]
        try:
            run.client.resume(target.node)
            break
        except GpushareError as exc:
            node = slurm_node(run.client, target.node)
            if "Invalid node state" not in str(exc) or run.clock() > deadline:
                raise RelayoutError(f"{exc} (Slurm shows State={'+'.join(node.state)} Reason={node.reason})") from None
            run.say(f"node {target.node}: resume refused ({exc}); State={'+'.join(node.state)}: trying again")
            run.sleep(run.poll)
    return wait_resumed(target, run)


def wait_resumed(target: Target, run: Relayout) -> list[str]:
    deadline = run.clock() + run.timeout
    while "DRAIN" in (node := slurm_node(run.client, target.node)).state:
        if run.clock() > deadline:
            raise RelayoutError(f"the node is still drained {run.timeout:g} s after resume: {node.reason}")
        run.sleep(run.poll)
    return [f"node {target.node}: resumed"]


STEPS: dict[type, Callable] = {
    Drain: do_drain,
    WaitForJobs: wait_for_jobs,
    ApplyMig: apply_mig,
    WriteInclude: write_include,
    Restart: restart,
    WaitRegistered: wait_registered,
    Resume: resume,
}


@contextmanager
def node_lock(path: Path, node: str, timeout: float, clock, sleep, poll: float, say):
    """Hold an exclusive flock on ``path`` (created 0600, never through a link), waiting up to ``timeout`` for
    another holder; RelayoutError names the holder's pid (written into the file) when it stays held."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise RelayoutError(
            f"node {node}: cannot open the relayout lock {path}: {exc.strerror} (a regular file "
            "root owns is expected, not a link)"
        ) from None
    try:
        deadline = clock() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                if clock() > deadline:
                    raise RelayoutError(
                        f"node {node}: another `gpushare node relayout` (pid {holder}) has held "
                        f"{path} for {timeout:g} s; the node was not touched"
                    ) from None
                say(f"node {node}: waiting for the relayout of pid {holder} ({path})")
                sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the lock
