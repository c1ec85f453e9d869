"""The recent mix: what a node ran in ``live.history_window``, as the cost of taking capacity away from it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..policy import Site
from .text import hours, mins, type_name
from .view import kind


@dataclass(frozen=True)
class RecentMix:
    """What a node ran in the history window, as the cost of taking capacity away from it.

    A change holds the node for ``min_dwell`` at least; the recent mix goes on arriving at its rate
    meanwhile, so the jobs of type ``t`` expected in that time are ``jobs[t] * min_dwell / window``. A change
    that leaves the node ``caps[t]`` of its ``base[t]`` instances (slots, units) of ``t`` turns away the share
    ``(base[t] - caps[t]) / base[t]`` of them: the *stranded* jobs, subtracted from the change's benefit."""

    jobs: dict[str, int]  # GRES key -> jobs that ran on the node in the window (each once)
    base: dict[str, int]  # GRES key -> what the node has of it now
    dwell: float  # live.min_dwell
    window: float  # live.history_window

    @property
    def scale(self) -> float:
        return self.dwell / self.window

    def stranded(self, caps) -> float:
        return sum(self._lost(t, caps) for t in self.jobs)

    def _lost(self, t: str, caps) -> float:
        have = self.base.get(t, 0)
        if have <= 0 or caps.get(t, 0) >= have:
            return 0.0
        return self.jobs[t] * self.scale * (have - max(0, caps.get(t, 0))) / have

    def text(self, caps) -> str:
        """'the last 6 h ran 24 jobs of a100_40g_1g.5gb here: 4.0 expected within min_dwell (60 min), the change
        removes 7 of its 7' for every type the change takes capacity from ('' when none)."""
        parts = []
        for t in sorted(self.jobs, key=lambda t: (-self._lost(t, caps), t)):
            if self._lost(t, caps) > 0:
                have = self.base[t]
                parts.append(
                    f"{self.jobs[t]} job{'s' if self.jobs[t] != 1 else ''} of {type_name(t)} "
                    f"({self.jobs[t] * self.scale:.1f} expected within min_dwell {mins(self.dwell)}; the "
                    f"change keeps {max(0, caps.get(t, 0))} of {have})"
                )
        if not parts:
            return ""
        return f"the last {hours(self.window)} ran " + ", ".join(parts)


def mix_of(site: Site, ran, base) -> RecentMix | None:
    """A node's ``RecentMix`` from the RecentJobs that ``ran`` there (None: no history window, no min_dwell, or
    nothing of its GRES ran there)."""
    live = site.policy.live
    if live.history_window <= 0 or live.min_dwell <= 0:
        return None
    jobs: Counter = Counter()
    for r in ran:
        for key in {kind(k) for k in r.gres}:
            if base.get(key, 0) > 0:
                jobs[key] += 1
    if not jobs:
        return None
    return RecentMix(
        dict(jobs), {k: v for k, v in base.items() if v > 0}, float(live.min_dwell), float(live.history_window)
    )


def history_lines(history) -> tuple[str, ...]:
    """'a100_40g_1g.5gb: 12 jobs (lab-mig01 9, lab-mig02 3)' per GRES kind, most jobs first."""
    per: dict[str, Counter] = {}
    for r in history:
        for key in {kind(k) for k in r.gres}:
            per.setdefault(key, Counter())[r.node] += 1
    out = []
    for key, nodes in sorted(per.items(), key=lambda kn: (-sum(kn[1].values()), kn[0])):
        where = ", ".join(f"{n} {c}" for n, c in sorted(nodes.items(), key=lambda nc: (-nc[1], nc[0])))
        out.append(f"{type_name(key)}: {sum(nodes.values())} job(s) ({where})")
    return tuple(out)
