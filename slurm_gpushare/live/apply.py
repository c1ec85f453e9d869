"""One run of the live planner with --apply: observe, decide (``decide``), execute. Side effects live here.

The admin's policy (``--policy``) stays the source; the live policy
(``live.policy_file``, default ``<slurm_conf_dir>/gpushare-live.yaml``) is
the admin's document with every layout the live planner changed applied on
top (``planner.live.with_layout``, one node at a time, from the state
file's ``layouts``), so a change of the admin's file is carried into the
next live policy written. The configuration (``render_all``) is rendered
from the live policy into the slurm.conf directory in the same locked step,
refusing to overwrite a file edited by hand (``outfiles.write_all``).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..atomic import atomic_write
from ..errors import GpushareError
from . import decide as d
from .state import Change, State, StateFile

DEFAULT_NODE_CONFIG = "/etc/gpushare/node.yaml"
GPU_NAMES = ("gpu", "mps", "shard")
SLACK = 600.0  # s the lock outlives the wait and the relayout job (cron's period, slurmctld re-executing)


class LiveApplyError(GpushareError):
    exit_code = 1


def live_policy_path(site) -> Path:
    """The live policy's path (planner.live.live_policy_path) as a Path."""
    from ..planner.live import live_policy_path as path_of

    return Path(path_of(site))


def state_path(policy_file: Path) -> Path:
    return policy_file.with_name(policy_file.stem + "-state.json")


@dataclass
class RunReport:
    lines: list[str] = field(default_factory=list)
    plan: object = None  # the LivePlan of this run
    actions: list = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)


@dataclass
class LiveApply:
    """The apply path for one admin policy. ``client``: the Slurm client; ``reservations``: slurm.reservations."""

    admin_policy: Path
    client: object
    reservations: object
    clock: object = time.time
    node_config: str = DEFAULT_NODE_CONFIG
    relayout_timeout: float = 600.0  # `gpushare node relayout --timeout` default: twice (jobs, registration)
    say: object = None  # a line printer for progress (the report collects the lines too)
    policy_file: Path | None = None  # override live.policy_file (tests)
    planner: object = None  # what has plan_live, snapshot_from_client, with_layout (default: planner.live)

    def __post_init__(self):
        from ..policy import load_file

        if self.planner is None:
            from ..planner import live as planner

            self.planner = planner

        self.admin_policy = Path(self.admin_policy)
        self.admin = load_file(self.admin_policy)
        live = self.admin.policy.live
        if not live.enabled:
            raise LiveApplyError(f"{self.admin_policy}: live.enabled is false: set `live: {{enabled: true}}` to let "
                                 "`gpushare plan --live --apply` change layouts")
        self.live = live
        self.policy_file = Path(self.policy_file) if self.policy_file else live_policy_path(self.admin)
        self.store = StateFile(state_path(self.policy_file))
        self.conf_dir = Path(self.admin.cluster.paths.slurm_conf_dir)
        self.host = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def relayout_limit(self) -> float:
        """The relayout job's time limit: its two waits and the reconfigure."""
        return 2 * self.relayout_timeout + 120

    # ---- observe --------------------------------------------------------------------------------
    def current_site(self):
        """The policy the cluster runs now, and its document: the live policy when it exists, else the admin's."""
        from ..policy import load_file
        from ..policy.load import parse_yaml

        path = self.policy_file if self.policy_file.is_file() else self.admin_policy
        site = load_file(path) if path == self.policy_file else self.admin
        return site, parse_yaml(path.read_text(encoding="utf-8"), path.name)

    def run_once(self) -> RunReport:
        plan_live, snapshot_from_client = self.planner.plan_live, self.planner.snapshot_from_client
        report = RunReport()
        now = self.clock()
        site, doc = self.current_site()
        state = self.store.read()
        locks = frozenset(r.node for r in self.reservations.locks())
        snap = snapshot_from_client(self.client, site, now, state.changes(), locks)
        if state.weights:  # the nodes whose weight this planner set: it puts the policy's back when done
            snap = replace(snap, steered=dict(state.weights))
        plan = plan_live(site, snap, doc)
        report.plan = plan
        gpu_jobs = gpu_jobs_by_node(snap)
        job_ends = {c.job: self.reservations.job_end(c.job) for c in state.in_flight().values() if c.job is not None}
        nodes = {n: (tuple(v.state), v.reason) for n, v in snap.nodes.items()}
        actions = d.decide(now, state, locks, gpu_jobs, job_ends, nodes, plan.proposals, self.live.max_wait,
                           self.relayout_limit, getattr(plan, "weights", ()))
        report.actions = actions
        for action in actions:
            self._execute(action, gpu_jobs, report)
        return report

    # ---- execute --------------------------------------------------------------------------------
    def _say(self, report: RunReport, line: str) -> None:
        report.say(line)
        if self.say is not None:
            self.say(line)

    def _execute(self, action, gpu_jobs, report: RunReport) -> None:
        if isinstance(action, d.Wait):
            self._say(report, f"{action.node}: {action.why}")
        elif isinstance(action, d.Lost):
            self._end(action.node, "lost", action.why, report, delete=False)
        elif isinstance(action, d.GiveUp):
            self._end(action.node, "gave_up", action.why, report, delete=True)
        elif isinstance(action, d.Relayout):
            self._relayout(action.node, report)
        elif isinstance(action, d.Finish):
            if action.drain:
                self.client.drain(action.node, action.drain[:200])
            self._end(action.node, "done" if action.ok else "failed", action.result, report, delete=True)
        elif isinstance(action, d.SetWeight):
            self._weight(action.change, report)
        elif isinstance(action, d.Take):
            if self._take(action.proposal, report) and not gpu_jobs.get(action.proposal.node):
                self._relayout(action.proposal.node, report)
        else:  # pragma: no cover - decide returns only the above
            raise LiveApplyError(f"unknown action {action!r}")

    def _take(self, p, report: RunReport) -> bool:
        """Lock the node and record the change as waiting; False when another planner has it."""
        from ..slurm.reservations import LockHeld

        duration = self.live.max_wait + self.relayout_limit + SLACK
        try:
            self.reservations.create_lock(p.node, duration)
        except LockHeld as exc:
            self._say(report, f"{p.node}: not changed: {exc}")
            return False
        now = self.clock()
        with self.store.locked():
            state = self.store.read()
            last = state.current.get(p.node)
            # another planner changed the node after this run's snapshot: its record is newer than our view allows
            if last is not None and (last.in_flight or now - last.changed_at < self.live.min_dwell):
                self.reservations.delete_lock(p.node)
                self._say(report, f"{p.node}: not changed: another planner recorded a change at "
                                  f"{last.changed_at:.0f} ({last.phase}) after this run looked")
                return False
            change = Change(node=p.node, gpu=p.gpu, old_layout=tuple(p.old_layout), new_layout=tuple(p.new_layout),
                            phase="waiting", locked_at=now, line=p.line, planner=self.host,
                            changes=tuple(getattr(p, "changes", ()) or ()),  # every GPU of the proposal
                            modes=tuple(getattr(p, "modes", ()) or ()))  # or every GPU of a change of modes
            state.put(change)
            self.store.write(state)
        self._say(report, f"{p.node}: locked ({'+'.join(p.old_layout)} -> {'+'.join(p.new_layout)}): {p.line}")
        return True

    def _relayout(self, node: str, report: RunReport) -> None:
        """Write the live policy and the configuration, submit the root relayout job (all under the state lock)."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or change.phase != "waiting":
                self._say(report, f"{node}: relayout already started by another planner")
                return
            before = {n: dict(v) for n, v in state.layouts.items()}
            before_modes = {n: dict(v) for n, v in state.modes.items()}
            if change.modes:  # all the GPUs of the change, one drain
                state.modes.setdefault(node, {}).update(change.sharing)
            else:
                state.layouts.setdefault(node, {}).update(change.layouts)
            try:
                self._write_policy(state)
                self.reservations.extend_lock(node, self.relayout_limit + SLACK)
                job = self.reservations.submit_relayout(
                    node, str(self.policy_file), log=self._log(node), time_limit_s=self.relayout_limit,
                    partition=self._partition(node), node_config=self.node_config)
            except (GpushareError, ValueError) as exc:  # ValueError: with_layout refuses the layout
                # nothing ran on the node: put the live policy and the configuration back, end the attempt
                state.layouts, state.modes = before, before_modes
                self._write_policy(state)
                self.reservations.delete_lock(node)
                state.put(replace(change, phase="failed", ended_at=self.clock(), result=f"not started: {exc}"))
                self.store.write(state)
                self._say(report, f"{node}: relayout not started, live policy put back: {exc}")
                return
            state.put(replace(change, phase="relayout", job=job, submitted_at=self.clock()))
            self.store.write(state)
        self._say(report, f"{node}: wrote {self.policy_file}, rendered into {self.conf_dir}, relayout job {job}")

    def _weight(self, w, report: RunReport) -> None:
        """``scontrol update nodename=<node> weight=<n>`` through the client; recorded so the policy's comes back
        when no job needs it (a weight back to the policy's is forgotten)."""
        self.client.set_weight(w.node, w.new)
        with self.store.locked():
            state = self.store.read()
            if w.jobs:
                state.weights[w.node] = w.new
            else:
                state.weights.pop(w.node, None)
            self.store.write(state)
        self._say(report, f"{w.node}: weight {w.old} -> {w.new}: {w.line}")

    def _end(self, node: str, phase: str, why: str, report: RunReport, *, delete: bool) -> None:
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or not change.in_flight:
                return
            if delete:
                self.reservations.delete_lock(node)
            state.put(replace(change, phase=phase, ended_at=self.clock(), result=why))
            self.store.write(state)
        self._say(report, f"{node}: {phase.replace('_', ' ')}: {why}")

    # ---- the files ------------------------------------------------------------------------------
    def _write_policy(self, state: State) -> None:
        from ..outfiles import write_all
        from ..policy import load_file
        from ..policy.load import parse_yaml
        from ..render import render_all

        doc = parse_yaml(self.admin_policy.read_text(encoding="utf-8"), self.admin_policy.name)
        with_layouts = getattr(self.planner, "with_layouts", None)  # a node's GPUs validated as one set
        for node, per_gpu in sorted(state.modes.items()):  # GPU modes first: MIG GPUs are never among them
            doc = self.planner.with_modes(doc, node, {gpu: dict(entry) for gpu, entry in sorted(per_gpu.items())})
        for node, per_gpu in sorted(state.layouts.items()):
            if with_layouts is not None:
                doc = with_layouts(doc, node, {gpu: tuple(layout) for gpu, layout in sorted(per_gpu.items())})
                continue
            for gpu, layout in sorted(per_gpu.items()):
                doc = self.planner.with_layout(doc, node, gpu, tuple(layout))
        atomic_write(self.policy_file, live_policy_text(doc, self.admin_policy, state))
        write_all(render_all(load_file(self.policy_file)), self.conf_dir)

    def _log(self, node: str) -> str:
        return f"{self.admin.cluster.paths.log_dir.rstrip('/')}/gpushare-relayout-{node}-%j.log"

    def _partition(self, node: str) -> str | None:
        group = self.admin.group_for_node(node).name
        for tier in self.admin.tiers:
            if any(g.name == group for g in tier.groups):
                return tier.name
        return None


def gpu_jobs_by_node(snap) -> dict[str, tuple[int, ...]]:
    """node -> ids of the running jobs holding a GPU, MPS or shard GRES there (Snapshot.running)."""
    out: dict[str, list[int]] = {}
    for job in snap.running:
        if any(k.split(":", 1)[0] in GPU_NAMES and v for k, v in job.gres.items()):
            out.setdefault(job.node, []).append(job.job_id)
    return {n: tuple(sorted(j)) for n, j in out.items()}


def live_policy_text(doc: dict, admin: Path, state: State) -> str:
    import yaml

    from ..planner.live import mode_text

    changed = ", ".join(f"{n} GPU {g}: {'+'.join(l)}" for n, gl in sorted(state.layouts.items())
                        for g, l in sorted(gl.items())) or "none"
    head = (f"# Written by `gpushare plan --live --apply` from {admin}: do not edit (edit {admin.name}; the next\n"
            f"# change is written from it). Layouts changed by the live planner: {changed}\n")
    if state.modes:
        modes = ", ".join(f"{n} GPU {g}: {mode_text(e)}" for n, ge in sorted(state.modes.items())
                          for g, e in sorted(ge.items()))
        head += f"# GPU modes changed by the live planner: {modes}\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
