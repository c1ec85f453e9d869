"""The node's metrics as a node_exporter textfile-collector file, written by the hooks.

node_exporter's textfile collector reads every ``*.prom`` file of one
directory (``--collector.textfile.directory``; Debian's
prometheus-node-exporter package documents /var/lib/prometheus/node-exporter
in /usr/share/doc/prometheus-node-exporter/README.textfile) on each scrape.
The prolog, the epilog and `gpushare node reconcile` (re)write
``<textfile_dir>/gpushare.prom`` after each run, atomically (a temporary
``.gpushare.prom.XXXX`` in the same directory, which the ``*.prom`` glob
skips, then a rename), when the policy sets ``cluster.metrics.textfile_dir``.
The directory is opened from / one component at a time without following a
symbolic link or blocking on a FIFO, and written through that descriptor
(``open_dir``, ``write_at``); one that is not root's, or that its group or
others may write in, is refused (``UnsafeDir``, an OSError naming the path).

Hooks are short-lived processes, so the counters live in a small state file,
``<state_dir>/metrics.json``, read, updated and written back under an flock
of ``<state_dir>/metrics.lock``: concurrent hooks never lose an increment, and
the ``.prom`` file is rendered from the state under the same lock, so the
last writer's file holds every increment. Gauges that a run could not observe
(a failed hook, a hook that saw only some GPUs) keep their last value.

Metrics (names are a contract with the dashboard and the cluster tests)::

    gpushare_node_hook_runs_total{hook, result}             counter  result: ok | failed
    gpushare_node_hook_failures_total{hook, reason}         counter  reason: one of REASONS
    gpushare_node_hook_last_duration_seconds{hook}          gauge
    gpushare_node_hook_last_run_timestamp_seconds{hook}     gauge    (unix time the last run ended)
    gpushare_node_mps_daemons_running                       gauge
    gpushare_node_journals_present                          gauge    job journals in the state dir now
    gpushare_node_mig_layout_matches_policy{gpu}            gauge    1/0, MIG GPUs of the policy only
    gpushare_node_job_gpu_info{job_id, gpu, uuid, mig_uuid, gpu_instance_id, compute_instance_id}  gauge = 1
    gpushare_node_dcgm_mapping_errors_total                 counter  dcgm-exporter mapping writes that failed
    gpushare_node_mig_per_job_slices{gpu, profile}          gauge    per-job MIG instances jobs hold (journals)
    gpushare_node_mig_per_job_free{gpu, profile}            gauge    how many more of the profile fit now
    gpushare_node_mig_slice_create_seconds                  histogram  the prolog making a job's instance
    gpushare_node_mig_slice_refusals_total{reason}          counter  jobs refused: their instance not made

The per-job MIG families are written on a node with per-job MIG GPUs only.
Their running and free figures come from the journals (the profile and
memory-slice start the prolog journals for each job's instance), not from
NVML: free is how many more instances of that profile alone
``hardware.migplace.room`` finds beside the journaled ones, 0 while a job
holds the GPU whole.

``hook`` is prolog, epilog or reconcile. Every (hook, result) and (hook,
reason) pair is written from the first run on, at 0 until it happens, so
``increase()`` sees the first increment.

Nothing here imports more than the standard library and ``atomic``: the
prolog and epilog are on every job's start and end.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import atomic_write, flocked, trust_problem

FILE_NAME = "gpushare.prom"
STATE_NAME = "metrics.json"
LOCK_NAME = "metrics.lock"
STATE_FORMAT = "gpushare-node-metrics/1"
HOOKS = ("prolog", "epilog", "reconcile")
RESULTS = ("ok", "failed")
# The bounded failure reasons: the error's class decides (``failure_reason``).
REASONS = {
    "unsafe": "the node is not safe for or after the job (busy device, leftover or surviving process)",
    "mps": "an MPS control daemon would not start, answer or quit",
    "journal": "a job journal could not be read or written",
    "gpu": "NVML (or the fake NVML), or the MIG minors table, failed",
    "config": "the node config, the policy or this node's spec cannot be used",
    "input": "the environment slurmd gave the hook is not usable",
    "gres": "gres.conf or the node's MIG include cannot be read",
    "slurm": "a Slurm command failed or printed something unreadable",
    "command": "another command the hook runs failed",
    "unrepaired": "reconcile could not repair something",
    "mig_drift": "reconcile found the MIG layout differs from the policy",
    "other": "another gpushare error",
    "internal": "a bug: an exception that is not a gpushare error",
}
_BY_CLASS = (  # class name (anywhere in the exception's MRO) -> reason, first match wins
    ("NodeUnsafe", "unsafe"),
    ("MpsError", "mps"),
    ("JournalError", "journal"),
    ("GpuError", "gpu"),
    ("FakeNvmlError", "gpu"),
    ("MigMinorsError", "gpu"),
    ("NodeConfigError", "config"),
    ("PolicyError", "config"),
    ("HookInputError", "input"),
    ("GresConfReadError", "gres"),
    ("GresConfError", "gres"),
    ("SlurmClientError", "slurm"),
    ("SlurmParseError", "slurm"),
    ("ReconcileError", "slurm"),
    ("CommandError", "command"),
    ("GpushareError", "other"),
)


# Why the prolog did not make a job's per-job MIG instance (node.perjob.SliceRefused.code); the job is refused.
SLICE_REFUSALS = {
    "placement": "no free placement for the profile beside the GPU's instances",
    "profile": "the job's extra field records no profile, or one the GPU does not make per job",
    "mig_off": "NVML offers no such profile on the GPU (MIG mode off)",
    "nvml": "NVML refused to make the instance, or its instances could not be read",
}
# upper bounds (seconds) of the histogram of the time the prolog takes to make a job's per-job MIG instance
CREATE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def failure_reason(exc: BaseException) -> str:
    """The bounded reason code for an exception a hook raised (by class name: no imports)."""
    names = {c.__name__ for c in type(exc).__mro__}
    return next((reason for name, reason in _BY_CLASS if name in names), "internal")


@dataclass(frozen=True)
class JobDevice:
    """One device a running job holds: ``mig_uuid``/``gi``/``ci`` None for whole, shard and MPS GPUs."""

    job_id: int
    gpu: int
    uuid: str
    mig_uuid: str | None = None
    gi: int | None = None
    ci: int | None = None


@dataclass
class NodeObservation:
    """What one run observed; None (or absent GPUs in ``mig``) keeps the last known value."""

    journals_present: int | None = None
    mps_daemons_running: int | None = None
    mig: dict[int, bool] = field(default_factory=dict)  # GPU index -> layout matches the policy
    jobs: list[JobDevice] | None = None  # every device of every job with a journal, when read
    replace_mig: bool = False  # ``mig`` is the whole node's answer (reconcile): forget other GPUs
    # per-job MIG GPUs (``per_job_slices``): GPU index -> profile -> instances running / how many more fit
    mig_slices: dict[int, dict[str, int]] | None = None
    mig_free: dict[int, dict[str, int]] | None = None
    slice_seconds: float | None = None  # this run made a job's per-job instance in this time
    slice_refused: str | None = None  # or refused the job for this reason (SLICE_REFUSALS)


def jobs_of(journals) -> list[JobDevice]:
    """The job-to-device rows of journals (``node.journal.Journal``-like: job_id, devices)."""
    return [JobDevice(j.job_id, d.gpu_index, d.gpu_uuid, d.mig_uuid, d.gi, d.ci) for j in journals for d in j.devices]


def per_job_slices(journals, spec_gpus) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]]] | None:
    """For each per-job MIG GPU of the node spec (``node.nodeconfig.GpuSpec``s) and each profile it makes: the
    instances the journals hold, and how many more of that profile alone fit beside them now (0 while a job
    holds the GPU whole). None when the node has no per-job GPU (the catalogue is loaded only when it has)."""
    gpus = {g.index: g for g in spec_gpus if g.share.is_per_job_mig}
    if not gpus:
        return None
    from ..hardware import CatalogueError, get_model, migplace

    held: dict[int, list[tuple[str, int]]] = {i: [] for i in gpus}
    whole: set[int] = set()
    for journal in journals:
        for d in journal.devices:
            if d.gpu_index not in gpus:
                continue
            if not d.per_job:
                whole.add(d.gpu_index)
            elif d.start is not None:
                held[d.gpu_index].append((d.profile, d.start))
    running, free = {}, {}
    for index, gpu in gpus.items():
        running[index] = {p: sum(1 for n, _ in held[index] if n == p) for p in gpu.share.profiles}
        try:
            model = get_model(gpu.model)
            free[index] = {p: 0 if index in whole else migplace.room(model, p, held[index]) for p in gpu.share.profiles}
        except (CatalogueError, ValueError):  # journals that cannot be together (reconcile reports them): no figure
            continue
    return running, free


def mig_matches(live_gpus, spec_gpus) -> dict[int, bool]:
    """Per MIG GPU of the policy that the hook observed: does the live layout match the policy's?

    ``live_gpus``: ``node.observed.ObservedGpu``s; a GPU counts as observed when MIG is off
    (then it cannot match) or its MIG devices were read. The live profile is the
    name after ``MIG `` in NVML's device name (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``),
    compared as a multiset with the spec's layout (catalogue names)."""
    wanted = {g.index: sorted(g.layout) for g in spec_gpus if g.share.is_mig}
    found = {}
    for gpu in live_gpus:
        if gpu.index not in wanted:
            continue
        if gpu.mig_current is False:
            found[gpu.index] = False
        elif gpu.mig_devices:
            have = sorted(d.name.rpartition(" MIG ")[2] for d in gpu.mig_devices)
            found[gpu.index] = have == wanted[gpu.index]
    return found


# ---- state --------------------------------------------------------------------------


def empty_state() -> dict:
    return {
        "format": STATE_FORMAT,
        "runs": {},
        "failures": {},
        "duration": {},
        "last_run": {},
        "journals": None,
        "mps": None,
        "mig": {},
        "jobs": [],
        "dcgm_errors": 0,
        "slices": {},
        "free": {},
        "refusals": {},
        "create": {"buckets": [0] * len(CREATE_BUCKETS), "sum": 0.0, "count": 0},
    }


def read_state(path: Path) -> dict:
    """The counters so far; a missing or unreadable file starts from zero (counters may reset: Prometheus copes)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return empty_state()
    empty = empty_state()
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT or not set(data) <= set(empty):
        return empty
    return {**empty, **data}  # a state written before a key was added: that key from zero


def update(
    state: dict,
    hook: str,
    result: str,
    reason: str | None,
    duration: float,
    now: float,
    snapshot: NodeObservation,
    dcgm_errors: int = 0,
) -> dict:
    """Pure: the state after one run of ``hook``."""
    if hook not in HOOKS or result not in RESULTS or (reason is not None and reason not in REASONS):
        raise ValueError(
            f"hook {hook!r} result {result!r} reason {reason!r}: expected hook in {HOOKS}, "
            f"result in {RESULTS}, reason in {tuple(REASONS)}"
        )
    new = json.loads(json.dumps(state))
    runs = new["runs"].setdefault(hook, {})
    runs[result] = runs.get(result, 0) + 1
    if result == "failed":
        failures = new["failures"].setdefault(hook, {})
        failures[reason or "other"] = failures.get(reason or "other", 0) + 1
    new["duration"][hook] = round(duration, 6)
    new["last_run"][hook] = round(now, 3)
    return observed(new, snapshot, dcgm_errors)


def observed(new: dict, snapshot: NodeObservation, dcgm_errors: int = 0) -> dict:
    """The state ``new`` with what a run observed, changed in place and returned; no run counted."""
    if snapshot.journals_present is not None:
        new["journals"] = snapshot.journals_present
    if snapshot.mps_daemons_running is not None:
        new["mps"] = snapshot.mps_daemons_running
    if snapshot.replace_mig:
        new["mig"] = {}
    new["mig"].update({str(k): bool(v) for k, v in snapshot.mig.items()})
    if snapshot.jobs is not None:
        new["jobs"] = [[r.job_id, r.gpu, r.uuid, r.mig_uuid, r.gi, r.ci] for r in snapshot.jobs]
    new["dcgm_errors"] += dcgm_errors
    return _per_job_observed(new, snapshot)


def _per_job_observed(new: dict, snapshot: NodeObservation) -> dict:
    if snapshot.mig_slices is not None:
        new["slices"] = {str(g): dict(per) for g, per in snapshot.mig_slices.items()}
    if snapshot.mig_free is not None:
        new["free"] = {str(g): dict(per) for g, per in snapshot.mig_free.items()}
    if snapshot.slice_refused is not None:
        if snapshot.slice_refused not in SLICE_REFUSALS:
            raise ValueError(f"slice refusal {snapshot.slice_refused!r}: expected one of {tuple(SLICE_REFUSALS)}")
        new["refusals"][snapshot.slice_refused] = new["refusals"].get(snapshot.slice_refused, 0) + 1
    if snapshot.slice_seconds is not None:
        create = new["create"]
        seconds = max(0.0, float(snapshot.slice_seconds))
        create["buckets"] = [n + (seconds <= le) for n, le in zip(create["buckets"], CREATE_BUCKETS, strict=True)]
        create["sum"] = round(create["sum"] + seconds, 6)
        create["count"] += 1
    return new


# ---- the text format ------------------------------------------------------------------------


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def render(state: dict) -> str:
    """Prometheus text exposition format 0.0.4 of the state (HELP and TYPE for every family)."""
    out: list[str] = []
    _hook_families(out, state)
    _node_families(out, state)
    _job_families(out, state)
    _per_job_families(out, state)
    return "\n".join(out) + "\n"


def _family(out: list[str], name: str, kind: str, text: str, samples) -> None:
    out.append(f"# HELP {name} {text}")
    out.append(f"# TYPE {name} {kind}")
    out.extend(f"{name}{labels} {_num(value)}" for labels, value in samples)


def _hook_families(out: list[str], state: dict) -> None:
    """The hooks' runs, failures, last duration and last run."""
    _family(
        out,
        "gpushare_node_hook_runs_total",
        "counter",
        "Runs of the gpushare node hooks by hook and result.",
        [(_labels(hook=h, result=r), state["runs"].get(h, {}).get(r, 0)) for h in HOOKS for r in RESULTS],
    )
    _family(
        out,
        "gpushare_node_hook_failures_total",
        "counter",
        "Failed runs of the gpushare node hooks by hook and reason.",
        [(_labels(hook=h, reason=r), state["failures"].get(h, {}).get(r, 0)) for h in HOOKS for r in REASONS],
    )
    _family(
        out,
        "gpushare_node_hook_last_duration_seconds",
        "gauge",
        "Wall time of the last run of each node hook.",
        [(_labels(hook=h), state["duration"][h]) for h in HOOKS if h in state["duration"]],
    )
    _family(
        out,
        "gpushare_node_hook_last_run_timestamp_seconds",
        "gauge",
        "Unix time the last run of each node hook ended.",
        [(_labels(hook=h), state["last_run"][h]) for h in HOOKS if h in state["last_run"]],
    )


def _node_families(out: list[str], state: dict) -> None:
    """What the node holds: MPS daemons, journals, MIG layouts against the policy."""
    if state["mps"] is not None:
        _family(
            out,
            "gpushare_node_mps_daemons_running",
            "gauge",
            "MPS control daemons of gpushare answering on this node.",
            [("", state["mps"])],
        )
    if state["journals"] is not None:
        _family(
            out,
            "gpushare_node_journals_present",
            "gauge",
            "Job journals in the node state dir (jobs set up, not yet undone).",
            [("", state["journals"])],
        )
    if state["mig"]:
        _family(
            out,
            "gpushare_node_mig_layout_matches_policy",
            "gauge",
            "1 if the GPU's MIG layout is the policy's, 0 if it drifted (last observed).",
            [(_labels(gpu=g), int(v)) for g, v in sorted(state["mig"].items(), key=lambda kv: int(kv[0]))],
        )


def _job_families(out: list[str], state: dict) -> None:
    """The devices jobs hold, and the failed writes of dcgm-exporter's job mapping."""
    _family(
        out,
        "gpushare_node_job_gpu_info",
        "gauge",
        "A device a job holds on this node (mig_uuid, gpu_instance_id, compute_instance_id empty outside MIG).",
        [
            (
                _labels(
                    job_id=j,
                    gpu=g,
                    uuid=u,
                    mig_uuid=m or "",
                    gpu_instance_id="" if gi is None else gi,
                    compute_instance_id="" if ci is None else ci,
                ),
                1,
            )
            for j, g, u, m, gi, ci in sorted(state["jobs"], key=lambda r: (r[0], r[1], r[4] or -1, r[5] or -1))
        ],
    )
    _family(
        out,
        "gpushare_node_dcgm_mapping_errors_total",
        "counter",
        "Writes of dcgm-exporter's job mapping files that failed (the job went on).",
        [("", state["dcgm_errors"])],
    )


def _per_job_families(out: list[str], state: dict) -> None:
    """Per-job MIG: instances running and free per GPU and profile, their making's time, refused jobs. Written once
    the node has per-job GPUs (or has counted one), every series from the first on."""
    create = state["create"]
    if not (state["slices"] or state["refusals"] or create["count"]):
        return
    gpus = sorted(state["slices"], key=int)
    _family(
        out,
        "gpushare_node_mig_per_job_slices",
        "gauge",
        "Per-job MIG instances jobs hold on the GPU, by profile (from the journals).",
        [(_labels(gpu=g, profile=p), n) for g in gpus for p, n in sorted(state["slices"][g].items())],
    )
    _family(
        out,
        "gpushare_node_mig_per_job_free",
        "gauge",
        "How many more per-job MIG instances of the profile alone fit on the GPU beside those in use.",
        [
            (_labels(gpu=g, profile=p), n)
            for g in sorted(state["free"], key=int)
            for p, n in sorted(state["free"][g].items())
        ],
    )
    name = "gpushare_node_mig_slice_create_seconds"
    out.append(f"# HELP {name} Seconds the prolog took to make a job's per-job MIG instance (GPU lock, GI, CI, UUID).")
    out.append(f"# TYPE {name} histogram")
    les = [*(_num(le) for le in CREATE_BUCKETS), "+Inf"]
    out.extend(
        f"{name}_bucket{_labels(le=le)} {n}" for le, n in zip(les, [*create["buckets"], create["count"]], strict=True)
    )
    out.append(f"{name}_sum {_num(float(create['sum']))}")
    out.append(f"{name}_count {create['count']}")
    _family(
        out,
        "gpushare_node_mig_slice_refusals_total",
        "counter",
        "Jobs the prolog refused because their per-job MIG instance could not be made, by reason.",
        [(_labels(reason=r), state["refusals"].get(r, 0)) for r in SLICE_REFUSALS],
    )


# ---- the one call the hooks make --------------------------------------------------------------


def _locked(state_dir: Path):
    return flocked(state_dir / LOCK_NAME)


def record(
    state_dir,
    textfile_dir,
    hook: str,
    result: str,
    reason: str | None,
    duration: float,
    snapshot: NodeObservation | None = None,
    dcgm_errors: int = 0,
    now: float | None = None,
) -> Path | None:
    """Count one run and rewrite ``<textfile_dir>/gpushare.prom``; returns its path (None when off).

    Read-modify-write under the flock, so concurrent hooks never lose an increment."""
    return _rewrite(
        state_dir,
        textfile_dir,
        lambda state: update(
            state,
            hook,
            result,
            reason,
            duration,
            time.time() if now is None else now,
            snapshot or NodeObservation(),
            dcgm_errors,
        ),
    )


def refresh(state_dir, textfile_dir, snapshot: NodeObservation) -> Path | None:
    """Rewrite ``<textfile_dir>/gpushare.prom`` with what a run that is no hook's saw (the health check: the
    jobs and journals left after its repairs), counting no run; returns its path (None when off)."""
    return _rewrite(state_dir, textfile_dir, lambda state: observed(state, snapshot))


def _rewrite(state_dir, textfile_dir, change) -> Path | None:
    if textfile_dir is None:
        return None
    state_dir, target = Path(state_dir), Path(textfile_dir) / FILE_NAME
    with _locked(state_dir):
        state = change(read_state(state_dir / STATE_NAME))
        atomic_write(state_dir / STATE_NAME, json.dumps(state, sort_keys=True), 0o600)
        fd = open_dir(textfile_dir)
        try:
            write_at(fd, FILE_NAME, render(state), 0o644)
        finally:
            os.close(fd)
    return target


# ---- the metrics directories, opened as root may write in them ----------------------------------------

OWNER: int | None = None  # who must own a metrics directory: None is the writer (root, on a node); tests set it
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class UnsafeDir(OSError):
    """A metrics directory root must not write in: a symbolic link or no directory on its path, or not the
    writer's own, or writable by its group or others. The message names the path and the reason."""


def dir_problem(st: os.stat_result, path: str, owner: int | None = None) -> str | None:
    """Why the directory ``st`` (an fstat of it) is not one root may write in (None: it is)."""
    want = os.geteuid() if owner is None else owner
    problem = trust_problem(st, path, want)
    if problem is None:
        return None
    if st.st_uid != want:
        who = "root" if want == 0 else f"uid {want}"
        return f"{problem}: chown {who} it (or let gpushare node install make it)"
    return f"{problem}: chmod 0755 it"


def open_dir(path, create: bool = True) -> int:
    """A descriptor of the directory ``path``, reached from / one component at a time, never through a
    symbolic link (O_NOFOLLOW) and never blocking on a FIFO (O_DIRECTORY, O_NONBLOCK); missing components
    are made (0755) when ``create``. UnsafeDir when a component is a link or not a directory, or when the
    directory is not ``OWNER``'s (the writer's) or others may write in it."""
    import errno

    path = os.path.abspath(os.fspath(path))
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            try:
                nxt = _open_part(fd, part, create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise UnsafeDir(
                        exc.errno,
                        f"{path}: its component {part!r} is a symbolic link or not a "
                        "directory (not followed): name the directory by its real path",
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        problem = dir_problem(os.fstat(fd), path, OWNER)
        if problem:
            raise UnsafeDir(errno.EPERM, problem)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_part(fd: int, part: str, create: bool) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(part, 0o755, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(part, _DIR_FLAGS, dir_fd=fd)


def write_at(dir_fd: int, name: str, text: str, mode: int = 0o644) -> None:
    """Write ``name`` in the open directory ``dir_fd`` atomically: a new temporary (O_EXCL, O_NOFOLLOW) beside
    it, then a rename within the directory; nothing is resolved by path from /."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    tmp = f".{name}.{os.urandom(6).hex()}"
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    os.fsync(dir_fd)
