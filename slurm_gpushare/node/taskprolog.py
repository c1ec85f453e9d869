"""TaskProlog (as the job's user, on every task start): print the job's GPU environment.

Slurm reads ``export NAME=VALUE`` lines from its stdout into the task's
environment (slurm.conf.5). Everything comes from the journal the prolog
wrote: no NVML, no policy, no YAML, and nothing from the package beyond
``paths``, so the cost stays close to the interpreter's start-up (the
benchmark in bench/node_hooks.py measures it).

CUDA_VISIBLE_DEVICES is replaced only for jobs that hold a MIG device (its
MIG UUID: CUDA does not read Slurm's index as a MIG device) or MPS (the GPU
UUID: Slurm sets no CUDA_VISIBLE_DEVICES for mps jobs when shard is also a
GresType, observed on 24.11 and 26.05). For an srun step, SLURM_STEP_GPUS
(global GRES indexes) selects the step's devices, in Slurm's order.
Exclusive and shard jobs keep Slurm's value and get only CUDA_DEVICE_ORDER.

A GPU task without a journal means the prolog did not run for it: the task
prolog fails rather than leave the task with an index CUDA would misread.
"""

from __future__ import annotations

import json
import os
import sys

from .paths import CONFIG_ENV, DEFAULT_STATE_DIR, JOURNAL_FORMAT, NODE_CONFIG, journal_path, parse_flat, spec_cache_path

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_=,./:-")
_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")


class TaskPrologError(Exception):
    pass


def state_dir(environ) -> str:
    """The state dir the prolog recorded in the spec cache (default if none)."""
    config = environ.get(CONFIG_ENV) or NODE_CONFIG
    try:
        with open(config, encoding="utf-8") as fh:
            values = parse_flat(fh.read(), config)
    except FileNotFoundError:
        values = {}
    except (OSError, ValueError) as exc:
        raise TaskPrologError(f"node config: {exc}") from None
    try:
        with open(spec_cache_path(config, values), encoding="utf-8") as fh:
            found = json.load(fh).get("state_dir")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_STATE_DIR
    return found if isinstance(found, str) and found.startswith("/") else DEFAULT_STATE_DIR


def _digits(environ, name: str) -> list[int] | None:
    value = environ.get(name)
    if not value:
        return None
    parts = value.split(",")
    if not all(p.isdigit() and len(p) < 6 for p in parts):
        raise TaskPrologError(f"{name}={value[:40]!r} is not a list of GRES indexes")
    return [int(p) for p in parts]


def exports(journal: dict, environ) -> list[tuple[str, str]]:
    """The (name, value) pairs to export for this task."""
    out = list(journal["env"].items())
    devices = journal["devices"]
    if any(d.get("visible") for d in devices):
        wanted = _digits(environ, "SLURM_STEP_GPUS") or _digits(environ, "SLURM_JOB_GPUS")
        by_index = {d["slurm_index"]: d for d in devices}
        if wanted is None:
            chosen = devices
        else:
            missing = [i for i in wanted if i not in by_index]
            if missing:
                raise TaskPrologError(f"GRES indexes {missing} are not in job {journal['job_id']}'s journal")
            chosen = [by_index[i] for i in wanted]
        out.append(("CUDA_VISIBLE_DEVICES", ",".join(d.get("visible") or d["gpu_uuid"] for d in chosen)))
    for name, value in out:
        if not set(name) <= _SAFE or not set(value) <= _SAFE or not value:
            raise TaskPrologError(f"journal of job {journal['job_id']}: refusing to export {name}={value[:40]!r}")
    return out


def run(environ, out) -> None:
    job = environ.get("SLURM_JOB_ID", "")
    if not job.isdigit() or len(job) > 10:
        raise TaskPrologError(f"SLURM_JOB_ID={job[:20]!r} is not a job id")
    path = journal_path(state_dir(environ), int(job))
    try:
        with open(path, encoding="utf-8") as fh:
            journal = json.load(fh)
    except FileNotFoundError:
        if any(environ.get(v) for v in _GPU_VARS):
            raise TaskPrologError(f"job {job} holds GPUs but has no journal {path}: the gpushare prolog did not run") from None
        return
    except (OSError, ValueError) as exc:
        raise TaskPrologError(f"cannot read {path}: {exc}") from None
    if journal.get("format") != JOURNAL_FORMAT or journal.get("job_id") != int(job) or journal.get("state") != "ready":
        raise TaskPrologError(f"{path} is not a complete journal of job {job} (state {journal.get('state')!r})")
    out.write("".join(f"export {name}={value}\n" for name, value in exports(journal, environ)))


def main(environ=None, out=None, err=None) -> int:
    try:
        run(os.environ if environ is None else environ, out or sys.stdout)
    except TaskPrologError as exc:
        (err or sys.stderr).write(f"gpushare-task-prolog: {exc}\n")
        return 1
    return 0
