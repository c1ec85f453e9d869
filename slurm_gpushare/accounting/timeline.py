"""GPU-equivalent use over time: each group's GPU-seconds in time buckets across the window. Pure.

The usage aggregator feeds this with the same clipped job intervals and
GPU-equivalents it adds to its totals (``UsageAggregator(timeline=...)``),
so the buckets of a group sum to that group's ``gpu_seconds``: a plot of
the buckets and the usage table carry the same numbers.

Bucket edges fall on whole multiples of the bucket in the report's time
zone (midnight for days, Mondays for weeks), so the first and last buckets
are the parts of them inside the window.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Hashable
from dataclasses import dataclass, field

MINUTE, HOUR, DAY, WEEK = 60, 3600, 86400, 604800
# Auto buckets, smallest first: the first one that gives at most MAX_AUTO buckets is taken.
NICE = (
    1,
    5,
    10,
    30,
    MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    WEEK,
    4 * WEEK,
)
MAX_AUTO = 60
MAX_BUCKETS = 2000
# Monday 1970-01-05 00:00 UTC: a multiple of every NICE bucket up to a day, and the start of a week.
_ORIGIN = 4 * DAY

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": MINUTE, "h": HOUR, "d": DAY, "w": WEEK}


class BucketError(ValueError):
    """A bucket size that cannot be used; the message says what would be accepted."""


def parse_bucket(text: str) -> float | None:
    """``auto`` (None), or a duration such as 30s, 15m, 1h, 1d, 1w."""
    text = text.strip().lower()
    if text == "auto":
        return None
    m = _DURATION.match(text)
    seconds = float(m[1]) * _UNIT[m[2]] if m else 0.0
    if seconds <= 0:
        raise BucketError(f"bucket {text!r}: use auto or a positive duration such as 30s, 15m, 1h, 1d or 1w")
    return seconds


def choose_bucket(span: float, max_buckets: int = MAX_AUTO) -> float:
    """The smallest nice bucket that cuts ``span`` seconds into at most ``max_buckets`` (aligned) buckets."""
    for b in NICE:
        if math.ceil(span / b) + 1 <= max_buckets:
            return float(b)
    return float(math.ceil(span / (max_buckets - 1) / WEEK) * WEEK)


def bucket_edges(since: float, until: float, bucket: float, utc_offset: float = 0.0) -> tuple[float, ...]:
    """since, the aligned edges strictly inside (since, until), until."""
    if until <= since:
        raise BucketError("the window is empty: until must be after since")
    if bucket <= 0:
        raise BucketError("the bucket must be a positive number of seconds")
    origin = _ORIGIN - utc_offset
    first = origin + (math.floor((since - origin) / bucket) + 1) * bucket
    inner = math.ceil((until - first) / bucket) if first < until else 0
    if inner + 1 > MAX_BUCKETS:
        raise BucketError(
            f"a {label(bucket)} bucket cuts this window into {inner + 1:,} buckets, more than "
            f"{MAX_BUCKETS:,}: use a bucket of at least {label(choose_bucket(until - since, MAX_BUCKETS))}"
        )
    return (since, *(t for t in (first + i * bucket for i in range(inner)) if t < until), until)


def label(seconds: float) -> str:
    """30 s, 15 min, 6 h, 1 d, 1 w: a bucket size as a person reads it."""
    for unit, size in (("w", WEEK), ("d", DAY), ("h", HOUR), ("min", MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


@dataclass
class Timeline:
    """GPU-seconds per group and bucket; ``edges`` has one more entry than each series."""

    edges: tuple[float, ...]
    bucket: float
    series: dict[Hashable, list[float]] = field(default_factory=dict)

    @classmethod
    def over(cls, since: float, until: float, bucket: float | None = None, utc_offset: float = 0.0) -> Timeline:
        """Buckets of ``bucket`` seconds (None: chosen from the window's length) over [since, until)."""
        size = bucket if bucket is not None else choose_bucket(until - since)
        return cls(bucket_edges(since, until, size, utc_offset), size)

    @property
    def buckets(self) -> int:
        return len(self.edges) - 1

    def add(self, key: Hashable, a: float, b: float, gpus: float) -> None:
        """``gpus`` GPU-equivalents held over [a, b] (already clipped to the window), spread over the buckets."""
        row = self.series.get(key)
        if row is None:
            row = self.series[key] = [0.0] * self.buckets
        if b <= a or not gpus:
            return
        edges = self.edges
        i = max(0, bisect_right(edges, a) - 1)
        last = self.buckets - 1
        while i <= last and edges[i] < b:
            lo = edges[i] if edges[i] > a else a
            hi = edges[i + 1] if edges[i + 1] < b else b
            if hi > lo:
                row[i] += gpus * (hi - lo)
            i += 1

    def total(self, key: Hashable) -> float:
        return math.fsum(self.series.get(key, ()))

    def top(self, keys: list[Hashable], n: int) -> list[tuple[str, list[float]]]:
        """(name, series) for the first ``n - 1`` of ``keys`` (in that order) and the rest summed as "(others: k)"
        (all ``n`` when they fit): what a legend can hold, still summing to the whole."""
        named = [(k, self.series.get(k, [0.0] * self.buckets)) for k in keys]
        if len(named) <= n:
            return [(name(k), s) for k, s in named]
        kept, rest = named[: n - 1], named[n - 1 :]
        others = [math.fsum(col) for col in zip(*(s for _, s in rest), strict=False)]
        return [(name(k), s) for k, s in kept] + [(f"(others: {len(rest)})", others)]

    def as_json(self, keys: list[Hashable], stamp) -> dict:
        """The buckets as the JSON report carries them: edges as ``stamp(t)`` texts, GPU-equivalent hours."""
        return {
            "bucket_seconds": self.bucket,
            "edges": [stamp(t) for t in self.edges],
            "unit": "GPU-equivalent hours",
            "series": {name(k): [v / HOUR for v in self.series.get(k, [0.0] * self.buckets)] for k in keys},
        }


def name(key: Hashable) -> str:
    """A group key as text: account/user for associations."""
    return "/".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
