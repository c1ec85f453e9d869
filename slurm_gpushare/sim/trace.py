"""Load the openb GPU trace (node list, pod list) into a SimCluster and Pods. Pure apart from reading the file.

Strict: a row that does not parse raises TraceError naming the file, the line
(1 is the header), the column and what would be accepted, so a truncated or
hand-edited copy fails loudly instead of shifting the benchmark. The paper's
copies of the trace, found by name, are ``sim.paper.workloads`` (bench/ and the
tests only: they live in the checkout, not in the wheel).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from pathlib import Path

from ..errors import GpushareError
from ..policy.share import Mode
from .cluster import GPU_MILLI, Pod, SimCluster, SimGpu, SimNode

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(GpushareError):
    """A trace file that cannot be used: names file, line, column and what is accepted."""

    exit_code = 1


def load_cluster(path: str | Path) -> SimCluster:
    """The trace's nodes in file order: whole CPUs (cpu_milli / 1000), every GPU exclusive, untyped."""
    return parse_cluster(_read(path), str(path))


def load_pods(path: str | Path) -> tuple[Pod, ...]:
    """The trace's pods in file order (the arrival harness sorts and shuffles them itself)."""
    return parse_pods(_read(path), str(path))


def load_pod_times(path: str | Path) -> dict[str, tuple[int, int | None, int | None]]:
    """Each pod's (creation_time, scheduled_time, deletion_time) in trace seconds, by pod name (None: empty).

    The columns are optional in the openb format (the multigpu50 variant has none): a file without
    ``creation_time`` gives {}. Used by the live-loop simulator for job durations.
    """
    return parse_pod_times(_read(path), str(path))


def parse_pod_times(text: str, source: str) -> dict[str, tuple[int, int | None, int | None]]:
    out: dict[str, tuple[int, int | None, int | None]] = {}
    header = next(csv.reader(io.StringIO(text, newline="")), [])
    if "creation_time" not in [h.strip() for h in header]:
        return out
    for line, row in _rows(text, source, ("name", "creation_time"), "pod list"):
        times = []
        for column in ("creation_time", "scheduled_time", "deletion_time"):
            raw = (row.get(column) or "").strip()
            times.append(_int(row, column, line, source, 0) if raw else None)
        if times[0] is None:
            raise TraceError(f"{source}: line {line}, column creation_time: empty; accepted: an integer >= 0")
        out[row["name"].strip()] = (times[0], times[1], times[2])
    return out


def parse_cluster(text: str, source: str) -> SimCluster:
    """An openb node list's text; ``source`` names it in errors."""
    nodes = tuple(_node(row, line, source) for line, row in _rows(text, source, NODE_COLUMNS, "node list"))
    if not nodes:
        raise TraceError(f"{source}: no nodes (expected a header {','.join(NODE_COLUMNS)} and one row per node)")
    return SimCluster(nodes=nodes)


def parse_pods(text: str, source: str) -> tuple[Pod, ...]:
    """An openb pod list's text (the one reader of pod lists: the benchmark's trace and ``gpushare plan
    --demand openb:``); required columns POD_COLUMNS, ``gpu_spec`` and ``qos`` read when present, others ignored."""
    pods = tuple(_pod(row, line, source) for line, row in _rows(text, source, POD_COLUMNS, "pod list"))
    if not pods:
        raise TraceError(f"{source}: no pods (expected a header {','.join(POD_COLUMNS)} and one row per pod)")
    return pods


def _read(path: str | Path) -> str:
    """A file's text; a name ending in .gz is read through gzip."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        return f.read()


def _rows(text: str, source: str, required: tuple[str, ...], what: str) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None:
        raise TraceError(f"{source}: empty file; an openb {what} starts with a header row ({', '.join(required)}, ...)")
    names = [n.strip() for n in reader.fieldnames]
    reader.fieldnames = names
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(
            f"{source}: line 1: missing column(s) {', '.join(missing)}; the header must name {', '.join(required)}"
        )
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise TraceError(f"{source}: line {reader.line_num}: {len(names)} fields expected ({', '.join(names)})")
        yield reader.line_num, row


def _int(row: dict[str, str], column: str, line: int, path: str | Path, low: int, high: int | None = None) -> int:
    raw = row[column].strip()
    accepted = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}: line {line}, column {column}: {raw!r} is not {accepted}") from None
    if value < low or (high is not None and value > high):
        raise TraceError(f"{path}: line {line}, column {column}: {value} is out of range; accepted: {accepted}")
    return value


def _node(row: dict[str, str], line: int, path: str | Path) -> SimNode:
    name = row["sn"].strip()
    if not name:
        raise TraceError(f"{path}: line {line}, column sn: empty; accepted: a node name")
    cpu_milli = _int(row, "cpu_milli", line, path, 1000)
    if cpu_milli % 1000:
        raise TraceError(
            f"{path}: line {line}, column cpu_milli: {cpu_milli} is not a whole number of CPUs; "
            "accepted: a multiple of 1000"
        )
    gpus = _int(row, "gpu", line, path, 0, 64)
    model = row["model"].strip()
    if gpus and not model:
        raise TraceError(f"{path}: line {line}, column model: empty on a node with {gpus} GPUs; accepted: a GPU model")
    return SimNode(
        name=name,
        cpus=cpu_milli // 1000,
        memory_mib=_int(row, "memory_mib", line, path, 0),
        gpus=tuple(SimGpu(mode=Mode.EXCLUSIVE, model=model) for _ in range(gpus)),
        cpu_milli=cpu_milli,
    )


def _pod(row: dict[str, str], line: int, path: str | Path) -> Pod:
    name = row["name"].strip()
    if not name:
        raise TraceError(f"{path}: line {line}, column name: empty; accepted: a pod name")
    num_gpu = _int(row, "num_gpu", line, path, 0, 64)
    gpu_milli = _int(row, "gpu_milli", line, path, 0, GPU_MILLI)
    if num_gpu and not gpu_milli:
        raise TraceError(f"{path}: line {line}, column gpu_milli: 0 with num_gpu {num_gpu}; accepted: 1 to 1000")
    if num_gpu > 1 and gpu_milli != GPU_MILLI:
        raise TraceError(
            f"{path}: line {line}, column gpu_milli: {gpu_milli} with num_gpu {num_gpu}; "
            "accepted: 1000 (a multi-GPU pod takes whole GPUs)"
        )
    if not num_gpu:
        gpu_milli = 0  # a pod without GPUs asks no share, whatever the column says (it is read, so it must parse)
    return Pod(
        name=name,
        cpu_milli=_int(row, "cpu_milli", line, path, 0),
        memory_mib=_int(row, "memory_mib", line, path, 0),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        qos=(row.get("qos") or "").strip(),
        gpu_spec=(row.get("gpu_spec") or "").strip(),
    )
