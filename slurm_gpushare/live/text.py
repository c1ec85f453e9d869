"""Small pieces of the live planner's report lines: durations, job id lists, GRES counts."""

from __future__ import annotations

import math


def num(x: float) -> str:
    """A count that may be fractional (a benefit less stranded jobs): '2', '1.5'."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def mins(seconds: float) -> str:
    return f"{int(seconds // 60)} min"


def mins_up(seconds: float) -> str:
    return f"{math.ceil(seconds / 60)} min"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else mins(seconds)


def ids(job_ids, most: int | None = None) -> str:
    job_ids = list(job_ids)
    if most is not None and len(job_ids) > most:
        return ",".join(str(i) for i in job_ids[: most - 1]) + f" and {len(job_ids) - most + 1} more"
    return ",".join(str(i) for i in job_ids)


def gres_text(gres: dict[str, int]) -> str:
    return ",".join(f"{k}:{v}" for k, v in sorted(gres.items())) or "none"


def type_name(key: str) -> str:
    """'gpu:a100_40g_1g.5gb' -> 'a100_40g_1g.5gb'; 'mps', 'shard' as they are."""
    return key.split(":", 1)[1] if key.startswith("gpu:") else key
