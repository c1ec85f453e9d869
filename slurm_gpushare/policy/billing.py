"""TRESBillingWeights derived from the hardware, per tier (Slurm partition).

One whole GPU of model M bills ``w(M)`` (``billing.gpu_weights``; a model not
listed there bills ``billing.default_gpu_weight``, 100 unless the policy says otherwise).
A MIG instance bills ``w(M) * max(c/C, m/M)``: the larger of its share of the
GPU's compute slices and of its memory slices, since that is what it takes
away from everybody else. A shard bills ``w(M) / replicas``; an MPS unit
``w(M) / units``.

A per-job MIG slice of profile p is carried by ``weight(p)`` shards
(``policy.perjob``), so one carrier shard bills ``w(M) * max(f(p) / weight(p))``
over the allowed profiles, f(p) being the fixed slice's fraction above: the
least per-shard weight that bills no slice less than a fixed slice of its
profile. The exact weights of the 7-slice GPUs are proportional to f(p)
(1g=2, 2g=4, 3g=7, 4g=8, 7g=14 of 15: each f(p)/weight(p) = 1/14), so there a
per-job slice bills exactly what a fixed one of the same profile bills.

Slurm bills a job the sum of weight x allocated count over every TRES the job
has, and a typed request counts twice (``gres/gpu`` and ``gres/gpu:<type>``),
an untyped one only once. So within a partition the untyped ``GRES/gpu`` weight
is the cheapest GPU kind there (a floor for untyped requests), and each type
adds only its excess over that floor: a typed job bills exactly its kind's
weight.
"""

from __future__ import annotations

from ..errors import Problem
from .model import Billing
from .share import SHARED_GRES
from .site import GpuSlot, Group


def fmt(value: float) -> str:
    """Stable, short number text for Slurm config files."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def gpu_weight(billing: Billing, model_name: str) -> float:
    return billing.gpu_weights.get(model_name, billing.default_gpu_weight)


def kind_weights(groups: tuple[Group, ...], billing: Billing) -> tuple[dict[str, float], dict[str, set[float]]]:
    """Weight of one allocated unit per GRES kind ('gpu:<type>', 'shard', 'mps'), and every weight seen."""
    seen: dict[str, set[float]] = {}
    for group in groups:
        whole = gpu_weight(billing, group.model.name)
        for kind, fraction in unit_fractions(group):
            seen.setdefault(kind, set()).add(round(whole * fraction, 6))
    return {k: max(v) for k, v in seen.items()}, seen


def unit_fractions(group: Group) -> list[tuple[str, float]]:
    """(kind, GPU fraction of one allocated unit) for every GRES kind of a group.

    The same fractions bill jobs and count GPU-equivalents in accounting.
    """
    out: list[tuple[str, float]] = []
    for slot in group.gpus:
        share = slot.share
        if share.is_mig:
            out += [
                (f"gpu:{slot.model.mig_slurm_type(p)}", slot.model.profile(p).fraction(slot.model)) for p in slot.layout
            ]
            continue
        out.append((f"gpu:{slot.slurm_type}", 1.0))
        if share.is_per_job_mig:
            out.append((share.shared_gres, carrier_fraction(slot)))
        elif share.shared_gres:
            out.append((share.shared_gres, 1.0 / share.shared_count))
    return out


def carrier_fraction(slot: GpuSlot) -> float:
    """GPU fraction of one carrier shard of a per-job MIG GPU: the most any allowed profile's fixed-slice fraction
    asks of one of its shards (so ``weight(p)`` shards bill at least a fixed p slice; exactly where proportional)."""
    share, model = slot.share, slot.model
    return max(model.profile(p).fraction(model) / share.weight(p) for p in share.profiles)


def carried_slices(groups: tuple[Group, ...]) -> dict[int, tuple[str, float]]:
    """Per-job MIG slices by their carrier count: weight(p) -> ('gpu:<p's Slurm type>', the fixed p slice's GPU
    fraction, rounded as ``tier_fractions``), so a job holding weight(p) shards counts as a fixed p slice does.
    Validation keeps one carrier per tier (``perjob.check_tier``) and the weights are exact: a weight is one profile."""
    return {
        w: (f"gpu:{slot.model.mig_slurm_type(p)}", round(slot.model.profile(p).fraction(slot.model), 9))
        for g in groups
        for slot in g.gpus
        if slot.share.is_per_job_mig
        for p, w in zip(slot.share.profiles, slot.share.weights, strict=True)
    }


def tier_fractions(groups: tuple[Group, ...]) -> dict[str, float]:
    """GPU fraction of one unit of each TRES ('gres/gpu:<type>', 'gres/shard', 'gres/mps') in one partition.

    Validation guarantees one value per TRES within a tier. Untyped 'gres/gpu'
    is absent: what an untyped GPU was is only known from its type.
    """
    return {f"gres/{kind}": round(f, 9) for g in groups for kind, f in unit_fractions(g)}


def tier_weights(
    groups: tuple[Group, ...], billing: Billing, path: str
) -> tuple[tuple[tuple[str, float], ...], list[Problem]]:
    """The (TRES, weight) pairs of one partition's TRESBillingWeights, and any conflicts."""
    single, seen = kind_weights(groups, billing)
    problems = [
        Problem(
            path,
            f"GRES/{kind} would need several billing weights in one partition "
            f"({', '.join(fmt(w) for w in sorted(ws))}): "
            "Slurm has one weight per TRES per partition; give these GPUs the same replicas/units/model weight "
            "or put their node groups in separate tiers",
        )
        for kind, ws in sorted(seen.items())
        if len(ws) > 1 and not kind.startswith("gpu:")
    ]
    problems += [
        Problem(
            path,
            f"GRES/{kind} has different weights on different models ({', '.join(fmt(w) for w in sorted(ws))}); give "
            "each model its own type",
        )
        for kind, ws in sorted(seen.items())
        if len(ws) > 1 and kind.startswith("gpu:")
    ]
    pairs: list[tuple[str, float]] = []
    if billing.cpu:
        pairs.append(("CPU", billing.cpu))
    if billing.mem_per_gb:
        pairs.append(("Mem", billing.mem_per_gb))
    gpu_kinds = {k: w for k, w in single.items() if k.startswith("gpu:")}
    if gpu_kinds:
        floor = min(gpu_kinds.values())
        pairs.append(("GRES/gpu", floor))
        if len(gpu_kinds) > 1:
            pairs += [(f"GRES/{k}", round(w - floor, 6)) for k, w in sorted(gpu_kinds.items()) if w - floor > 1e-9]
    pairs += [(f"GRES/{k}", single[k]) for k in SHARED_GRES if k in single]
    return tuple(pairs), problems
