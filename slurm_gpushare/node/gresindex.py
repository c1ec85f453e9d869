"""Which device files a Slurm GRES index stands for on this node.

The prolog gets the job's GPUs as *global GRES indices* in SLURM_JOB_GPUS
(and the same numbers in CUDA_VISIBLE_DEVICES; MIG UUIDs only with NVML
autodetection, which Debian's Slurm lacks). Observed on the test cluster,
Slurm 24.11 (Debian trixie), ConstrainDevices=yes, DebugFlags=CGroup,Gres:

- prolog environment: MIG job ``SLURM_JOB_GPUS=2 CUDA_VISIBLE_DEVICES=2``
  while the job itself sees ``CUDA_VISIBLE_DEVICES=0``; mps job
  ``SLURM_JOB_GPUS=0 CUDA_VISIBLE_DEVICES=0 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25``
  (the job gets only the percentage); two-instance MIG job ``0,1``.
- numbering: the index is the position of the gpu record in gres.conf *line
  order*, Includes expanded where they stand, a ``File=`` range expanded in
  order. With the MIG include written in reverse (cap120/121 first), the job
  with IDX:2 was allowed ``nvidia-cap102/103``, the third line, not the third
  smallest minor; two ``File=`` lines /dev/nvidia1 then /dev/nvidia0 gave
  IDX:0 -> /dev/nvidia1; lines ``Type=l40s /dev/nvidia0`` then ``Type=a30
  /dev/nvidia1`` gave an a30 job IDX:1 (no sorting by type either). The
  trailing number that `slurmd -G` prints as ``Index=`` is the device minor,
  not this index.

So the prolog reads gres.conf as slurmd does and takes the files of record
N: the files are what the job's cgroup allows, so they, not a re-derived
order, say which GPU or MIG instance the job holds.
"""

from __future__ import annotations

import os
import re

from ..errors import GpushareError
from ..records import record
from .paths import plain


class GresConfReadError(GpushareError):
    exit_code = 1


@record
class GresRecord:
    """One gpu GRES as Slurm numbers it: its index and device files."""

    index: int
    gres_type: str | None
    files: tuple[str, ...]
    source: str  # file:line, for messages


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand(expr: str) -> list[str]:
    """Slurm hostlist syntax as gres.conf uses it: ``/dev/nvidia[0-3,5]``, ``gpu-[01-02]``."""
    out: list[str] = []
    for part in _split_top(expr):
        m = re.search(r"\[([^\[\]]*)\]", part)
        if m is None:
            out.append(part)
            continue
        head, tail = part[: m.start()], part[m.end() :]
        for item in m[1].split(","):
            lo, _, hi = item.strip().partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise GresConfReadError(f"bad range {item!r} in {expr!r}")
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            for n in range(int(lo), int(hi or lo) + 1):
                out += expand(head + str(n).zfill(width) + tail)
    return out


def _logical_lines(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise GresConfReadError(f"cannot read {path}: {exc.strerror}") from None
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            buf, start = buf + line[:-1] + " ", start or number
            continue
        line, first, buf, start = (buf + line).strip(), start or number, "", 0
        if line:
            yield first, line


def gpu_records(gres_conf: str | os.PathLike, node: str) -> list[GresRecord]:
    """This node's gpu records in Slurm's index order (module docstring)."""
    records: list[GresRecord] = []
    _walk(plain(gres_conf), node, records, set())
    return records


def _walk(path: str, node: str, records: list[GresRecord], seen: set[str]) -> None:
    if path in seen:
        raise GresConfReadError(f"{path} is Included twice")
    seen.add(path)
    for number, line in _logical_lines(path):
        words = line.split()
        if words[0].lower() == "include":
            target = " ".join(words[1:])
            _walk(
                plain(target if target.startswith("/") else os.path.join(os.path.dirname(path), target)),
                node,
                records,
                seen,
            )
            continue
        keys = {}
        for word in words:
            key, sep, value = word.partition("=")
            if sep:
                keys[key.lower()] = value.strip('"')
        if keys.get("name", "").lower() != "gpu" or ("nodename" in keys and node not in expand(keys["nodename"])):
            continue
        where = f"{path}:{number}"
        if "multiplefiles" in keys:
            records.append(GresRecord(len(records), keys.get("type"), tuple(expand(keys["multiplefiles"])), where))
            continue
        files = expand(keys.get("file") or keys.get("files") or "")
        if not files:
            count = int(keys.get("count", "1")) if keys.get("count", "1").isdigit() else 1
            records += [GresRecord(len(records) + i, keys.get("type"), (), where) for i in range(count)]
        for f in files:
            records.append(GresRecord(len(records), keys.get("type"), (f,), where))
