"""`gpushare node health`: slurm.conf's HealthCheckProgram. Repair what can be repaired,
drain (reason ``gpushare-health: ...``) for what cannot, resume a node it drained itself.

One run: (1) what `gpushare node reconcile` does, under the same locks (the
journal lock every hook holds for its whole run, then the MPS lock), but no
lock is held across a Slurm call: the journals' file identities are taken
under the locks, Slurm is asked what runs here with no lock held, and the
repair runs under the locks again, taking for an orphan only a journal that
is as it was before Slurm was asked (Slurm lists a job from allocation until
its epilog ends); a journal written since is kept for the next run. Lost
launches of batch jobs are requeued after the locks are released (a job with
no batch script, salloc or srun, is never considered; a requeue Slurm refuses
is a note, never a drain), and so are the jobs whose per-job MIG instance the
prolog could not make, once, where the policy requeues them
(``requeue_refused``); (2) checks that need no
lock: every device file this node's gres.conf names is a character device,
every GPU is as the policy says (model, MIG mode, MIG layout:
``mig.differences``, the comparison `gpushare node mig assert` prints), every
MPS daemon a running job's journal names answers on its socket; (3) the node's
Slurm state and reason (``scontrol show node``, through the Slurm client),
then ``plan_health`` (pure) decides: drain, resume, or nothing.

A drain reason starting with ``gpushare-health:`` is this program's own; any
other drain is an admin's and is never resumed here, with these exceptions:
the reasons our own prolog and epilog set (as root) before they fail
(``gpushare-prolog:``, ``gpushare-epilog:``; e.g. an MPS daemon killed while
it started); the drains slurmctld makes itself (as SlurmUser ``slurm``) after
a job launch failed on the node (``Job env setup error``, ``batch job complete
failure``); and slurmctld's ``Prolog error`` / ``Epilog error``, which follow
any site script's failure, only when attributed to our hook (``attributable``):
our journal showed that hook started and never finished (a SIGKILLed hook,
recorded in ``<state_dir>/health-unfinished-hooks`` when step (1) cleans up
after it), or it is the only Prolog / Epilog slurmctld runs (``scontrol show
config``). Another script's failure is left drained for an admin. Once step (1)
has cleaned up after the failed hook and the checks find nothing, the node
is resumed, at most ``HEAL_LIMIT`` times an hour (counted in
``<state_dir>/health-heals``); after that it stays drained for an admin. A dead
MPS daemon of a running job is reported, not a reason to drain: the jobs
attached to it have lost it already, and the next MPS prolog for its key
starts a fresh one.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GpushareError
from ..policy.share import Mode
from .paths import SCRIPT_MODULES
from .procscan import SEARCH_PATH

PREFIX = "gpushare-health:"
# slurmctld's own drains after a hook or launch failure (node_mgr.c validate_node_specs, proc_req.c
# _slurm_rpc_complete_batch_script, job_mgr.c epilog handling; Slurm 24.11), set as SlurmUser.
SLURM_HOOK_DRAINS = frozenset({"Prolog error", "Epilog error", "Job env setup error", "batch job complete failure"})
# of those, the ones any Prolog / Epilog script causes: healed only when attributed to ours (``attributed``)
SCRIPT_DRAINS = {"Prolog error": "prolog", "Epilog error": "epilog"}
SLURM_USER = "slurm"  # SlurmUser of the rendered slurm.conf
HOOK_PREFIXES = ("gpushare-prolog:", "gpushare-epilog:")  # the reasons the root hooks set when they fail
HOOK_MODULES = {hook: SCRIPT_MODULES[hook] for hook in ("prolog", "epilog")}  # the root hooks Slurm runs per job
UNFINISHED = "health-unfinished-hooks"  # <state_dir>/...: "<epoch s> <prolog|epilog> <job id>" per line
REPAIRS = "health-repairs.log"  # <state_dir>/...: "<UTC time> <what was repaired>" per line, the last REPAIRS_KEEP
REPAIRS_KEEP = 2000
HEAL_LIMIT = 3  # resumes of such drains per node per hour
HEAL_WINDOW_S = 3600
REASON_MAX = 200
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


class HealthError(GpushareError):
    exit_code = 1


# ---- findings (what was observed and repaired) -----------------------------------------


@dataclass
class Findings:
    repaired: list[str] = field(default_factory=list)  # reconcile's lines, done
    unrepaired: list[str] = field(default_factory=list)  # a repair that failed
    missing_devices: list[str] = field(default_factory=list)  # "path (gres.conf:line)"
    layout: list[str] = field(default_factory=list)  # mig.differences lines
    compute_modes: list[str] = field(default_factory=list)  # MPS GPUs whose compute mode is not the policy's
    notes: list[str] = field(default_factory=list)  # reported, never a drain

    def problems(self) -> list[str]:
        """What this node cannot run jobs safely with, one short phrase each (the drain reason's parts)."""
        out = []
        if self.missing_devices:
            out.append("device files missing: " + ", ".join(self.missing_devices))
        out += [f"GPU layout: {line}" for line in self.layout]
        out += [f"compute mode: {line}" for line in self.compute_modes]
        out += [f"not repaired: {line}" for line in self.unrepaired]
        return out


def device_ok(path: str) -> bool:
    """A character device at ``path`` (what slurmd needs of a gres.conf File=)."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def check_devices(records, is_device=device_ok) -> list[str]:
    """The files of this node's gpu GRES records that are not character devices, each once, in order."""
    missing: list[str] = []
    for record in records:
        for path in record.files:
            if not is_device(path) and path not in missing:
                missing.append(path)
    return missing


def check_mps(journals, answers) -> list[str]:
    """A daemon named by a (running job's) journal whose control socket does not answer, or whose key dir is not
    its own tmpfs (``mps.MpsControl.mount_key``)."""
    from .mps import is_mount

    notes, seen = [], set()
    for job_id in sorted(journals):
        daemon = journals[job_id].mps
        if daemon is None or daemon.key in seen:
            continue
        seen.add(daemon.key)
        if not answers(daemon.pipe_dir):
            notes.append(
                f"MPS daemon {daemon.key} of job {job_id} does not answer (pipe {daemon.pipe_dir}); "
                "the next MPS prolog for it starts a fresh one"
            )
        elif not is_mount(os.path.dirname(daemon.pipe_dir)):
            notes.append(
                f"MPS daemon {daemon.key} of job {job_id} has no tmpfs of its own (the prolog could not mount one: "
                "slurmd's log says why): its user can fill the directory the other users' daemons start in"
            )
    return notes


# ---- decision (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    reason: str

    def __str__(self) -> str:
        return f"drain: {self.reason}"


@dataclass(frozen=True)
class Resume:
    previous: str
    by: str = "the health check"

    def __str__(self) -> str:
        return f"resume (drained by {self.by}: {self.previous})"


@dataclass(frozen=True)
class Leave:
    why: str

    def __str__(self) -> str:
        return self.why


def drain_reason(problems: list[str]) -> str:
    text = _PRINTABLE.sub("?", f"{PREFIX} " + "; ".join(problems))
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def slurm_hook_drain(reason: str, reason_user: str, attributed: frozenset[str] = frozenset()) -> bool:
    """A drain slurmctld made itself after a hook or job launch failed on the node, or the reason our own
    root hooks set before failing (``gpushare-prolog: ...``, ``gpushare-epilog: ...``; hooks/_common.py),
    which slurmctld keeps when it drains the node for the failure. Slurm's ``Prolog error`` and ``Epilog
    error`` follow any site script's failure: they count only when ``attributed`` names them (see
    ``attributable``); never another script's failure."""
    if reason.startswith(HOOK_PREFIXES):
        return reason_user in ("root", SLURM_USER)
    if reason in SCRIPT_DRAINS and reason not in attributed:
        return False
    return reason in SLURM_HOOK_DRAINS and reason_user == SLURM_USER


def plan_health(
    state: tuple[str, ...],
    reason: str,
    problems: list[str],
    reason_user: str = "",
    heals: int = 0,
    attributed: frozenset[str] = frozenset(),
) -> Drain | Resume | Leave:
    """What to do with the node given its Slurm state (``("IDLE", "DRAIN")``), drain reason and problems.

    - problems, node not drained: drain with a ``gpushare-health:`` reason naming them;
    - problems, drained by us with another reason: drain again (the reason is updated);
    - problems, drained by someone else: leave it (their reason stays);
    - no problems, drained by us: resume; drained by someone else: leave it;
    - no problems, drained by slurmctld after a hook failure (``slurm_hook_drain``; a ``Prolog error`` or
      ``Epilog error`` only when ``attributed`` to our hooks): resume, unless ``heals`` (such resumes of
      this node in the last hour) reached ``HEAL_LIMIT``."""
    drained = "DRAIN" in state
    ours = reason.startswith(PREFIX)
    if drained and reason in SCRIPT_DRAINS and reason not in attributed and reason_user == SLURM_USER:
        return Leave(
            f"drained by Slurm ({reason}), not attributed to the gpushare {SCRIPT_DRAINS[reason]}: another "
            f"{SCRIPT_DRAINS[reason].capitalize()} script runs here and no journal shows ours unfinished; "
            "left drained for an admin"
        )
    if drained and not problems and slurm_hook_drain(reason, reason_user, attributed):
        if heals >= HEAL_LIMIT:
            return Leave(
                f"healthy, but drained by Slurm ({reason}) and resumed {heals} times in the last hour: "
                "left drained for an admin"
            )
        by = "a failed gpushare hook" if reason.startswith(HOOK_PREFIXES) else "Slurm after a hook failure"
        return Resume(reason, by=f"{by}, cleaned up since")
    if problems:
        wanted = drain_reason(problems)
        if not drained:
            return Drain(wanted)
        if not ours:
            return Leave(f"drained by someone else ({reason or 'no reason'}); left drained, reason kept")
        if reason != wanted:
            return Drain(wanted)
        return Leave("already drained by the health check for the same reason")
    if drained and ours:
        return Resume(reason)
    if drained:
        return Leave(f"healthy; drained by someone else ({reason or 'no reason'}), not resumed")
    return Leave("healthy")


# ---- one run ---------------------------------------------------------------------------


@dataclass
class Report:
    node: str
    findings: Findings
    decision: Drain | Resume | Leave

    def lines(self) -> list[str]:
        f = self.findings
        out = [f"node {self.node}: repaired: {line}" for line in f.repaired]
        out += [f"node {self.node}: PROBLEM: {p}" for p in f.problems()]
        out += [f"node {self.node}: note: {n}" for n in f.notes]
        out.append(f"node {self.node}: {self.decision}")
        return out


def local_jobs() -> set[int]:
    """``jobs_with_steps`` (a seam for tests: the unit tests' nodes have no slurmstepd)."""
    return jobs_with_steps()


def observe_and_repair(
    node: str,
    state_dir: str,
    client,
    backend,
    mps,
    killer,
    dry_run: bool = False,
    metrics=None,
    lost_after: float | None = None,
    per_job: tuple[int, ...] = (),
) -> Findings:
    """Step 1, reconcile, with no lock held across a Slurm call (slurmctld can take tens of seconds to answer,
    and every prolog waits for the journal lock). Under the journal lock and the MPS lock, as the hooks take
    them: (a) the journals' file identities; then, with no lock, what Slurm runs here (``squeue -w``) and its
    running batch jobs; then again under both locks (b) the journals: one whose file is as it was at (a) and
    whose job Slurm does not list is an orphan (Slurm lists a job from allocation until its epilog ends, and
    a journal as it was at (a) was written before that read); one written since (a prolog of a job allocated
    after the read) is kept for the next run. The lost-launch requeue runs after the locks are released.

    With ``metrics`` (``dcgm_job_mapping_dir`` and ``textfile_dir`` attributes: the policy's cluster.metrics or
    the node spec), dcgm-exporter's job mapping is rewritten from the journals of the jobs Slurm runs here, as
    `gpushare node reconcile` does, and the textfile's job rows and journal count from the journals left: an
    entry no epilog removed (its job's journal undone here, or the job requeued and run elsewhere) goes.
    Metrics that cannot be written are a note, never a drain (metrics never stop jobs)."""
    from .journal import JournalStore
    from .mps import mps_lock
    from .reconcile import running_jobs

    findings = Findings()
    store = JournalStore(state_dir)
    with store.locked(), mps_lock(state_dir):
        before = journal_marks(store)
    running = running_jobs(client, node)  # Slurm, no lock held
    started = batch_jobs_started(findings, client, node)  # Slurm, no lock held
    with store.locked(), mps_lock(state_dir):
        # a job with a slurmstepd here runs here: its journal is never an orphan, whatever squeue said
        running = running | local_jobs()
        repair_locked(
            findings, node, state_dir, store, before, running, backend, mps, killer, dry_run, metrics, per_job
        )
        # no hook runs while the journal lock is held: a job past its launch has its batch slurmstepd here. The
        # scan runs in a child with a deadline (procscan): no process can hold the locks through it
        stepds = stepd_jobs() if started else set()
    if started and stepds is None:
        findings.notes.append(
            "lost launches: not checked this run: the slurmstepd processes could not be listed "
            f"(no slurmstepd on {SEARCH_PATH}, or the scan of /proc stalled)"
        )
    elif started and stepds is not None:
        requeue_lost_jobs(findings, node, client, started, stepds, dry_run, after=lost_after)  # Slurm, no lock held
    requeue_refused(findings, client, state_dir, dry_run)  # Slurm, no lock held
    findings.notes += getattr(mps, "notes", [])
    if not dry_run:
        findings.notes += sweep_set_aside(state_dir)  # no lock held: what jobs left in their pipe dirs waits on nothing
    return findings


def sweep_set_aside(state_dir: str) -> list[str]:
    """Remove the MPS key dirs the hooks set aside (``node/aside.py``), within the health check's budget; what
    is left, or cannot be removed, is a note with its path (never a drain: it is what a job left in its own
    directories, out of every hook's way)."""
    from .aside import HEALTH_BUDGET, Budget, sweep

    return sweep(f"{state_dir.rstrip('/')}/mps", Budget(*HEALTH_BUDGET))


def check_user_dirs(state_dir: str, slots) -> list[str]:
    """A note when this node has MPS GPUs and ``<state_dir>/mps`` (where the jobs' pipe dirs are, which their users
    can fill) is on the filesystem of the journals: a job could then fill it and fail every later hook on the node."""
    if not any(slot.mode == Mode.MPS for slot in slots):
        return []
    mps_dir = f"{state_dir.rstrip('/')}/mps"
    try:
        shared = os.stat(mps_dir).st_dev == os.stat(state_dir).st_dev
    except FileNotFoundError:
        shared = True  # not mounted yet: the first MPS prolog makes it on the state dir's filesystem
    except OSError as exc:
        return [f"{mps_dir}: cannot check its filesystem: {exc.strerror}"]
    if not shared:
        return []
    return [
        f"{mps_dir} (the MPS pipe directories jobs write) is on the filesystem of {state_dir}: a job can fill "
        "it; mount a size-capped tmpfs there (docs: Files on a node)"
    ]


def journal_marks(store) -> dict[int, tuple[int, int]]:
    """job id -> (inode, mtime ns) of each journal file: a journal rewritten (atomic rename) gets a new inode."""
    marks = {}
    for job_id in store.job_ids():
        try:
            info = os.stat(store.path(job_id))
        except FileNotFoundError:
            continue
        marks[job_id] = (info.st_ino, info.st_mtime_ns)
    return marks


def repair_locked(
    findings: Findings,
    node: str,
    state_dir: str,
    store,
    before,
    running: set[int],
    backend,
    mps,
    killer,
    dry_run: bool,
    metrics,
    per_job: tuple[int, ...] = (),
) -> None:
    """The reconcile part of step 1, under both locks: a journal written since ``before`` counts as running;
    ``per_job``: the node's per-job MIG GPUs, whose instances no journal names are destroyed (reconcile)."""
    from .mps import answers
    from .reconcile import execute_reconcile, plan_for_node

    journals = store.all()
    marks = journal_marks(store)
    fresh = {j for j in journals if j not in running and marks.get(j) != before.get(j)}
    held = running | fresh
    try:
        plan = plan_for_node(journals, held, backend, state_dir, store, per_job=per_job)
        findings.repaired = [line.split(": ", 1)[1] for line in plan.lines(node) if not line.endswith("journal kept")]
        if not dry_run:
            findings.unrepaired = execute_reconcile(plan, store, mps, killer, journals)
            note_unfinished(Path(state_dir) / UNFINISHED, [journals[j] for j in plan.orphans])
    except (OSError, GpushareError) as exc:  # reported with its path; the next run tries again, never a crash
        findings.unrepaired.append(f"reconcile: {exc}")
        return
    kept = {j: journals[j] for j in plan.kept}
    findings.notes = check_mps(kept, answers) + plan.notes
    if metrics is not None and not dry_run:
        repair_metrics(findings, metrics, state_dir, store, held)


def repair_metrics(findings: Findings, metrics, state_dir: str, store, running: set[int]) -> None:
    from ..metrics import textfile
    from ..metrics.dcgmjobs import repair
    from .mps import running_daemons

    left = store.all()
    if metrics.dcgm_job_mapping_dir is not None:
        try:
            removed, added = repair(metrics.dcgm_job_mapping_dir, left.values(), running)
            findings.repaired += removed + added
        except OSError as exc:
            findings.notes.append(
                f"dcgm job mapping {metrics.dcgm_job_mapping_dir} not repaired: {type(exc).__name__}: {exc}"
            )
    if metrics.textfile_dir is not None:
        snapshot = textfile.NodeObservation(
            journals_present=len(left),
            mps_daemons_running=running_daemons(state_dir),
            jobs=textfile.jobs_of(left.values()),
        )
        snapshot.mig_slices, snapshot.mig_free = textfile.per_job_slices(
            left.values(), getattr(metrics, "gpus", ())
        ) or (None, None)
        try:
            textfile.refresh(state_dir, metrics.textfile_dir, snapshot)
        except OSError as exc:
            findings.notes.append(f"metrics file in {metrics.textfile_dir} not written: {type(exc).__name__}: {exc}")


LOST_AFTER_S = 120  # a job's prolog and launch take seconds; a running job older than this has a slurmstepd


def lost_jobs(started: dict[int, int], stepds: set[int], now: float, after: float = LOST_AFTER_S) -> list[int]:
    """Batch jobs Slurm runs here (this node their batch host) for more than ``after`` seconds without a batch
    slurmstepd on the node: their launch was lost (slurmd killed between accepting and starting them). Slurm itself
    notices only at the node's next registration (every ~20 pings, half an hour with SlurmdTimeout=300). A job
    with no batch script (salloc, srun) has no batch slurmstepd anywhere: ``started`` never holds one
    (``batch_jobs_started``)."""
    return sorted(j for j, t in started.items() if j not in stepds and now - t > after)


_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.batch\]")
_ANY_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.[A-Za-z0-9_]+\]")


def jobs_with_steps(proc: Path = Path("/proc"), stepd: tuple[str, ...] | None = None) -> set[int]:
    """Job ids with any step's slurmstepd on this node (``[JOB.extern]``, ``[JOB.batch]``, ``[JOB.N]``): jobs that
    run here, whatever slurmctld says (a slurmctld restarted from an older saved state can list such a job as
    pending). Read as ``stepd_jobs`` reads titles; an empty set when the list is not known."""
    return {int(m[1]) for title in stepd_titles(proc, stepd) or () if (m := _ANY_STEPD.match(title))}


def stepd_jobs(proc: Path = Path("/proc"), stepd: tuple[str, ...] | None = None) -> set[int] | None:
    """Job ids of this node's batch-step slurmstepd processes (title ``slurmstepd: [JOB.batch]``). The
    extern step's (``[JOB.extern]``, PrologFlags=Contain) starts before the launch, so it does not count.
    A slurmstepd is a process of root's whose executable is ``stepd`` (default: the slurmstepd found on
    SEARCH_PATH, links resolved); only such a process's title is read, never another's (a user's process
    takes any title, and a read of its memory can be made to hang: node/procscan.py). None when the list is
    not known (no slurmstepd found, or the scan did not finish in time): then no launch counts as lost."""
    titles = stepd_titles(proc, stepd)
    if titles is None:
        return None
    return {int(m[1]) for title in titles if (m := _STEPD.match(title))}


def stepd_titles(proc: Path, stepd: tuple[str, ...] | None) -> list[bytes] | None:
    """The titles of root's slurmstepd processes (``stepd``: its executables, default the one on SEARCH_PATH),
    read only of such processes (node/procscan.py); None when not known."""
    from .procscan import cmdlines, executable_paths

    paths = executable_paths("slurmstepd") if stepd is None else stepd
    titles = cmdlines(paths, 0, str(proc)) if paths else None
    return None if titles is None else list(titles.values())


def batch_jobs_started(findings: Findings, client, node: str) -> dict[int, int] | None:
    """The running batch jobs whose batch host is this node (``client.batch_jobs_started``), or None, with a
    note, when Slurm cannot say: a lost launch waits for the next run, the node is not drained for it."""
    try:
        return client.batch_jobs_started(node)
    except (GpushareError, OSError) as exc:
        findings.notes.append(f"lost launches: cannot read the running batch jobs: {exc}")
        return None


def requeue_lost_jobs(
    findings: Findings,
    node: str,
    client,
    started: dict[int, int],
    stepds: set[int],
    dry_run: bool,
    now: float | None = None,
    after: float | None = None,
) -> None:
    """Requeue each lost launch (``lost_jobs``) that Slurm, asked again after the slurmstepd scan, still runs
    here with the same start (a job that ended or was requeued meanwhile is not requeued again). A requeue
    Slurm refuses is a note, never a drain: nothing on the node is wrong because of it."""
    import time

    lost = lost_jobs(started, stepds, time.time() if now is None else now, LOST_AFTER_S if after is None else after)
    if lost:
        again = batch_jobs_started(findings, client, node)
        lost = [j for j in lost if again is not None and again.get(j) == started[j]]
    for job in lost:
        line = (
            f"job {job}: running for Slurm since {started[job]} but no batch slurmstepd here (launch lost): requeue it"
        )
        requeue(findings, client, job, line, dry_run)


def requeue(findings: Findings, client, job: int, line: str, dry_run: bool) -> None:
    """Requeue ``job`` through the Slurm client, ``line`` saying why: a repair, or a note when Slurm refuses (a job
    without a batch script, salloc or srun, cannot be requeued; nor one that asked not to be): never a drain."""
    if dry_run:
        findings.repaired.append("would " + line)
        return
    try:
        client.requeue(job)
        findings.repaired.append(line)
    except (GpushareError, OSError) as exc:
        findings.notes.append(f"{line}: Slurm refused: {exc}")


def requeue_refused(findings: Findings, client, state_dir: str, dry_run: bool) -> None:
    """Requeue, once, each job whose per-job MIG instance the prolog could not make where the policy requeues
    (``Share.on_slice_failure``; the prolog left a request: node.perjob.request_requeue, as it must not call Slurm
    itself). Slurm requeues a batch job whether it still runs, is completing or has ended (while it still knows
    it: MinJobAge); an interactive job (salloc, srun) cannot be requeued: Slurm refuses, a note here, and the job
    has failed with the refusal's message already. The request goes after one try either way, so a job is
    requeued at most once per refusal, and the prolog asks no more once Slurm's restart count reaches
    ``MAX_SLICE_REQUEUES`` (the job then fails with the message)."""
    from .perjob import drop_request, requeue_requests

    for job, text in sorted(requeue_requests(state_dir).items()):
        why = text.strip().partition(" ")[2]
        requeue(
            findings, client, job, f"job {job}: its MIG instance could not be made ({why[:120]}): requeue it", dry_run
        )
        if not dry_run:
            drop_request(state_dir, job, text)


# ---- which generic Slurm drains are ours -------------------------------------------------


def note_unfinished(path: Path, orphans, now: float | None = None) -> None:
    """Record the orphans whose journal shows our hook started and never finished (``preparing``: a prolog,
    ``ending``: an epilog, e.g. SIGKILLed): the evidence that a ``Prolog error`` / ``Epilog error`` drain
    is ours, kept an hour or until a resume of that drain uses it (``attributable``)."""
    import time

    hooks = {"preparing": "prolog", "ending": "epilog"}
    new = [(hooks[j.state], j.job_id) for j in orphans if j.state in hooks]
    if not new:
        return
    now = time.time() if now is None else now
    entries = unfinished_hooks(path, now) + [(now, hook, job) for hook, job in new]
    write_unfinished(path, entries)


def unfinished_hooks(path: Path, now: float | None = None) -> list[tuple[float, str, int]]:
    """(time, hook, job id) of the last hour's unfinished hooks; a bad line or file counts as none."""
    import time

    now = time.time() if now is None else now
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        words = line.split()
        try:
            entry = (float(words[0]), words[1], int(words[2]))
        except (IndexError, ValueError):
            continue
        if len(words) == 3 and entry[1] in HOOK_MODULES and now - HEAL_WINDOW_S < entry[0] <= now:
            out.append(entry)
    return out


def write_unfinished(path: Path, entries) -> None:
    from ..atomic import atomic_write

    atomic_write(path, "".join(f"{int(t)} {hook} {job}\n" for t, hook, job in entries))  # floor: never after now


def sole_hook(programs: list[str], hook: str, read=None) -> bool:
    """Slurm's ``Prolog`` / ``Epilog`` programs (``scontrol show config``: one ``Prolog[N]`` line each) are one
    program, and it is ours: a script that runs ``slurm_gpushare.hooks.<hook>`` (the one ``gpushare node
    install`` writes, pip's console script, or a link to either). Several programs, a glob or any other program
    are not."""
    if len(programs) != 1 or not re.fullmatch(r"/[A-Za-z0-9_./+-]+", programs[0]):
        return False
    try:
        head = (read or _head)(programs[0])
    except OSError:
        return False
    return re.search(rf"^(from|import) {re.escape(HOOK_MODULES[hook])}\b", head, re.MULTILINE) is not None


def _head(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(4096).decode("utf-8", "replace")


def attributable(reason: str, client, state_dir: str, read=None) -> frozenset[str]:
    """``{reason}`` when Slurm's generic ``reason`` (``Prolog error``, ``Epilog error``) can be put down to our
    hook: our journal showed it started and never finished (``note_unfinished``), or it is the only Prolog /
    Epilog Slurm runs (asked of slurmctld, with no lock held); else empty."""
    from ..slurm.client import SlurmClientError

    hook = SCRIPT_DRAINS.get(reason)
    if hook is None:
        return frozenset()
    if any(h == hook for _t, h, _j in unfinished_hooks(Path(state_dir) / UNFINISHED)):
        return frozenset({reason})
    try:
        programs = client.hook_programs()
    except (SlurmClientError, OSError):
        return frozenset()
    return frozenset({reason}) if sole_hook(programs.get(hook.capitalize(), []), hook, read) else frozenset()


def used_evidence(path: Path, reason: str) -> None:
    """A resume of ``reason`` used the unfinished-hook records of its hook: drop them."""
    hook = SCRIPT_DRAINS.get(reason)
    entries = unfinished_hooks(path)
    if hook is not None and any(h == hook for _t, h, _j in entries):
        write_unfinished(path, [e for e in entries if e[1] != hook])


def check_compute_modes(slots, backend) -> list[str]:
    """MPS GPUs whose live compute mode is not the policy's compute_mode (nvidia-smi -c; lost when the driver
    reloads): "GPU 0 (GPU-...) is EXCLUSIVE_PROCESS, policy default: nvidia-smi -i 0 -c DEFAULT"."""
    out = []
    for slot in slots:
        want = slot.share.wanted_compute_mode
        if not want:
            continue
        have = backend.compute_mode(slot.index)
        if have != want:
            uuid = backend.gpu(slot.index).uuid
            out.append(
                f"GPU {slot.index} ({uuid}) is {have}, policy {want.lower()}: nvidia-smi -i {slot.index} -c {want}"
            )
    return out


def check_node(findings: Findings, node: str, gres_conf: Path, slots, backend, is_device=device_ok) -> None:
    """Step 2: device files of this node's gres.conf, the GPUs against the policy."""
    from .gresindex import GresConfReadError, gpu_records
    from .mig import differences, observe

    try:
        findings.missing_devices = check_devices(gpu_records(gres_conf, node), is_device)
    except GresConfReadError as exc:
        findings.unrepaired.append(f"gres.conf: {exc}")
    findings.layout = differences(slots, observe(backend, [s.index for s in slots]))
    findings.compute_modes = check_compute_modes(slots, backend)


def run_health(
    node: str,
    state_dir: str,
    gres_conf: Path,
    slots,
    client,
    backend,
    mps,
    killer,
    is_device=device_ok,
    dry_run: bool = False,
    metrics=None,
    read_hook=None,
    lost_after: float | None = None,
) -> Report:
    """observe + repair, check, read the node, decide (``plan_health``), drain or resume (unless dry_run).
    No lock is held from here on: every Slurm call below runs with the node's hooks free to run.
    ``read_hook(path) -> str``: the start of a hook program (tests; default: read the file). ``lost_after``: seconds
    before a batch job without its slurmstepd is a lost launch (default ``LOST_AFTER_S``)."""
    from ..slurm.client import SlurmClientError

    per_job = tuple(s.index for s in slots if s.share.is_per_job_mig)
    findings = observe_and_repair(node, state_dir, client, backend, mps, killer, dry_run, metrics, lost_after, per_job)
    check_node(findings, node, gres_conf, slots, backend, is_device)
    findings.notes += check_user_dirs(state_dir, slots)
    try:
        current = client.node(node)
    except SlurmClientError as exc:
        raise HealthError(f"node {node}: cannot read its Slurm state: {exc}") from None
    heal_log = Path(state_dir) / "health-heals"
    heals = recent_heals(heal_log)
    attributed: frozenset[str] = frozenset()
    if "DRAIN" in current.state and current.reason in SCRIPT_DRAINS and current.reason_user == SLURM_USER:
        attributed = attributable(current.reason, client, state_dir, read_hook)
    decision = plan_health(
        current.state, current.reason, findings.problems(), current.reason_user, len(heals), attributed
    )
    if not dry_run:
        log_repairs(Path(state_dir) / REPAIRS, findings.repaired)
        if isinstance(decision, Drain):
            client.drain(node, decision.reason)
        elif isinstance(decision, Resume):
            client.resume(node)
            if decision.by != Resume.by:
                record_heal(heal_log, heals)
                used_evidence(Path(state_dir) / UNFINISHED, current.reason)
    return Report(node, findings, decision)


def log_repairs(path: Path, repaired: list[str], now: float | None = None) -> None:
    """Append what this run repaired to ``path`` (one line each, after the UTC time), keeping the last
    ``REPAIRS_KEEP`` lines: what the health check undid on the node, for the admin. Never a failure."""
    import time

    if not repaired:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    try:
        try:
            old = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            old = []
        lines = old + [f"{stamp} {_PRINTABLE.sub('?', line)[:500]}" for line in repaired]
        from ..atomic import atomic_write

        atomic_write(path, "".join(f"{line}\n" for line in lines[-REPAIRS_KEEP:]), mode=0o644)
    except OSError:
        pass  # a log that cannot be written never fails the health check


def recent_heals(path: Path, now: float | None = None) -> list[float]:
    """Times (epoch seconds) of the resumes of Slurm's hook-failure drains in the last hour; a bad file counts as
    none."""
    import time

    now = time.time() if now is None else now
    try:
        times = [float(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []
    return [t for t in times if now - HEAL_WINDOW_S < t <= now]


def record_heal(path: Path, heals: list[float], now: float | None = None) -> None:
    import time

    from ..atomic import atomic_write

    atomic_write(path, "".join(f"{int(t)}\n" for t in [*heals, time.time() if now is None else now]))  # floor


def slots_from_spec(spec) -> list:
    """The policy's GPU slots for this node from the cached NodeSpec (no policy load)."""
    from ..hardware import get_model
    from ..policy.site import GpuSlot

    return [GpuSlot(g.index, get_model(g.model), g.share) for g in spec.gpus]
