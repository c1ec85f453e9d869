"""One change of one node: new MIG layouts, or new sharing modes, of some of its GPUs, made in one drain.

The one type the live planner's proposal (``report.Proposal``), a change it
holds back (``report.Held``) and the apply side's record of a change in flight
(``state.Record``) each carry. A change is either MIG layouts or sharing
modes, never both (a MIG GPU never changes mode: that needs a GPU reset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..policy.groups import format_indexes
from ..policy.share import SHARED_GRES, Share


class LayoutStep(NamedTuple):
    """A GPU's MIG layout before and after the change."""

    gpu: int
    old: tuple[str, ...]
    new: tuple[str, ...]


class ModeStep(NamedTuple):
    """A GPU's share before and after the change."""

    gpu: int
    old: Share
    new: Share


@dataclass(frozen=True)
class Change:
    node: str
    layouts: tuple[LayoutStep, ...] = ()  # every GPU whose MIG layout changes, in GPU order
    modes: tuple[ModeStep, ...] = ()  # or every GPU whose sharing mode changes, in GPU order

    def __post_init__(self):
        if bool(self.layouts) == bool(self.modes):
            raise ValueError(
                f"node {self.node}: a change has MIG layouts or sharing modes (one of them): "
                f"layouts {self.layouts!r}, modes {self.modes!r}"
            )

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(s.gpu for s in self.layouts or self.modes)

    @property
    def new_layouts(self) -> dict[int, tuple[str, ...]]:
        """gpu -> new MIG layout (``policy.document.with_layouts``' argument); {} for a change of modes."""
        return {s.gpu: tuple(s.new) for s in self.layouts}

    @property
    def new_modes(self) -> dict[int, dict]:
        """gpu -> new sharing entry (``policy.document.with_modes``' argument); {} for a change of layouts."""
        return {s.gpu: s.new.to_entry() for s in self.modes}

    def text(self) -> str:
        """'GPU 0 to A and GPUs 1-2 to B' (GPUs with the same new layout together), or
        'GPU 1 exclusive -> mps (100 units), GPU 2 exclusive -> mps (100 units)'."""
        if self.modes:
            return ", ".join(f"GPU {s.gpu} {s.old.text} -> {s.new.text}" for s in self.modes)
        by_layout: dict[tuple[str, ...], list[int]] = {}
        for s in self.layouts:
            by_layout.setdefault(tuple(s.new), []).append(s.gpu)
        parts = [
            f"GPU{'s' if len(g) > 1 else ''} {format_indexes(sorted(g))} to {'+'.join(new)}"
            for new, g in sorted(by_layout.items(), key=lambda ng: min(ng[1]))
        ]
        return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]

    def first(self) -> tuple[str, str]:
        """The first GPU's before and after as text ('1g.5gb+1g.5gb', 'exclusive'), for one-line logs."""
        if self.modes:
            return self.modes[0].old.text, self.modes[0].new.text
        return "+".join(self.layouts[0].old), "+".join(self.layouts[0].new)

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "layouts": [[s.gpu, list(s.old), list(s.new)] for s in self.layouts],
            "modes": [[s.gpu, s.old.to_entry(), s.new.to_entry()] for s in self.modes],
        }

    @classmethod
    def from_json(cls, data: dict) -> Change:
        """``to_json``'s shape; TypeError, KeyError or ValueError for anything else."""
        layouts = tuple(
            LayoutStep(int(g), tuple(map(str, old)), tuple(map(str, new))) for g, old, new in data.get("layouts") or ()
        )
        modes = tuple(
            ModeStep(int(g), Share.from_entry(old), Share.from_entry(new)) for g, old, new in data.get("modes") or ()
        )
        return cls(str(data["node"]), layouts, modes)


def share_of_text(text: str) -> Share:
    """``Share.text``'s inverse for the shares the live planner sets: 'mps (100 units)', 'exclusive',
    'shard (4 replicas)'. ValueError for anything else (state files of format 1 kept a GPU's old mode as this
    text)."""
    number = text.partition(" (")[2].partition(" ")[0]
    candidates = [Share()]
    if number.isdigit():
        candidates += [Share.from_entry({"mode": m, "units": number, "replicas": number}) for m in SHARED_GRES]
    for share in candidates:
        share = Share.from_entry(share.to_entry())  # only the keys its mode uses
        if share.text == text:
            return share
    raise ValueError(
        f"{text!r} is not a GPU mode as the live planner writes one (exclusive, 'mps (N units)', 'shard (N replicas)')"
    )
