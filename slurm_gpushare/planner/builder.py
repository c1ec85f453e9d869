"""The policy document of one candidate: node groups split by pool, tiers, weights and routes. Pure.

``planner.candidates`` decides which nodes go to which pool; ``Builder`` accumulates the node groups it makes
(each with its sharing entries) and writes them, the tiers and the routes into a copy of the base policy. A tier
whose mps GPUs would bill one mps unit differently is split (Slurm has one TRESBillingWeights per partition).
"""

from __future__ import annotations

import copy

from hostlist import collect_hostlist
from hostlist import expand_hostlist as expand_nodes

from ..policy.billing import gpu_weight
from ..policy.groups import gpus_value
from ..policy.share import Mode, Share
from .estimates import GroupInfo


def split_group(spec: dict, parts: list[tuple[str, list[str], list[dict]]]) -> list[dict]:
    """Copies of the node group ``spec``, one per part (name suffix, its nodes, their sharing entries) that has
    nodes; '' keeps the group's name."""
    out = []
    for suffix, nodes, sharing in parts:
        if not nodes:
            continue
        g = copy.deepcopy(spec)
        g["name"] = f"{spec['name']}-{suffix}" if suffix else spec["name"]
        g["nodes"] = collect_hostlist(nodes)
        g["sharing"] = sharing
        out.append(g)
    return out


def gpu_range(n: int):
    """A sharing entry's ``gpus`` value for GPUs 0 to n-1."""
    return gpus_value(range(0, n))


def mig_sharing(layouts: list[tuple[str, ...]], gpus: int) -> list[dict]:
    """One node's sharing entries for its GPUs' layouts (runs of equal layouts merged)."""
    out, i = [], 0
    while i < gpus:
        j = i
        while j < gpus and layouts[j] == layouts[i]:
            j += 1
        out.append({"gpus": gpus_value(range(i, j)), **Share(Mode.MIG, layouts[i]).to_entry()})
        i = j
    return out


def per_job_sharing(gpus: int) -> list[dict]:
    """One node's sharing entries: every GPU per-job MIG with the model's default profiles."""
    return [{"gpus": gpu_range(gpus), "mode": Mode.MIG.value, "per_job": True}]


def mps_sharing(units: int, gpus: int) -> list[dict]:
    """One node's sharing entries: every GPU shared through MPS with ``units`` units."""
    return [{"gpus": gpu_range(gpus), **Share(Mode.MPS, units=units).to_entry()}]


class Builder:
    """Accumulates node groups (in slurm.conf order), tiers and routes for one candidate."""

    def __init__(self, base: dict, groups: list[GroupInfo]):
        self.base = base
        self.groups = groups
        self.out_groups: list[dict] = []
        self.members: dict[str, list[str]] = {}
        self.weights: dict[str, int] = {}
        self.cpus: dict[str, int] = {}
        self.gpus: dict[str, int] = {}
        self.models: dict[str, str] = {}  # out group -> GPU model name (the billing weight's key)
        self.split: dict[str, list[str]] = {}  # tier -> the tiers it was split into (itself first)

    def split_by_mps_weight(self, billing) -> list[str]:
        """Split each tier whose mps GPUs would bill one mps unit differently (model weight / units).

        Slurm has one TRESBillingWeights per partition, so GRES/mps takes one weight per tier (the policy's
        validation refuses more). The tier keeps the weight class with the most GPUs (and every group
        without mps); each other class becomes a tier '<tier>-<n>' that the tier's routes list right after it.
        """
        why = []
        by_name = {g["name"]: g for g in self.out_groups}
        for tier, names in list(self.members.items()):
            classes: dict[float | None, list[str]] = {}
            for name in names:
                classes.setdefault(_mps_unit_weight(by_name[name], self.models[name], billing), []).append(name)
            weights = [w for w in classes if w is not None]
            if len(weights) < 2:
                continue
            gpus = {
                w: sum(by_name[n]["gpu"]["count"] * len(expand_nodes(by_name[n]["nodes"])) for n in classes[w])
                for w in weights
            }
            weights.sort(key=lambda w: -gpus[w])  # stable: first listed among equals
            self.members[tier] = classes[weights[0]] + classes.get(None, [])
            self.members[tier].sort(key=names.index)
            new = [tier]
            for k, w in enumerate(weights[1:], start=2):
                name = f"{tier}-{k}"
                self.members[name] = classes[w]
                new.append(name)
            self.split[tier] = new
            why.append(
                f"tier '{tier}' split by the billing weight of one mps unit (Slurm has one weight per TRES per "
                f"partition): "
                + "; ".join(
                    f"'{t}' {', '.join(self.members[t])} ({_fmt(w)})" for t, w in zip(new, weights, strict=False)
                )
            )
        # tiers in the order they were made, each split right after its tier
        order = []
        for tier in self.members:
            if tier in order:
                continue
            order += self.split.get(tier, [tier])
        self.members = {t: self.members[t] for t in order}
        return why

    def add(self, spec: dict, tier: str, weight: int, nodes: int = 0, model: str = "") -> None:
        self.out_groups.append(spec)
        self.models[spec["name"]] = model
        self.members.setdefault(tier, []).append(spec["name"])
        self.weights[spec["name"]] = weight
        self.cpus[tier] = self.cpus.get(tier, 0) + nodes * spec["cpus"]
        self.gpus[tier] = self.gpus.get(tier, 0) + nodes * spec["gpu"]["count"]

    def policy(self, routes: list[dict], default: str) -> dict:
        raw = copy.deepcopy(self.base)
        for g in self.out_groups:
            g["weight"] = self.weights[g["name"]]
        raw["node_groups"] = self.out_groups
        raw["tiers"] = [
            {"name": t, "node_groups": names, **({"default": True} if t == default else {})}
            for t, names in self.members.items()
        ]
        sub = dict(raw.get("submission") or {})
        sub["routes"] = [
            {**r, "tiers": list(dict.fromkeys(x for t in r["tiers"] for x in self.split.get(t, [t])))} for r in routes
        ]
        raw["submission"] = sub
        return raw


def _mps_unit_weight(spec: dict, model: str, billing) -> float | None:
    """The billing weight of one mps unit on this group's GPUs (None when none shares through MPS)."""
    units = {s["units"] for s in spec["sharing"] if s.get("mode") == Mode.MPS}
    if not units:
        return None
    assert len(units) == 1, f"{spec['name']}: the planner gives one mps units value per group"
    return round(gpu_weight(billing, model) / units.pop(), 6)


def _fmt(w: float) -> str:
    return f"{w:g} per mps unit"
