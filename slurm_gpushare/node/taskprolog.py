"""TaskProlog (as the job's user, on every task start): print the job's GPU environment.

Slurm reads ``export NAME=VALUE`` lines from its stdout into the task's
environment (slurm.conf.5). Everything comes from the job's task file, which
the prolog derives from the journal (format in ``paths``): no NVML, no
policy, no YAML, no JSON, nothing from the package beyond ``paths``, so the
cost stays close to the interpreter's start-up (bench/node_hooks.py).

CUDA_VISIBLE_DEVICES is replaced only for jobs that hold a MIG device (its
MIG UUID: CUDA does not read Slurm's index as a MIG device) or MPS (the GPU
UUID: Slurm sets no CUDA_VISIBLE_DEVICES for mps jobs when shard is also a
GresType, observed on 24.11 and 26.05). For an srun step, SLURM_STEP_GPUS
(global GRES indexes) selects the step's devices, in Slurm's order.
Exclusive and shard jobs keep Slurm's value and get only CUDA_DEVICE_ORDER.

A GPU task without a task file means the prolog did not run for it, or has
not finished: the task prolog fails rather than leave the task with an
index CUDA would misread. On a node outside the policy (node.yaml
``outside_policy: yes``) there is none to read: nothing is printed, and the
task keeps the environment Slurm gave it.

A task file with an ``env GPUSHARE_REFUSE <reason>`` line is a job the prolog
refused without draining the node (``mpsmem``: the node sets an MPS job's
share of GPU memory on its cgroup and could not; ``perjob``: the job's
per-job MIG instance could not be made): every task of it fails,
nothing is exported, and the reason reaches the job's output through a
``print`` line (Slurm writes what follows ``print`` to the task's stdout;
the task prolog's stderr goes nowhere the user sees). Slurm cancels a task
whose task prolog fails (Prolog and Epilog Guide, "Failure Handling").
"""

from __future__ import annotations

import os
import sys

from .paths import CONFIG_ENV, DEFAULT_STATE_DIR, NODE_CONFIG, OUTSIDE, TASK_FORMAT, parse_flat, task_path

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_=,./:-")
_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
REFUSE_ENV = "GPUSHARE_REFUSE"  # a task file 'env' line that refuses the job instead of being exported


class TaskPrologError(Exception):
    pass


class JobRefused(TaskPrologError):
    """The prolog refused the job (the task file says why): its tasks fail with a line in the job's output."""


def state_dir(environ) -> str | None:
    """The node config's state_dir (the root hooks check it against the policy), or the default; None on a node
    outside the policy (``outside_policy: yes``), where no job has a task file of ours."""
    config = environ.get(CONFIG_ENV) or NODE_CONFIG
    try:
        with open(config, encoding="utf-8") as fh:
            values = parse_flat(fh.read(), config)
    except FileNotFoundError:
        return DEFAULT_STATE_DIR
    except (OSError, ValueError) as exc:
        raise TaskPrologError(f"node config: {exc}") from None
    if OUTSIDE in values:
        return None
    return values.get("state_dir", DEFAULT_STATE_DIR)


def parse_task(text: str, job: int, source: str) -> tuple[list[tuple[str, str]], list[tuple[int, str, str | None]]]:
    """(env pairs, devices as (slurm index, GPU UUID, visible or None))."""
    lines = text.splitlines()
    if not lines or lines[0] != f"{TASK_FORMAT} {job}":
        raise TaskPrologError(f"{source} is not the task file of job {job}")
    env, devices = [], []
    for line in lines[1:]:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "env":
            env.append((parts[1], parts[2]))
        elif len(parts) == 4 and parts[0] == "dev" and parts[1].isdigit():
            devices.append((int(parts[1]), parts[2], None if parts[3] == "-" else parts[3]))
        else:
            raise TaskPrologError(f"{source}: unreadable line {line[:60]!r}")
    return env, devices


def _digits(environ, name: str) -> list[int] | None:
    value = environ.get(name)
    if not value:
        return None
    parts = value.split(",")
    if not all(p.isdigit() and len(p) < 6 for p in parts):
        raise TaskPrologError(f"{name}={value[:40]!r} is not a list of GRES indexes")
    return [int(p) for p in parts]


def exports(env: list[tuple[str, str]], devices, environ, job: int) -> list[tuple[str, str]]:
    """The (name, value) pairs to export for this task."""
    out = list(env)
    if any(visible for _i, _uuid, visible in devices):
        wanted = _digits(environ, "SLURM_STEP_GPUS") or _digits(environ, "SLURM_JOB_GPUS")
        by_index = {d[0]: d for d in devices}
        if wanted is None:
            chosen = devices
        else:
            missing = [i for i in wanted if i not in by_index]
            if missing:
                raise TaskPrologError(f"GRES indexes {missing} are not in job {job}'s journal")
            chosen = [by_index[i] for i in wanted]
        out.append(("CUDA_VISIBLE_DEVICES", ",".join(visible or uuid for _i, uuid, visible in chosen)))
    for name, value in out:
        if not set(name) <= _SAFE or not set(value) <= _SAFE or not value:
            raise TaskPrologError(f"journal of job {job}: refusing to export {name}={value[:40]!r}")
    return out


def run(environ, out) -> None:
    job = environ.get("SLURM_JOB_ID", "")
    if not job.isdigit() or len(job) > 10 or job.startswith("0"):
        raise TaskPrologError(f"SLURM_JOB_ID={job[:20]!r} is not a job id")
    directory = state_dir(environ)
    if directory is None:
        return  # a node outside the policy: the task keeps the environment Slurm gave it
    path = task_path(directory, int(job))
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        if any(environ.get(v) for v in _GPU_VARS):
            raise TaskPrologError(
                f"job {job} holds GPUs but has no ready journal ({path}): the gpushare prolog "
                "did not run or did not finish"
            ) from None
        return
    except OSError as exc:
        raise TaskPrologError(f"cannot read {path}: {exc.strerror}") from None
    env, devices = parse_task(text, int(job), path)
    refused = [value for name, value in env if name == REFUSE_ENV]
    if refused:
        raise JobRefused(refusal_message(int(job), refused[0]))
    out.write("".join(f"export {name}={value}\n" for name, value in exports(env, devices, environ, int(job))))


def refusal_text(code: str, why: str) -> str:
    """A ``REFUSE_ENV`` value: ``<code>:<why>`` in the characters a task file line allows."""
    return "".join(c if c in _SAFE else "_" for c in f"{code}:{why}")[:300]


def refusal_message(job: int, value: str) -> str:
    """What a refused job's output says, by the refusal's code (the part of ``value`` before the first ':')."""
    if value.startswith(("mig-slice-requeue:", "mig-slice:")):
        code, _, why = value.partition(":")
        why = " ".join(why.replace("_", " ").split())[:200]  # the reason's spaces and brackets came as '_'
        then = (
            "The job is requeued: Slurm starts it again, here or on another node."
            if code == "mig-slice-requeue"
            else "Submit it again; tell the cluster's admins if it recurs."
        )
        return (
            f"job {job} is not run on this node: the MIG instance made for each job could not be made for it "
            f"({code}: {why}); the node stays in service. {then}"
        )
    if value.startswith("mps-dir-full:"):
        return (
            f"job {job} is not run on this node: there was no room to start its MPS daemon ({value[:200]}); "
            "another job filled the node's MPS directory. Submit it again; tell the cluster's admins if it recurs."
        )
    return (
        f"job {job} is not run on this node: it holds an MPS share, this node sets that share of GPU "
        f"memory as a limit on the job's cgroup, and the prolog could not ({value[:200]}); "
        "an MPS job is not run with per-process limits only. Tell the cluster's admins."
    )


def main(environ=None, out=None, err=None) -> int:
    try:
        run(os.environ if environ is None else environ, out or sys.stdout)
    except TaskPrologError as exc:
        if isinstance(exc, JobRefused):
            (out or sys.stdout).write(f"print gpushare-task-prolog: {exc}\n")
        (err or sys.stderr).write(f"gpushare-task-prolog: {exc}\n")
        return 1
    return 0
