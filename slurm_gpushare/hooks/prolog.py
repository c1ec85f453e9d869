"""`gpushare-prolog`: slurm.conf Prolog (root, at allocation: PrologFlags=Alloc)."""

from __future__ import annotations


def prolog(environ, runner=None, mps=None) -> None:
    """Check the job's devices, start its MPS daemon, write its journal (node.prolog)."""
    from ..gpu import open_backend
    from ..node.jobenv import job_from_env
    from ..node.journal import JournalStore
    from ..node.mps import MpsControl
    from ..node.prolog import execute_prolog, load_layout, observe_prolog, plan_prolog
    from ..proc import run
    from ._common import load, mps_command

    config, spec = load(environ)
    job = job_from_env(environ)
    store, mps = JournalStore(spec.state_dir), mps or MpsControl(runner or run, **mps_command(config))
    with open_backend(config.fake_nvml) as backend, store.locked():
        node = load_layout(spec, backend)
        _journal, actions = plan_prolog(job, node, observe_prolog(job, node, backend, store, mps))
        execute_prolog(actions, store, mps)


def main(environ=None, runner=None, mps=None) -> int:
    from ._common import guarded

    return guarded("gpushare-prolog", lambda env: prolog(env, runner, mps), environ, runner)
