"""GPU hardware catalogue: models, memory, MIG profiles, valid MIG layouts.

Pure data and pure functions (stdlib only, no I/O), so the policy validator,
renderers, the fake NVML and node planning all agree on one description of
the hardware. Values and their sources: see ``data.py``.
"""

from __future__ import annotations

from .data import CATALOGUE
from .layout import Placement, check_layout, place_layout
from .model import CatalogueError, GpuModel, MigProfile, known

__all__ = [
    "CatalogueError",
    "GpuModel",
    "MigProfile",
    "Placement",
    "check_layout",
    "get_model",
    "model_for_nvml_name",
    "models",
    "place_layout",
]

_MODELS = tuple(sorted(CATALOGUE.values(), key=lambda m: m.name))
_BY_LOWER_NAME = {m.name.lower(): m for m in _MODELS}


def models() -> tuple[GpuModel, ...]:
    """Every catalogued model, sorted by canonical name."""
    return _MODELS


def get_model(name: str) -> GpuModel:
    """The model with this canonical name (case-insensitive), e.g. 'H100-SXM5-80GB'."""
    found = CATALOGUE.get(name) if isinstance(name, str) else None
    if found is None and isinstance(name, str):
        found = _BY_LOWER_NAME.get(name.strip().lower())
    if found is None:
        raise CatalogueError(f"unknown GPU model {name!r}; " + known("models", CATALOGUE))
    return found


def _nvml_key(nvml_name: str) -> str:
    """Spelling-tolerant key: case and spacing ignored, 'NVIDIA ' prefix optional
    (R450 drivers omitted it), and a MIG handle's ' MIG <profile>' tail dropped."""
    key = " ".join(nvml_name.split()).casefold()
    key = key.split(" mig ", 1)[0]
    return key.removeprefix("nvidia ")


def _nvml_index() -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for model in _MODELS:
        for nvml_name in model.nvml_names:
            other = index.setdefault(_nvml_key(nvml_name), model)
            if other is not model:
                raise CatalogueError(f"NVML name {nvml_name!r} matches both {other.name} and {model.name}")
    return index


_BY_NVML = _nvml_index()


def model_for_nvml_name(nvml_name: str) -> GpuModel:
    """The model whose nvmlDeviceGetName string this is, e.g. 'NVIDIA H100 80GB HBM3'.

    Also accepts a MIG device's name ('NVIDIA H200 MIG 1g.18gb') and the name
    without the 'NVIDIA ' prefix.
    """
    found = _BY_NVML.get(_nvml_key(nvml_name)) if isinstance(nvml_name, str) else None
    if found is None:
        names = (n for m in _MODELS for n in m.nvml_names)
        raise CatalogueError(f"unknown NVML GPU name {nvml_name!r}; " + known("NVML names", names))
    return found
