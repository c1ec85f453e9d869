"""`gpushare-prolog`: slurm.conf Prolog (root, at allocation: PrologFlags=Alloc)."""

from __future__ import annotations

import os
import sys
import time

from . import Seen


def prolog(environ, runner=None, mps=None, seen: Seen | None = None) -> None:
    """Check the job's devices, start its MPS daemon, write its journal (node.prolog).

    ``seen`` receives what the run learnt (spec, live state, journal) for the metrics."""
    from ..gpu import open_backend
    from ..node.jobenv import job_from_env
    from ..node.journal import JournalStore
    from ..node.mps import MpsControl, mps_lock
    from ._common import load, mps_command, run

    seen = Seen() if seen is None else seen
    config, spec = load(environ)
    if spec is None:
        return  # a node outside the policy: the site's own Prolog= lines are Slurm's to run, nothing is ours
    seen.spec = spec
    job = job_from_env(environ)
    store, mps = JournalStore(spec.state_dir), mps or MpsControl(runner or run, **mps_command(config))
    # an MPS job (or a rerun whose journal may name a daemon) decides and acts on daemons under the MPS lock
    uses_mps = job.mps_percentage is not None or os.path.exists(store.file(job.job_id))
    with open_backend(config.fake_nvml_str) as backend:
        if job.mig_profile is None and any(g.share.is_per_job_mig for g in spec.gpus):
            _await_whole(job, spec, backend)  # before the journal lock: the epilog it may wait for needs it
        with store.locked(), mps_lock(spec.state_dir, uses_mps):
            _locked(job, spec, backend, store, mps, seen)
    for note in getattr(mps, "notes", []):  # never a failure: slurmd's log keeps them
        print(f"gpushare-prolog: note: {note}", file=sys.stderr)


def _locked(job, spec, backend, store, mps, seen: Seen) -> None:
    """The prolog's observe, plan and execute, under the journal lock (and the MPS lock where the job uses MPS)."""
    from ..node.prolog import execute_prolog, load_layout, observe_prolog, plan_prolog

    node = load_layout(spec, backend)
    seen.live = live = observe_prolog(job, node, backend, store, mps)
    journal, actions = plan_prolog(job, node, live)
    if any(d.per_job for d in journal.devices):  # a per-job MIG slice: made now, or the job refused
        journal, actions = _slices(journal, actions, node, live.journals, backend, store, job.restarts, seen)
    limits = None
    if job.mps_percentage is not None:  # the share on the job's cgroup, where the node offers it (node.mpsmem)
        from ..node.mpsmem import apply_memory_limits, refusal_env
        from ..node.prolog import with_env

        limits = apply_memory_limits(job, journal, live, backend)
        for line in (limits.note, limits.refusal):
            if line:
                print(f"gpushare-prolog: {line}", file=sys.stderr)
        journal, actions = with_env(journal, actions, refusal_env(limits))  # a refused job: its tasks fail
    try:
        execute_prolog(actions, store, mps)
    except Exception as exc:
        _remove_made(limits)
        journal = _refuse_without_room(exc, job, journal, store, spec.state_dir)
    except BaseException:
        _remove_made(limits)
        raise
    seen.journal = journal


def _await_whole(job, spec, backend) -> None:
    """A job without a per-job record holds its per-job GPUs whole: wait (bounded, node.perjob.await_empty) for
    instances of ended jobs to leave them. The locked run then makes the full instance, or refuses the job."""
    from ..node.journal import JournalError, JournalStore
    from ..node.perjob import await_empty
    from ..node.prolog import gpus_of_records, load_layout

    node = load_layout(spec, backend)
    by_minor = {g.minor: g.index for g in backend.gpus()}
    indexes = gpus_of_records(node.records, job.gpu_indexes, by_minor)
    try:  # a rerun's own instances are reused, not waited for (read without the lock: the locked run reads again)
        own = JournalStore(spec.state_dir).peek(job.job_id)
    except JournalError:
        own = None
    per_job = [i for i in indexes if i in node.shares and node.shares[i].is_per_job_mig]
    await_empty(backend, spec.state_dir, per_job, own)


def _slices(journal, actions, node, journals, backend, store, restarts: int, seen: Seen):
    """Make the job's per-job MIG instance (node.perjob); one that cannot be made refuses the job, not the node:
    its tasks fail with the reason (node.prolog.refused_journal), and where the policy requeues (and Slurm's
    restart count allows) a request is left for the health check, which requeues the job (the prolog must not
    call Slurm). ``seen`` gets how long making it took (the GPU's lock, observing it, the GI and CI, the UUID),
    or the refusal's code, for the node metrics. An instance the job's journal from an earlier run records
    (``journals``: the node's) is reused while NVML still has it."""
    from ..node.perjob import REQUEUE_CODE, prolog_slices, refusal_code, request_requeue, rewrite
    from ..node.prolog import refused_journal

    start = time.monotonic()
    code, note = refusal_code(journal, node, restarts)
    journal, refused = prolog_slices(journal, node, backend, store, journals)
    if refused is None:
        seen.slice_seconds = time.monotonic() - start
    else:
        seen.slice_refused = refused.code
        why = f"{refused.why}; {note}" if note else refused.why
        if code == REQUEUE_CODE:
            request_requeue(node.state_dir, journal.job_id, restarts, why)
        journal = refused_journal(journal, code, why)
        print(
            f"gpushare-prolog: job {journal.job_id}: MIG slice not made ({refused.why}); the job is refused, the node "
            "stays in service",
            file=sys.stderr,
        )
    return journal, rewrite(actions, journal)


def _refuse_without_room(exc: Exception, job, journal, store, state_dir: str):
    """A daemon that could not start for want of room in ``<state_dir>/mps`` (another job filled it) refuses this
    job, not the node: its tasks fail with the reason (node.prolog.refused_journal). Any other failure is raised."""
    from ..node.prolog import NO_ROOM_CODE, no_room, refused_journal

    why = no_room(exc, os.path.join(state_dir, "mps")) if job.mps_percentage is not None else None
    if why is None or os.path.exists(store.file(job.job_id)):  # kept: a daemon it started may still run
        raise exc
    journal = refused_journal(journal, NO_ROOM_CODE, why)
    store.write(journal)
    print(
        f"gpushare-prolog: job {job.job_id}: MPS daemon not started, no room ({why}); the job is refused, "
        "the node stays in service",
        file=sys.stderr,
    )
    return journal


def _remove_made(limits) -> None:
    if limits is not None and limits.made is not None:
        from ..node.mpsmem import remove_made

        note = remove_made(limits)
        if note:
            print(f"gpushare-prolog: {note}", file=sys.stderr)


def main(environ=None, runner=None, mps=None) -> int:
    from ._common import guarded

    return guarded(
        "gpushare-prolog", lambda env, seen: prolog(env, runner, mps, seen), environ, runner, metrics="prolog"
    )
