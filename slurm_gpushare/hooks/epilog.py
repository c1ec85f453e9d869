"""`gpushare-epilog`: slurm.conf Epilog (root, when the job ends on the node)."""

from __future__ import annotations

import sys

from . import Seen


def epilog(environ, runner=None, mps=None, kill=None, seen: Seen | None = None) -> None:
    """Undo what the job's journal records (node.epilog); no journal, nothing to do; a journal a later run of the
    same job wrote (``Journal.later_than``) is that run's, and left to it.

    ``seen`` receives what the run learnt (spec, job id, live state) for the metrics."""
    from ..node.jobenv import job_id_from_env, start_time
    from ..node.journal import JournalStore
    from ._common import load

    seen = Seen() if seen is None else seen
    config, spec = load(environ)
    if spec is None:
        return  # a node outside the policy: no journal, no GPU of ours
    seen.spec = spec
    job_id = seen.job_id = job_id_from_env(environ)
    store = JournalStore(spec.state_dir)
    with store.locked():
        journal = store.read(job_id)
        if journal is None:
            return  # nothing was set up, or a previous run undid it: a no-op
        started = start_time(environ)
        if journal.later_than(started):
            # Slurm started this job again here (slurmctld, restarted, had lost this run's end) and the new run's
            # prolog came first: the journal, its daemon, its instances and its dcgm mapping are the new run's now
            seen.job_id = None
            print(
                f"gpushare-epilog: job {job_id}: a later run of this job (started {journal.start_time}, this one "
                f"{started}) holds its journal: left to that run's epilog",
                file=sys.stderr,
            )
            return
        if not journal.devices and journal.mps is None:
            store.remove(job_id)  # a job without GPUs here: nothing to check
            return
        from ..node.mps import mps_lock

        with mps_lock(spec.state_dir, journal.mps is not None):  # the refcount (journals) and the quit, together
            mps = _undo(journal, store, config, runner, mps, kill, seen)
    if journal.mps is not None:
        _sweep(spec.state_dir, mps)  # no lock held: what the job left in its pipe dir is no other hook's wait


def _sweep(state_dir: str, mps) -> None:
    """Remove the key dirs set aside under ``<state_dir>/mps`` (node.aside), within the epilog's budget; what is
    left, or cannot be removed, is a note on stderr (the health check goes on with it): never a failure."""
    from ..node.aside import EPILOG_BUDGET, Budget, sweep

    for note in [*getattr(mps, "notes", []), *sweep(state_dir.rstrip("/") + "/mps", Budget(*EPILOG_BUDGET))]:
        print(f"gpushare-epilog: note: {note}", file=sys.stderr)


def _undo(journal, store, config, runner, mps, kill, seen):
    """Observe, plan and undo the job's devices and daemon; returns the MPS control it used (its ``notes``)."""
    from ..gpu import open_backend
    from ..node.epilog import Killer, execute_epilog, observe_epilog, plan_epilog
    from ..node.mps import MpsControl
    from ._common import mps_command, run

    mps = mps or MpsControl(runner or run, **mps_command(config))
    with open_backend(config.fake_nvml_str) as backend:
        seen.live = live = observe_epilog(journal, backend, store)
        actions, problems = plan_epilog(journal, live)
        execute_epilog(journal, actions, problems, store, mps, Killer(backend, kill=kill))
    return mps


def main(environ=None, runner=None, mps=None, kill=None) -> int:
    from ._common import guarded

    return guarded(
        "gpushare-epilog", lambda env, seen: epilog(env, runner, mps, kill, seen), environ, runner, metrics="epilog"
    )
