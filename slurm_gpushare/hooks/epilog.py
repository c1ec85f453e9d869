"""`gpushare-epilog`: slurm.conf Epilog (root, when the job ends on the node)."""

from __future__ import annotations


def epilog(environ, runner=None, mps=None, kill=None) -> None:
    """Undo what the job's journal records (node.epilog); no journal, nothing to do."""
    from ..node.jobenv import job_id_from_env
    from ..node.journal import JournalStore
    from ._common import load

    config, spec = load(environ)
    job_id = job_id_from_env(environ)
    store = JournalStore(spec.state_dir)
    with store.locked():
        journal = store.read(job_id)
        if journal is None:
            return  # nothing was set up, or a previous run undid it: a no-op
        if not journal.devices and journal.mps is None:
            store.remove(job_id)  # a job without GPUs here: nothing to check
            return
        _undo(journal, store, config, runner, mps, kill)


def _undo(journal, store, config, runner, mps, kill) -> None:
    from ..gpu import open_backend
    from ..node.epilog import Killer, execute_epilog, observe_epilog, plan_epilog
    from ..node.mps import MpsControl
    from ..proc import run
    from ._common import mps_command

    mps = mps or MpsControl(runner or run, **mps_command(config))
    with open_backend(config.fake_nvml) as backend:
        actions, problems = plan_epilog(journal, observe_epilog(journal, backend, store))
        execute_epilog(journal, actions, problems, store, mps, Killer(backend, kill=kill))


def main(environ=None, runner=None, mps=None, kill=None) -> int:
    from ._common import guarded

    return guarded("gpushare-epilog", lambda env: epilog(env, runner, mps, kill), environ, runner)
