"""`gpushare offers`: what this cluster's GPUs offer, in a user's words, with the request to type for each."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import GpushareError
from ..policy import Group, Site, TierView, load_file
from ..policy.billing import carrier_fraction
from ..policy.share import Mode
from ..sitepolicy import describe, find_policy
from ..submit import build_tables
from ..submit.tables import Tables, TierCaps


@click.command()
@click.option(
    "--policy",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site policy (default: $GPUSHARE_POLICY, else /etc/gpushare/policy.yaml).",
)
@click.option("--tier", "tier_name", metavar="NAME", help="Only this tier (partition).")
def offers(policy: Path | None, tier_name: str | None) -> None:
    """Say what each tier (partition) offers: whole GPUs, MIG slices (fixed, or made per job), shards, MPS shares,
    aliases.

    \b
      gpushare offers
      gpushare offers --tier inference

    Each line is something a job can get and the sbatch options that ask for
    it; `gpushare check -- OPTIONS` then says whether a request is accepted
    and what the submission filter would change in it.
    """
    path, how = find_policy(policy, os.environ)
    site = load_file(path)
    for line in offer_lines(site, build_tables(site), tier_name, describe(path, how)):
        click.echo(line)


def offer_lines(site: Site, tables: Tables, tier_name: str | None = None, header: str = "") -> list[str]:
    """The whole report: the policy line, each tier's offers (routing order), the aliases."""
    views = {v.name: v for v in site.tiers}
    caps = [t for t in tables.tiers if tier_name in (None, t.name)]
    if not caps:
        raise GpushareError(f"no tier {tier_name!r} in this policy; tiers: {', '.join(sorted(views))}")
    lines = [header] if header else []
    lines.append(
        f"cluster {site.cluster.name}: default tier {tables.default_tier.name} "
        "(a job that names no partition goes there unless a route sends it elsewhere)"
    )
    for cap in caps:
        lines += ["", *tier_lines(views[cap.name], cap)]
    lines += alias_lines(tables)
    return lines


def tier_lines(view: TierView, cap: TierCaps) -> list[str]:
    """One tier: its conditions, then what it offers and how to ask, one row each."""
    part = "" if cap.is_default else f"-p {cap.name} "
    rows: dict[str, str] = {}
    for group in view.groups:
        for what, request in group_offers(group, cap):
            rows.setdefault(what, part + request)
    models = sorted({g.model_feature: g.model.name for g in view.groups}.items())
    lines = [f"tier {cap.name}{' (default)' if cap.is_default else ''}: {_conditions(view)}"]
    lines += _table([(request, what) for what, request in rows.items()] or [("(no GPUs)", "")])
    if len(models) > 1:
        lines.append(
            "  one GPU model only: --constraint="
            + " or --constraint=".join(f for f, _ in models)
            + "; any of them: --constraint='"
            + "|".join(f for f, _ in models)
            + "'"
        )
    return lines


def _conditions(view: TierView) -> str:
    spec = view.spec
    said = [f"max time {spec.max_time.lower()}" if spec.max_time not in ("UNLIMITED", "INFINITE") else "no time limit"]
    said.append("not preempted" if spec.preempt_mode == "off" else f"may be preempted ({spec.preempt_mode})")
    if spec.allow_accounts:
        said.append("accounts " + ", ".join(spec.allow_accounts) + " only")
    if view.exclusive_user:
        said.append("one user per node at a time")
    return "; ".join(said)


def group_offers(group: Group, cap: TierCaps) -> list[tuple[str, str]]:
    """(what a job gets, the options that ask for it) for every GPU of a group this tier serves."""
    model, out = group.model, []
    for slot in group.gpus:
        if slot.share.is_mig:
            out += [_mig(model, p, t) for p, t in zip(slot.layout, slot.mig_types(), strict=False) if t in cap.gpu]
            continue
        if slot.share.is_per_job_mig:
            out += [_per_job(slot, p, t) for t, (_w, p) in cap.slices.items() if p in slot.share.profiles]
        if slot.slurm_type in cap.gpu:
            empty = " when no job's slice is on it" if slot.share.is_per_job_mig else ""
            whole = f"one whole {model.name} GPU ({_gib(model.memory_mib)}){empty}"
            out.append((whole, f"--gres=gpu:{slot.slurm_type}:1"))
        if slot.mode == Mode.SHARD and slot.share.shared_gres in cap.shared:
            out.append(
                (
                    f"a time slice of one {model.name} GPU ({slot.replicas} jobs share it, its memory is not divided)",
                    "--gres=shard:1",
                )
            )
        if slot.mode == Mode.MPS and slot.share.shared_gres in cap.shared:
            out.append(_mps(model.name, slot.units))
    return out


def _mig(model, profile: str, gres_type: str) -> tuple[str, str]:
    p = model.profile(profile)
    return (
        f"a MIG slice {p.name} of one {model.name} GPU ({_gib(p.memory_mib)}, "
        f"{p.compute_slices}/{model.compute_slices} of its compute, billed as {p.fraction(model):.2f} GPU)",
        f"--gres=gpu:{gres_type}:1",
    )


def _per_job(slot, profile: str, gres_type: str) -> tuple[str, str]:
    """A per-job MIG slice: asked for as a fixed one; the instance is made when the job starts, destroyed after."""
    model, p = slot.model, slot.model.profile(profile)
    billed = carrier_fraction(slot) * slot.share.weight(p.name)
    return (
        f"a MIG slice {p.name} of one {model.name} GPU ({_gib(p.memory_mib)}, {p.compute_slices}/"
        f"{model.compute_slices} of its compute, billed as {billed:.2f} GPU), made for the job when it starts",
        f"--gres=gpu:{gres_type}:1",
    )


def _mps(model_name: str, units: int) -> tuple[str, str]:
    quarter = max(1, units // 4)
    share = "N% of" if units == 100 else f"N/{units} of"
    return (
        f"an MPS share of one {model_name} GPU: mps:N is {share} its threads and memory (N from 1 to {units}), "
        "one task per node",
        f"--gres=mps:{quarter} --ntasks-per-node=1",
    )


def alias_lines(tables: Tables) -> list[str]:
    """The policy's aliases: the short name a user may type, and what it stands for."""
    if not tables.aliases:
        return []
    rows = []
    for name, alias in sorted(tables.aliases.items()):
        meant = f"{alias.name}:{alias.type}:1" if alias.type else f"{alias.name}:{alias.per}"
        rows.append((f"--gres=gpu:{name}:1", f"is --gres={meant}"))
    return ["", "aliases:", *_table(rows)]


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def _table(rows: list[tuple[str, str]]) -> list[str]:
    """Two columns: what to type (padded), then what it means."""
    width = max(len(first) for first, _ in rows)
    return [f"  {first.ljust(width)}  {second}".rstrip() for first, second in rows]


COMMANDS = (offers,)
