"""The gpu tier runs only where real NVML answers; elsewhere every test skips with one line."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def backend():
    """NvmlBackend over the real pynvml, read-only use only."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        pytest.skip("gpu tier: pynvml not installed (pip install nvidia-ml-py)")
    from slurm_gpushare.gpu import GpuError, open_backend

    try:
        backend = open_backend(None)
    except GpuError as exc:
        pytest.skip(f"gpu tier: NVML unavailable here ({exc})")
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def gpus(backend):
    found = backend.gpus()
    if not found:
        pytest.skip("gpu tier: NVML reports no GPUs")
    return found


@pytest.fixture(scope="session")
def mig_gpus(gpus):
    found = [g for g in gpus if g.mig_current]
    if not found:
        pytest.skip("gpu tier: no GPU has MIG mode enabled (this tier never enables it)")
    return found
