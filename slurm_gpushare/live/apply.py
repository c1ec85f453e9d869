"""One run of the live planner's apply side: observe (``observe``), decide (``steps``), execute. Side effects
live here.

The admin's policy (``--policy``) stays the source; the live policy
(``live.policy_file``, default ``<slurm_conf_dir>/gpushare-live.yaml``) is
the admin's document with every layout the live planner changed applied on
top (``policy.document.with_layouts`` / ``with_modes``, one node at a time, from the state
file's ``layouts``), so a change of the admin's file is carried into the
next live policy written. The configuration (``render_all``) is rendered
from the live policy into the slurm.conf directory in the same locked step,
refusing to overwrite a file edited by hand (``outfiles.write_all``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ..atomic import atomic_write
from ..errors import GpushareError
from ..policy import document
from ..slurm import relayoutjob
from ..slurm.cli_backend import ReservationError
from ..slurm.interface import SlurmClient
from ..slurm.relayoutjob import lock_name
from . import steps
from .observe import ReadView, observe, policy_document, policy_file_of, state_path
from .plan import plan_live
from .report import LivePlan, Proposal
from .state import Record, State, StateFile
from .view import ClusterView, view_from_client
from .weights import WeightChange

DEFAULT_NODE_CONFIG = "/etc/gpushare/node.yaml"
GPU_NAMES = ("gpu", "mps", "shard")
SLACK = 600.0  # s the lock outlives the wait and the relayout job (cron's period, slurmctld re-executing)
CLOCK_SKEW = 120.0  # s a relayout job's submit time (slurmctld's clock) may read before its change began (ours)


class LiveApplyError(GpushareError):
    exit_code = 1


class Planner(Protocol):
    """What the apply side asks of the planner: read the cluster, plan, edit the policy document. ``PRODUCT`` is
    the product's own; a test passes a fake."""

    @property
    def read_view(self) -> ReadView: ...

    def plan(self, site, view: ClusterView, doc: dict) -> LivePlan: ...

    def with_layouts(self, doc: dict, node: str, layouts: dict[int, tuple[str, ...]]) -> dict: ...

    def with_modes(self, doc: dict, node: str, modes: dict[int, dict]) -> dict: ...


@dataclass(frozen=True)
class ProductPlanner:
    read_view: ReadView = view_from_client

    def plan(self, site, view: ClusterView, doc: dict) -> LivePlan:
        return plan_live(site, view, doc)

    def with_layouts(self, doc: dict, node: str, layouts: dict[int, tuple[str, ...]]) -> dict:
        return document.with_layouts(doc, node, layouts)

    def with_modes(self, doc: dict, node: str, modes: dict[int, dict]) -> dict:
        return document.with_modes(doc, node, modes)


PRODUCT = ProductPlanner()


@dataclass
class RunReport:
    lines: list[str] = field(default_factory=list)
    plan: LivePlan | None = None  # the plan of this run
    actions: list = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)


@dataclass
class LiveApply:
    """The apply path for one admin policy."""

    admin_policy: Path
    client: SlurmClient
    clock: Callable[[], float] = time.time
    node_config: str = DEFAULT_NODE_CONFIG
    relayout_timeout: float = 600.0  # `gpushare node relayout --timeout` default: twice (jobs, registration)
    say: Callable[[str], None] | None = None  # a line printer for progress (the report collects the lines too)
    policy_file: Path | None = None  # override live.policy_file (tests)
    planner: Planner = PRODUCT

    def __post_init__(self):
        from ..policy import load_file

        self.admin_policy = Path(self.admin_policy)
        self.admin = load_file(self.admin_policy)
        live = self.admin.policy.live
        if not live.enabled:
            raise LiveApplyError(
                f"{self.admin_policy}: live.enabled is false: set `live: {{enabled: true}}` to let "
                "`gpushare live apply` change layouts"
            )
        self.live = live
        self.policy_file = Path(self.policy_file) if self.policy_file else policy_file_of(self.admin)
        self.store = StateFile(state_path(self.policy_file))
        self.conf_dir = Path(self.admin.cluster.paths.slurm_conf_dir)
        self.host = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def relayout_limit(self) -> float:
        """The relayout job's time limit: its two waits and the reconfigure."""
        return 2 * self.relayout_timeout + 120

    def run_once(self) -> RunReport:
        report = RunReport()
        now = self.clock()
        seen = observe(
            self.client,
            self.admin,
            self.admin_policy,
            self.store,
            now,
            policy_file=self.policy_file,
            release=lambda nodes: self._release_orphans(nodes, report),
            read_view=self.planner.read_view,
        )
        state, view = seen.state, seen.view
        plan = report.plan = self.planner.plan(seen.site, view, seen.doc)
        gpu_jobs = gpu_jobs_by_node(view)
        job_ends = {c.job: self.client.job_end(c.job) for c in state.in_flight().values() if c.job is not None}
        found = {n: self._relayout_jobs(c, state) for n, c in state.in_flight().items() if c.phase == "submitting"}
        nodes = {n: (tuple(v.state), v.reason) for n, v in view.nodes.items()}
        actions = steps.next_steps(
            steps.StepInputs(
                now,
                state,
                seen.locks,
                self.live.max_wait,
                self.relayout_limit,
                gpu_jobs=gpu_jobs,
                job_ends=job_ends,
                node_states=nodes,
                found=found,
                proposals=plan.proposals,
                weights=plan.weights,
            )
        )
        report.actions = actions
        for action in actions:
            self._execute(action, gpu_jobs, report)
        return report

    # ---- recovery -------------------------------------------------------------------------------
    def _release_orphans(self, nodes, report: RunReport) -> frozenset[str]:
        """Delete the gpushare-relayout locks no change in flight owns (a run that stopped between deleting a
        lock's record and the lock, or a planner before intents were recorded): every lock a planner makes is
        made under the state file's lock after its intent is recorded, so one without an owner under that lock
        has none. The nodes whose lock went."""
        if not nodes:
            return frozenset()
        gone = set()
        with self.store.locked():
            state = self.store.read()
            for node in sorted(set(nodes) - set(state.in_flight())):
                try:
                    relayoutjob.delete_lock(self.client, node)
                except GpushareError as exc:  # a relayout job still in it: "in use"
                    self._say(
                        report, f"{node}: lock {lock_name(node)} has no change recorded and was not deleted: {exc}"
                    )
                    continue
                gone.add(node)
                self._say(report, f"{node}: deleted lock {lock_name(node)}: no change in flight owns it")
        return frozenset(gone)

    def _relayout_jobs(self, change: Record, state: State) -> tuple[int, ...]:
        """The root jobs named for the change's node submitted since it began, less the node's earlier changes'."""
        known = {c.job for c in state.history if c.node == change.node and c.job is not None}
        jobs = relayoutjob.relayout_jobs(self.client, change.node, change.locked_at - CLOCK_SKEW)
        return tuple(j for j in jobs if j not in known)

    # ---- execute --------------------------------------------------------------------------------
    def _say(self, report: RunReport, line: str) -> None:
        report.say(line)
        if self.say is not None:
            self.say(line)

    def _execute(self, action, gpu_jobs, report: RunReport) -> None:
        if isinstance(action, steps.Wait):
            self._say(report, f"{action.node}: {action.why}")
        elif isinstance(action, steps.Lost):
            self._end(action.node, "lost", action.why, report, delete=False)
        elif isinstance(action, steps.GiveUp):
            self._end(action.node, "gave_up", action.why, report, delete=True)
        elif isinstance(action, steps.StartRelayout):
            self._relayout(action.node, report)
        elif isinstance(action, steps.Drop):
            self._drop(action.node, action.why, report)
        elif isinstance(action, steps.Found):
            self._found(action.node, action.job, report)
        elif isinstance(action, steps.Finish):
            if action.drain:
                self.client.drain(action.node, action.drain[:200])
            self._end(action.node, "done" if action.ok else "failed", action.result, report, delete=True)
        elif isinstance(action, steps.SetWeight):
            self._weight(action.change, report)
        elif isinstance(action, steps.Adopt):
            if self._adopt(action.node, action.why, report) and not gpu_jobs.get(action.node):
                self._relayout(action.node, report)
        elif isinstance(action, steps.Take):
            if self._take(action.proposal, report) and not gpu_jobs.get(action.proposal.node):
                self._relayout(action.proposal.node, report)
        else:  # pragma: no cover - next_steps returns only the above
            raise LiveApplyError(f"unknown action {action!r}")

    def _take(self, p: Proposal, report: RunReport) -> bool:
        """Record the intent (locking), lock the node, record the change as waiting, all under the state file's
        lock; False when the node's record is newer than this run's view or the lock is held."""
        duration = self.live.max_wait + self.relayout_limit + SLACK
        now = self.clock()
        with self.store.locked():
            state = self.store.read()
            last = state.current.get(p.node)
            # another planner changed the node after this run looked: its record is newer than our view allows
            if last is not None and (last.in_flight or now - last.changed_at < self.live.min_dwell):
                self._say(
                    report,
                    f"{p.node}: not changed: another planner recorded a change at "
                    f"{last.changed_at:.0f} ({last.phase}) after this run looked",
                )
                return False
            intent = Record(p.change, phase="locking", locked_at=now, line=p.line, planner=self.host)
            state.put(intent)
            self.store.write(state)
            try:
                relayoutjob.create_lock(self.client, p.node, duration)
            except ReservationError as exc:  # scontrol answered: no reservation of ours was made
                state.take_back(p.node)
                self.store.write(state)
                self._say(report, f"{p.node}: not changed: {exc}")
                return False
            state.put(replace(intent, phase="waiting"))
            self.store.write(state)
        old, new = p.change.first()
        self._say(report, f"{p.node}: locked ({old} -> {new}): {p.line}")
        return True

    def _adopt(self, node: str, why: str, report: RunReport) -> bool:
        """A change recorded as locking whose lock exists: recorded waiting (under the lock, if still locking)."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or change.phase != "locking":
                return False
            state.put(replace(change, phase="waiting"))
            self.store.write(state)
        self._say(report, f"{node}: locked: {why}")
        return True

    def _drop(self, node: str, why: str, report: RunReport) -> None:
        """A change recorded as locking with no lock (under the lock, if still so): the record taken back, the
        node's last ended change (the history's) its record again; nothing counted."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or change.phase != "locking":
                return
            state.take_back(node)
            self.store.write(state)
        self._say(report, f"{node}: change not started: {why}")

    def _found(self, node: str, job: int, report: RunReport) -> None:
        """A change recorded as submitting whose job exists: the job recorded as the change's (no second one)."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or change.phase != "submitting":
                return
            self._record_job(state, change, job)
        self._say(
            report,
            f"{node}: relayout job {job} found by its name {lock_name(node)}: submitted by a run "
            f"that stopped before recording it ({change.planner})",
        )

    def _record_job(self, state: State, change: Record, job: int) -> None:
        state.put(replace(change, phase="relayout", job=job, submitted_at=self.clock()))
        self.store.write(state)

    def _relayout(self, node: str, report: RunReport) -> None:
        """Record the new layout (submitting), write the live policy and the configuration, extend the lock,
        submit the root relayout job, record it (all under the state lock). A change recorded as submitting by
        a run that stopped is taken on from there: its job is looked for first, and never submitted twice."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or change.phase not in ("waiting", "submitting"):
                self._say(report, f"{node}: relayout already started by another planner")
                return
            if change.phase == "submitting":
                jobs = self._relayout_jobs(change, state)
                if jobs:
                    self._record_job(state, change, min(jobs))
                    self._say(report, f"{node}: relayout job {min(jobs)} found by its name {lock_name(node)}")
                    return
            else:
                change = state.apply(change)  # the intent: the live policy's new entries and the node's prior
                state.put(change)
                self.store.write(state)
            try:
                job = self._submit(node, state)
            except (GpushareError, ValueError) as exc:  # ValueError: with_layout refuses the layout
                self._not_started(state, change, exc, report)
                return
            self._record_job(state, change, job)
        self._say(report, f"{node}: wrote {self.policy_file}, rendered into {self.conf_dir}, relayout job {job}")

    def _submit(self, node: str, state: State) -> int:
        self._write_policy(state)
        relayoutjob.extend_lock(self.client, node, self.relayout_limit + SLACK)
        return relayoutjob.submit_relayout(
            self.client,
            node,
            str(self.policy_file),
            log=self._log(node),
            time_limit_s=self.relayout_limit,
            partition=self._partition(node),
            node_config=self.node_config,
        )

    def _not_started(self, state: State, change: Record, exc: Exception, report: RunReport) -> None:
        """Nothing ran on the node: delete the lock (first: a job in it keeps it, and the record, for the next
        run), put the live policy and the configuration back, end the attempt."""
        node = change.node
        relayoutjob.delete_lock(self.client, node)
        state.restore(change)
        self._write_policy(state)
        state.put(replace(change, phase="failed", ended_at=self.clock(), result=f"not started: {exc}"))
        self.store.write(state)
        self._say(report, f"{node}: relayout not started, live policy put back: {exc}")

    def _weight(self, w: WeightChange, report: RunReport) -> None:
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
        """End the change in flight. Lost or given up: the live policy and the configuration are put back first
        when the change had written its layout (a run that stopped while submitting)."""
        with self.store.locked():
            state = self.store.read()
            change = state.current.get(node)
            if change is None or not change.in_flight:
                return
            put_back = phase in ("lost", "gave_up") and change.prior is not None
            if put_back:
                state.restore(change)
                self._write_policy(state)
            if delete:
                relayoutjob.delete_lock(self.client, node)
            state.put(replace(change, phase=phase, ended_at=self.clock(), result=why))
            self.store.write(state)
        self._say(report, f"{node}: {phase.replace('_', ' ')}: {why}{'; live policy put back' if put_back else ''}")

    # ---- the files ------------------------------------------------------------------------------
    def _write_policy(self, state: State) -> None:
        from ..outfiles import write_all
        from ..policy import load_file
        from ..render import render_all

        path = self.policy_file
        assert path is not None  # set by __post_init__
        doc = policy_document(self.admin_policy)
        for node, modes in sorted(state.modes.items()):  # GPU modes first: MIG GPUs are never among them
            doc = self.planner.with_modes(doc, node, {gpu: dict(entry) for gpu, entry in sorted(modes.items())})
        for node, layouts in sorted(state.layouts.items()):  # a node's GPUs validated as one set
            doc = self.planner.with_layouts(doc, node, {gpu: tuple(layout) for gpu, layout in sorted(layouts.items())})
        atomic_write(path, live_policy_text(doc, self.admin_policy, state))
        write_all(render_all(load_file(path)), self.conf_dir)

    def _log(self, node: str) -> str:
        return f"{self.admin.cluster.paths.log_dir.rstrip('/')}/gpushare-relayout-{node}-%j.log"

    def _partition(self, node: str) -> str | None:
        group = self.admin.group_for_node(node).name
        for tier in self.admin.tiers:
            if any(g.name == group for g in tier.groups):
                return tier.name
        return None


def gpu_jobs_by_node(view: ClusterView) -> dict[str, tuple[int, ...]]:
    """node -> ids of the running jobs holding a GPU, MPS or shard GRES there (ClusterView.running)."""
    out: dict[str, list[int]] = {}
    for job in view.running:
        if any(k.split(":", 1)[0] in GPU_NAMES and v for k, v in job.gres.items()):
            out.setdefault(job.node, []).append(job.job_id)
    return {n: tuple(sorted(j)) for n, j in out.items()}


def live_policy_text(doc: dict, admin: Path, state: State) -> str:
    import yaml

    changed = (
        ", ".join(
            f"{n} GPU {g}: {'+'.join(lay)}" for n, gl in sorted(state.layouts.items()) for g, lay in sorted(gl.items())
        )
        or "none"
    )
    head = (
        f"# Written by `gpushare live apply` from {admin}: do not edit (edit {admin.name}; the next\n"
        f"# change is written from it). Layouts changed by the live planner: {changed}\n"
    )
    if state.modes:
        modes = ", ".join(
            f"{n} GPU {g}: {document.mode_text(e)}"
            for n, ge in sorted(state.modes.items())
            for g, e in sorted(ge.items())
        )
        head += f"# GPU modes changed by the live planner: {modes}\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
