"""sbatch options and #SBATCH lines -> the job_submit fields sbatch would send.

Only the options that carry GPU requests, the partition, the node features
(--constraint: GPU models), the task layout (--ntasks, --ntasks-per-node,
--nodes: MPS_TASKS reads them) or --extra (per-job MIG's record) are read; the
rest are skipped. Values are placed where sbatch puts them (--gres and
--gpus-per-node -> tres_per_node, --gpus -> tres_per_job, --gpus-per-socket
-> tres_per_socket, --gpus-per-task / --tres-per-task -> tres_per_task), in
the site's GRES string format, and are not validated here: the decision
validates them exactly as job_submit.lua would.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import GpushareError

# option -> (field, how the value becomes entries)
_LONG = {
    "--gres": ("tres_per_node", "gres"),
    "--gpus-per-node": ("tres_per_node", "gpu"),
    "--gpus": ("tres_per_job", "gpu"),
    "--gpus-per-socket": ("tres_per_socket", "gpu"),
    "--gpus-per-task": ("tres_per_task", "gpu_eq"),
    "--tres-per-task": ("tres_per_task", "tres"),
    "--partition": ("partition", "raw"),
    "--ntasks": ("num_tasks", "raw"),
    "--ntasks-per-node": ("ntasks_per_node", "raw"),
    "--nodes": ("min_nodes", "nodes"),
    "--constraint": ("features", "raw"),  # job_desc.features: the node features the job needs (GPU models)
    "--extra": ("extra", "raw"),  # job_desc.extra: per-job MIG's record on per-job tiers (tables.RECORD_FIELD)
}
_SHORT = {"-G": "--gpus", "-p": "--partition", "-n": "--ntasks", "-N": "--nodes", "-C": "--constraint"}
_PLAIN = (
    "--partition",
    "--ntasks",
    "--ntasks-per-node",
    "--nodes",
    "--constraint",
    "--extra",
)  # one value each, not GRES entries
# Order sbatch builds tres_per_node in: --gres first, then --gpus-per-node appended.
_ORDER = ("--gres", "--gpus-per-node", "--gpus", "--gpus-per-socket", "--gpus-per-task", "--tres-per-task")


class OptionError(GpushareError):
    exit_code = 2


def split_options(argv: list[str]) -> dict[str, str]:
    """{'--gres': 'gpu:1', '--partition': 'batch'}: the last value of each option we read, like sbatch."""
    seen: dict[str, str] = {}
    i = 0
    while i < len(argv):
        opt, value, used = _one(argv, i)
        if opt is not None:
            seen[opt] = value
        i += used
    return seen


def _one(argv: list[str], i: int) -> tuple[str | None, str, int]:
    arg = argv[i]
    name, eq, value = arg.partition("=")
    if arg.startswith("--") and name in _LONG:
        return name, (value if eq else _value(argv, i, name)), 1 if eq else 2
    short = arg[:2]
    if short in _SHORT and not arg.startswith("--"):
        opt = _SHORT[short]
        if len(arg) > 2:
            return opt, arg[3:] if arg[2] == "=" else arg[2:], 1
        return opt, _value(argv, i, short), 2
    return None, "", 1


def _value(argv: list[str], i: int, name: str) -> str:
    if i + 1 >= len(argv):
        raise OptionError(f"option {name} needs a value")
    return argv[i + 1]


def to_job(options: dict[str, str], prefix: str) -> dict[str, str]:
    """The job_submit fields for these options, GRES strings in ``prefix`` format ('gres/' or 'gres:')."""
    job: dict[str, list[str]] = {}
    for opt in _ORDER:
        if opt not in options:
            continue
        field, how = _LONG[opt]
        job.setdefault(field, []).append(_entries(options[opt], how, prefix))
    out = {field: ",".join(parts) for field, parts in job.items()}
    for opt in _PLAIN:
        if opt in options:
            field, how = _LONG[opt]
            # --nodes=2-4: job_submit sees min_nodes 2 (and max_nodes 4, which no rule reads)
            out[field] = options[opt].split("-", 1)[0] if how == "nodes" else options[opt]
    return out


def _entries(value: str, how: str, prefix: str) -> str:
    if how == "gpu":
        return f"{prefix}gpu:{value}"
    if how == "gpu_eq":
        # Seen on 24.11: sbatch hands --gpus-per-task=l40s:1 to job_submit as 'gres/gpu:l40s=1'.
        head, _, count = value.rpartition(":")
        return f"{prefix}gpu{':' + head if head else ''}={count}"
    if how == "gres" and value.lower() == "none":
        return value  # sbatch keeps 'none' bare (slurm_opt.c arg_set_gres)
    if how == "gres" and value != "":
        return ",".join(prefix + e if e else e for e in value.split(","))
    return value


def sbatch_lines(text: str) -> list[str]:
    """Options from #SBATCH lines, stopping at the first line that is neither blank nor a comment (as sbatch does)."""
    argv: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if line.startswith("#SBATCH") and line[7:8] in (" ", "\t"):
            try:
                argv += shlex.split(line[7:], comments=True)
            except ValueError as exc:
                raise OptionError(f"cannot read {line.strip()!r}: {exc}") from None
    return argv


def script_options(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise OptionError(f"cannot read {path}: {exc.strerror}") from None
    return sbatch_lines(text)
