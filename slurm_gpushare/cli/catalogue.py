"""`gpushare catalogue`: the GPU models and MIG profiles the policy can name."""

from __future__ import annotations

import click

from ..errors import GpushareError
from ..hardware import CatalogueError, get_model, models


@click.command()
@click.argument("model", required=False)
def catalogue(model: str | None) -> None:
    """List the known GPU models, or MODEL's MIG profiles, placements and named layouts."""
    if model is None:
        _models_table()
        return
    try:
        gpu = get_model(model)
    except CatalogueError as exc:
        raise GpushareError(str(exc)) from None
    _model_detail(gpu)


def _table(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())


def _models_table() -> None:
    rows = [
        (m.name, m.slurm_type, m.memory_mib, "yes" if m.mig_capable else "no", len(m.mig_profiles)) for m in models()
    ]
    _table(rows, ("MODEL", "SLURM TYPE", "MEMORY MiB", "MIG", "PROFILES"))


def _model_detail(gpu) -> None:
    click.echo(f"{gpu.name}: Slurm type {gpu.slurm_type}, {gpu.memory_mib} MiB, source: {gpu.source}")
    if not gpu.mig_capable:
        click.echo("no MIG support: share it with mode exclusive, shard or mps")
        return
    click.echo(f"MIG: {gpu.compute_slices} compute slices, {gpu.memory_slices} memory slices")
    rows = [
        (
            p.name,
            gpu.mig_slurm_type(p.name),
            p.profile_id,
            p.nvml_constant,
            p.compute_slices,
            p.memory_slices,
            p.memory_mib,
            p.max_instances,
            ",".join(map(str, p.placements)),
            f"{p.fraction(gpu):.4f}",
            "" if p.confirmed else "unconfirmed",
        )
        for p in gpu.mig_profiles
    ]
    _table(rows, ("PROFILE", "SLURM TYPE", "ID", "CONST", "C", "M", "MiB", "MAX", "STARTS", "BILLS", "NOTE"))
    click.echo("named layouts:")
    for name, layout in sorted(gpu.named_layouts().items()):
        click.echo(f"  {name}: {' + '.join(layout)}")
