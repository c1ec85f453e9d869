"""`gpushare-ns-caps`: job_container.conf CloneNSScript (root, in slurmstepd, after the Prolog).

Gives a per-job MIG job a private read-only /dev/nvidia-caps in its mount
namespace holding only its own instances' capabilities (node.nscaps). Slurm
passes it a fresh environment (SLURM_JOB_ID, SLURMD_NODENAME, SLURM_NS, ...,
nothing the job set); the job's devices come from its journal only. A
failure fails the job (Slurm requeues a batch job held, or cancels it), never
the node: unlike the Prolog, this hook sets no drain reason.
"""

from __future__ import annotations

HOOK = "gpushare-ns-caps"


def ns_caps(environ, runner=None) -> None:
    """Build the job's /dev/nvidia-caps where it holds an isolated per-job device; else leave its namespace."""
    from ..node.jobenv import job_id_from_env
    from ..node.journal import JournalStore
    from ..node.nscaps import needs_isolation, ns_file
    from ._common import load

    job_id = job_id_from_env(environ)
    config, spec = load(environ)
    if spec is None:
        return  # a node outside the policy: the job keeps its namespace as the plugin made it
    ns = ns_file(environ)
    # without the journal lock: another job's prolog holds it while it makes instances (tens of seconds), longer
    # than CloneNSScript_Wait; this job's prolog has ended and written its journal whole
    journal = JournalStore(spec.state_dir).peek(job_id)
    if journal is None or not needs_isolation(journal, {g.index: g.share for g in spec.gpus}):
        return
    _build(job_id, ns, journal, config, runner)


def _build(job_id: int, ns: str, journal, config, runner) -> None:
    from ..gpu.migminors import caps_major, mig_minors_path, read_mig_minors
    from ..node.nscaps import execute, plan_caps
    from ._common import run

    fake = config.fake_nvml_str
    nodes = plan_caps(job_id, journal, read_mig_minors(mig_minors_path(fake)))
    execute(job_id, ns, nodes, caps_major(fake=fake is not None), runner or run)


def main(environ=None, runner=None) -> int:
    """0, or 1 with one line on stderr (slurmd logs it with DebugFlags=JobContainer, Namespace from 25.11)."""
    import os
    import sys

    from ..errors import GpushareError

    environ = dict(os.environ if environ is None else environ)
    try:
        ns_caps(environ, runner)
    except GpushareError as exc:
        print(f"{HOOK}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug fails the job as any error does, with its name
        print(f"{HOOK}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
