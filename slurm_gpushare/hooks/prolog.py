"""`gpushare-prolog`: slurm.conf Prolog (root, at allocation: PrologFlags=Alloc)."""

from __future__ import annotations

import os
import sys


def prolog(environ, runner=None, mps=None, seen: dict | None = None) -> None:
    """Check the job's devices, start its MPS daemon, write its journal (node.prolog).

    ``seen`` receives what the run learnt (spec, live state, journal) for the metrics."""
    from ..gpu import open_backend
    from ..node.jobenv import job_from_env
    from ..node.journal import JournalStore
    from ..node.mps import MpsControl, mps_lock
    from ..node.prolog import execute_prolog, load_layout, observe_prolog, plan_prolog
    from ._common import load, mps_command, run

    seen = {} if seen is None else seen
    config, spec = load(environ)
    seen["spec"] = spec
    job = job_from_env(environ)
    store, mps = JournalStore(spec.state_dir), mps or MpsControl(runner or run, **mps_command(config))
    # an MPS job (or a rerun whose journal may name a daemon) decides and acts on daemons under the MPS lock
    uses_mps = job.mps_percentage is not None or os.path.exists(store.file(job.job_id))
    with open_backend(config.fake_nvml_str) as backend, store.locked(), mps_lock(spec.state_dir, uses_mps):
        node = load_layout(spec, backend)
        seen["live"] = live = observe_prolog(job, node, backend, store, mps)
        journal, actions = plan_prolog(job, node, live)
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
        except BaseException:
            _remove_made(limits)
            raise
        seen["journal"] = journal


def _remove_made(limits) -> None:
    if limits is not None and limits.made is not None:
        from ..node.mpsmem import remove_made

        note = remove_made(limits)
        if note:
            print(f"gpushare-prolog: {note}", file=sys.stderr)


def main(environ=None, runner=None, mps=None) -> int:
    from ._common import guarded

    return guarded("gpushare-prolog", lambda env, seen: prolog(env, runner, mps, seen), environ, runner, metrics="prolog")
