"""The only code that touches GPUs: NvmlBackend over pynvml or the fake NVML.

Import cost matters (the node hooks run on every job): nothing here imports
pynvml; ``open_backend`` does, at the entry point that asks for it.
"""

from .backend import (
    ComputeInstance,
    GiProfile,
    GpuError,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    MigDevice,
    NvmlBackend,
    Placement,
    open_backend,
)
from .migminors import MIG_MINORS, MigMinorsError, parse_mig_minors, read_mig_minors

__all__ = [
    "MIG_MINORS",
    "ComputeInstance",
    "GiProfile",
    "GpuError",
    "GpuInfo",
    "GpuInstance",
    "GpuProcess",
    "MigDevice",
    "MigMinorsError",
    "NvmlBackend",
    "Placement",
    "open_backend",
    "parse_mig_minors",
    "read_mig_minors",
]
