"""After a prolog or epilog run: count it in the textfile collector file and keep
dcgm-exporter's job mapping in step, when the policy turns them on.

Imported only then. A metrics directory that cannot be written never fails the
job: the node's side of it (a missing, unsafe or full directory: an OSError; a
gpushare error) is one line on stderr (slurmd's log) and the hook's exit status
stays what the run made it. Anything else is a bug (a field ``Seen`` lacks, a
hook name the textfile does not count) and is raised from here, so the tests that
call ``after_run`` fail on it; the hook (``_common.guarded``) still catches it and
says so on stderr as a bug rather than drain the node for its metrics.
"""

from __future__ import annotations

import sys

from ..errors import GpushareError
from . import Seen

# what the node can do to a metrics write: its directory missing, unsafe (textfile.UnsafeDir), full, unreadable
WRITE_ERRORS = (OSError, GpushareError)


def after_run(label: str, hook: str, seen: Seen, error: BaseException | None, duration: float) -> None:
    spec = seen.spec
    if spec is None:  # no spec, no metrics directories: the caller runs this only once the run loaded one
        return
    dcgm_errors = 0
    if spec.dcgm_job_mapping_dir is not None:
        try:
            _dcgm(hook, seen, error, spec.dcgm_job_mapping_dir)
        except WRITE_ERRORS as exc:  # metrics never fail a job
            dcgm_errors = 1
            print(
                f"{label}: dcgm-exporter job mapping in {spec.dcgm_job_mapping_dir} not updated: "
                f"{type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
    if spec.textfile_dir is not None:
        try:
            _textfile(hook, seen, error, duration, spec, dcgm_errors)
        except WRITE_ERRORS as exc:
            print(
                f"{label}: metrics file in {spec.textfile_dir} not written: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )


def _dcgm(hook: str, seen: Seen, error, directory: str) -> None:
    from ..metrics import dcgmjobs

    if hook == "prolog" and error is None and seen.journal is not None:
        dcgmjobs.add_job(directory, seen.journal)
    elif hook == "epilog" and seen.job_id is not None:
        dcgmjobs.remove_job(directory, seen.job_id)  # the job is over, whatever the epilog found


def _textfile(hook: str, seen: Seen, error, duration: float, spec, dcgm_errors: int) -> None:
    from ..metrics import textfile
    from ..node.journal import JournalError, JournalStore
    from ..node.mps import running_daemons

    store = JournalStore(spec.state_dir)
    snapshot = textfile.NodeObservation(
        journals_present=len(store.job_ids()),
        mps_daemons_running=running_daemons(spec.state_dir),
        slice_seconds=seen.slice_seconds,
        slice_refused=seen.slice_refused,
    )
    try:
        journals = store.all().values()
        snapshot.jobs = textfile.jobs_of(journals)
        snapshot.mig_slices, snapshot.mig_free = textfile.per_job_slices(journals, spec.gpus) or (None, None)
    except JournalError:
        pass  # an unreadable journal: keep the last mapping and figures (reconcile reports it)
    live = seen.live
    if live is not None:
        snapshot.mig = textfile.mig_matches(live.gpus.values(), spec.gpus)
    textfile.record(
        spec.state_dir,
        spec.textfile_dir,
        hook,
        "ok" if error is None else "failed",
        None if error is None else textfile.failure_reason(error),
        duration,
        snapshot,
        dcgm_errors,
    )
