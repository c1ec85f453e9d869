"""`gpushare node relayout`: change a node's MIG layout without Slurm scheduling onto a moving target.

The workflow, each step checked before the next:

1. compare: live layout vs policy, the gres include on disk vs what it
   would be now, the GRES Slurm has for the node vs the policy's; all equal:
   nothing to do, the node is not touched;
2. drain the node (``scontrol update state=drain``, reason naming relayout);
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
"gpushare relayout failed: <what happened>". No shell, no restart command
taken from the user: Slurm is reached through the Slurm client only.

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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpushareError

GPU_GRES = re.compile(r"(^|,)(gres/)?(gpu|mps|shard)[:=]")
LOCK_NAME = "relayout.lock"  # in the node's state_dir


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


def fmt_gres(gres: dict[tuple[str, str], int]) -> str:
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in sorted(gres.items())) or "(none)"


@dataclass
class SlurmNode:
    """The few Slurm calls relayout needs, through the Slurm client (``slurm.client``; a bare
    Runner is wrapped in the CLI client)."""

    runner: object
    name: str
    timeout: float = 60

    @property
    def client(self):
        from ..slurm.client import as_client

        return as_client(self.runner, timeout=self.timeout)

    def record(self) -> dict:
        """Gres=, State= and Reason= of the node, as scontrol names them (``scontrol show node --json``)."""
        from ..slurm.client import SlurmClientError

        try:
            node = self.client.node(self.name)
        except SlurmClientError as exc:
            raise RelayoutError(str(exc)) from None
        return {
            "Gres": ",".join(f"{k}:{v}" for k, v in node.gres.items()),
            "State": "+".join(node.state),
            "Reason": node.reason,
        }

    def state_flags(self) -> set[str]:
        return set(self.record().get("State", "").replace("*", "").split("+"))

    def drain(self, reason: str) -> None:
        self.client.drain(self.name, reason[:200])

    def resume(self) -> None:
        self.client.resume(self.name)

    def gpu_jobs(self) -> list[int]:
        """Jobs on the node that hold GPUs (gpu, mps or shard in their TRES per node)."""
        return sorted(
            int(job) for job, tres in self.client.gpu_job_lines(self.name) if job.isdigit() and GPU_GRES.search(tres)
        )

    def reconfigure(self) -> None:
        self.client.reconfigure()


def missing_devices(gres_text: str, root: str = "/") -> list[str]:
    """Device files a gres.conf text names that are not character devices here: a missing
    one makes slurmd exit after ~20 s (Slurm 24.11 src/common/gres.c: it waits for the file, then
    fatal "can't stat gres.conf file"; seen on the test cluster)."""
    import stat

    from .gresindex import expand

    missing = []
    for key, value in re.findall(r"\b(MultipleFiles|Files?)=(\S+)", gres_text):
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


@dataclass
class Relayout:
    """One run for one node. ``backend`` is open; ``store`` the node's journals."""

    site: object
    node: str
    backend: object
    slurm: SlurmNode
    store: object
    restart: str = "reconfigure"
    pid_file: Path = Path("/run/slurmd.pid")
    timeout: float = 600
    poll: float = 2.0
    say: object = print
    sleep: object = time.sleep
    clock: object = time.monotonic
    missing: object = None  # gres text -> device files not present (default: missing_devices)
    lock_path: Path | None = None  # the node-local lock (default: <state_dir>/relayout.lock)

    @property
    def group(self):
        return self.site.group_for_node(self.node)

    def include_text(self) -> str:
        from ..gpu import read_mig_minors
        from .gresconf import node_gres_conf

        slots = self.group.gpus
        minors = read_mig_minors(self.backend.mig_minors_path) if any(s.share.is_mig for s in slots) else {}
        return node_gres_conf(self.node, slots, self.backend, minors)

    def in_sync(self) -> list[str]:
        """What differs now ([] when the node already is as the policy says)."""
        from .mig import differences, observe

        slots = self.group.gpus
        found = differences(slots, observe(self.backend, [s.index for s in slots]))
        if found:
            return found
        include = Path(self.site.cluster.paths.gres_include)
        try:
            on_disk = include.read_text(encoding="utf-8")
        except FileNotFoundError:
            on_disk = ""
        if on_disk != self.include_text():
            found.append(f"{include} differs from the live MIG state")
        have = parse_node_gres(self.slurm.record().get("Gres", ""))
        if have != self.group.gres:
            found.append(f"Slurm has Gres={fmt_gres(have)}, the policy says {fmt_gres(self.group.gres)}")
        return found

    def run(self) -> list[str]:
        """The whole workflow under the node-local lock; returns what was done. RelayoutError leaves the node
        drained, unless the lock stayed held by another run (then nothing was touched)."""
        path = Path(self.lock_path or Path(self.site.cluster.paths.state_dir) / LOCK_NAME)
        with node_lock(path, self.node, self.timeout, self.clock, self.sleep, self.poll, self.say):
            return self._run()

    def _run(self) -> list[str]:
        todo = self.in_sync()
        if not todo:
            return [f"node {self.node}: layout, gres include and Slurm's GRES match the policy; nothing to do"]
        for line in todo:
            self.say(f"node {self.node}: {line}")
        self.slurm.drain("gpushare relayout: changing the MIG layout")
        try:
            return self._after_drain()
        except GpushareError as exc:
            self._fail(str(exc))
            raise RelayoutError(f"node {self.node}: relayout failed, node left drained: {exc}") from None

    def _fail(self, why: str) -> None:
        try:
            self.slurm.drain(f"gpushare relayout failed: {why}")
        except GpushareError:
            pass

    def _after_drain(self) -> list[str]:
        done = [f"node {self.node}: drained"]
        self._wait_for_jobs()
        done.append(f"node {self.node}: no GPU jobs left")
        done += self._apply()
        include = Path(self.site.cluster.paths.gres_include)
        from ..atomic import atomic_write

        text = self.include_text()
        missing = (self.missing or missing_devices)(text)
        if missing:
            raise RelayoutError(
                f"the new gres include names device files that do not exist: {', '.join(missing)} "
                "(slurmd would exit after 20 s); create them (nvidia-modprobe) and run relayout again"
            )
        atomic_write(include, text)
        done.append(f"node {self.node}: wrote {include}")
        self._restart()
        done.append(f"node {self.node}: slurmd re-read its configuration ({self.restart})")
        self._wait_registered()
        done.append(f"node {self.node}: registered Gres={fmt_gres(self.group.gres)}")
        if not self._resume():
            done.append(f"node {self.node}: not drained any more after the reconfigure: nothing to resume")
            return done
        self._wait_resumed()
        done.append(f"node {self.node}: resumed")
        return done

    def _deadline(self) -> float:
        return self.clock() + self.timeout

    def _wait_for_jobs(self) -> None:
        deadline = self._deadline()
        while True:
            jobs = set(self.slurm.gpu_jobs())
            jobs |= {j for j, jr in self.store.all().items() if jr.devices or jr.mps}
            if not jobs:
                return
            if self.clock() > deadline:
                raise RelayoutError(
                    f"timed out after {self.timeout:g} s waiting for GPU jobs "
                    f"{', '.join(map(str, sorted(jobs)))} to end"
                )
            self.say(f"node {self.node}: waiting for GPU jobs {', '.join(map(str, sorted(jobs)))}")
            self.sleep(self.poll)

    def _apply(self) -> list[str]:
        from .mig import apply_actions, differences, observe, plan_mig

        slots, indexes = self.group.gpus, [s.index for s in self.group.gpus]
        actions = plan_mig(slots, observe(self.backend, indexes))
        apply_actions(self.backend, actions)
        left = differences(slots, observe(self.backend, indexes))
        if left:
            raise RelayoutError("MIG layout still differs after apply: " + "; ".join(left))
        return [f"node {self.node}: {a}" for a in actions]

    def _restart(self) -> None:
        if self.restart == "reconfigure":
            self.slurm.reconfigure()
        elif self.restart == "sighup":
            sighup_slurmd(self.pid_file)
        else:
            raise RelayoutError(f"unknown restart method {self.restart!r}; use reconfigure or sighup")

    def _wait_registered(self) -> None:
        deadline, want, last = self._deadline(), self.group.gres, {}
        while True:
            rec = self.slurm.record()
            last = rec
            flags = set(rec.get("State", "").replace("*", "").split("+"))
            if parse_node_gres(rec.get("Gres", "")) == want and not flags & {"INVAL", "NOT_RESPONDING", "DOWN"}:
                if "reported lower" not in rec.get("Reason", ""):
                    return
            if self.clock() > deadline:
                raise RelayoutError(
                    f"the node did not register Gres={fmt_gres(want)} within {self.timeout:g} s: "
                    f"Slurm shows Gres={rec.get('Gres', '?')} State={rec.get('State', '?')} "
                    f"Reason={last.get('Reason', '')}"
                )
            self.sleep(self.poll)

    def _resume(self) -> bool:
        """Resume the node; False when it turned out undrained. Seen on 24.11 (tests/cluster/test_live_planner.py,
        an exclusive GPU turned into shards): `state=resume` right after the re-registration failed "Invalid node
        state specified" on a node shown drained; it is retried until the timeout, the node's state in the error."""
        from ..errors import GpushareError

        deadline = self._deadline()
        while True:
            if "DRAIN" not in self.slurm.state_flags():  # `state=resume` of an undrained node is refused
                return False
            try:
                self.slurm.resume()
                return True
            except GpushareError as exc:
                rec = self.slurm.record()
                if "Invalid node state" not in str(exc) or self.clock() > deadline:
                    raise RelayoutError(
                        f"{exc} (Slurm shows State={rec.get('State', '?')} Reason={rec.get('Reason', '')})"
                    ) from None
                self.say(f"node {self.node}: resume refused ({exc}); State={rec.get('State', '?')}: trying again")
                self.sleep(self.poll)

    def _wait_resumed(self) -> None:
        deadline = self._deadline()
        while "DRAIN" in self.slurm.state_flags():
            if self.clock() > deadline:
                raise RelayoutError(
                    f"the node is still drained {self.timeout:g} s after resume: "
                    f"{self.slurm.record().get('Reason', '')}"
                )
            self.sleep(self.poll)


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
