"""What the submission rules need to know about a site, derived once from the policy.

The same ``Tables`` drive the Python decision and are emitted as Lua table
literals into job_submit.lua, so the two can only disagree in their code,
never in their data (and the corpus tests that code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..policy import Group, Site, TierView
from ..slurmversion import SlurmVersion

FIELDS = ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task")
GRES_NAMES = ("gpu", "mps", "shard")  # GresTypes is always exactly these (render.context.GRES_TYPES)
SHARED = ("shard", "mps")
MAX_LEN = 1024  # longest tres_per_* string looked at; longer ones are refused unread
MAX_COUNT = 4294967295
MAX_TYPE_LEN = 64
SUFFIXES = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
# Entries of a tres_per_* string that are not GRES (23.11 keeps --cpus-per-task
# in tres_per_task as cpu=N): left exactly as written.
PASSTHROUGH_NAMES = ("billing", "cpu", "energy", "mem", "node", "pages", "vmem")
PASSTHROUGH_PREFIXES = ("bb/", "fs/", "ic/", "license/")
GRES_PREFIX_FROM = SlurmVersion(23, 11)  # 'gres/gpu:2' from 23.11, 'gres:gpu:2' before


@dataclass(frozen=True)
class Alias:
    """``gpu:<alias>:N`` means ``name[:type]:N*per``."""

    name: str
    type: str
    per: int


@dataclass(frozen=True)
class TierCaps:
    """What one tier (partition) can serve: GPU types, and per shared GRES the most one GPU holds."""

    name: str
    is_default: bool
    priority: int
    gpu: tuple[str, ...]
    shared: dict[str, dict[str, int]]


@dataclass(frozen=True)
class Tables:
    prefix: str
    reject_multi_slice: bool
    fail_open: bool
    route_by_gres: bool
    set_gpu_type: bool
    gpu_types: tuple[str, ...]
    shared: dict[str, dict[str, int]]
    aliases: dict[str, Alias]
    tiers: tuple[TierCaps, ...]  # routing order: default first, then priority (high first), then name
    texts: dict[str, str] = field(default_factory=dict)

    def tier(self, name: str) -> TierCaps | None:
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def default_tier(self) -> TierCaps:
        return next(t for t in self.tiers if t.is_default)


def shared_caps(groups: tuple[Group, ...]) -> dict[str, dict[str, int]]:
    """{'shard': {'': 4, 'l40s': 4}, 'mps': {...}}: the most units one GPU gives, overall ('') and per GPU type.

    Without SelectTypeParameters=MULTIPLE_SHARING_GRES_PJ (gpushare never sets
    it) Slurm takes a shared request on a node from a single GPU, so the
    largest GPU is the most any request can get.
    """
    caps: dict[str, dict[str, int]] = {}
    for group in groups:
        for slot in group.gpus:
            if slot.mode not in SHARED:
                continue
            units = slot.replicas if slot.mode == "shard" else slot.units
            per = caps.setdefault(slot.mode, {})
            for key in ("", slot.slurm_type):
                per[key] = max(per.get(key, 0), units)
    return {name: dict(sorted(per.items())) for name, per in sorted(caps.items())}


def tier_gpu_types(tier: TierView) -> tuple[str, ...]:
    """GPU types on the tier's nodes, narrowed to its gpu_types when it lists any."""
    types = {t for g in tier.groups for (n, t) in g.gres if n == "gpu"}
    if tier.spec.gpu_types:
        types &= set(tier.spec.gpu_types)
    return tuple(sorted(types))


def parse_alias(target: str) -> Alias:
    """An alias target already validated by the policy: 'gpu:<type>', 'shard' or 'mps:<n>'."""
    m = re.fullmatch(r"gpu:([a-z0-9_.]+)|shard|mps:([0-9]+)", target.strip())
    if m is None:
        raise ValueError(f"alias target {target!r} was not validated")
    if m[1]:
        return Alias("gpu", m[1], 1)
    if m[2]:
        return Alias("mps", "", int(m[2]))
    return Alias("shard", "", 1)


def routing_order(tiers: list[TierCaps]) -> tuple[TierCaps, ...]:
    return tuple(sorted(tiers, key=lambda t: (not t.is_default, -t.priority, t.name)))


def build_tables(site: Site) -> Tables:
    sub = site.policy.submission
    tiers = [
        TierCaps(v.name, v.is_default, v.spec.priority, tier_gpu_types(v), shared_caps(v.groups))
        for v in site.tiers
    ]
    aliases = {name: parse_alias(target) for name, target in sorted(sub.aliases.items())}
    shared = shared_caps(site.groups)
    tables = Tables(
        prefix="gres/" if site.version >= GRES_PREFIX_FROM else "gres:",
        reject_multi_slice=sub.reject_multi_slice,
        fail_open=sub.fail_open,
        route_by_gres=sub.route_by_gres,
        set_gpu_type=sub.set_gpu_type,
        gpu_types=tuple(site.gpu_types),
        shared=shared,
        aliases=aliases,
        tiers=routing_order(tiers),
    )
    return _with_texts(tables)


def _with_texts(t: Tables) -> Tables:
    """Lists that messages print, joined once here so Python and Lua print the same words."""
    offers = [f"gpu:{x}" for x in t.gpu_types] + sorted(t.shared)
    texts = {
        "gres_names": ", ".join(GRES_NAMES),
        "gpu_types": ", ".join(t.gpu_types) or "(none)",
        "aliases": ", ".join(sorted(t.aliases)),
        "offers": ", ".join(offers),
    }
    for name, per in t.shared.items():
        texts[f"{name}_types"] = ", ".join(k for k in per if k)
    return replace(t, texts=texts)
