"""The FGD paper's workload family: the openb trace as the paper published it, in the checkout's tests/data/gpu-trace.

The 17 pod lists whose FGD figures the paper published (``WORKLOADS``, tests/data/gpu-trace/NOTICE), found by name,
and the production trace (``default_trace``). The files live in the checkout, not in the wheel, and so does this
module (sim/paper/ is left out of it): bench/ and the tests read them; ``gpushare plan --demand openb:FILE`` reads a
file through ``sim.trace``. Pure apart from reading the files.
"""

from __future__ import annotations

from pathlib import Path

from ..cluster import Pod, SimCluster
from ..trace import TraceError, load_cluster, load_pods

TRACE_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "gpu-trace"
# the FGD paper's workload family: every pod list whose FGD figures it published (tests/data/gpu-trace/NOTICE)
WORKLOADS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)


def default_trace() -> tuple[SimCluster, tuple[Pod, ...]]:
    """The copy shipped in tests/data/gpu-trace: 1,213 nodes, 6,212 GPUs, 8,152 pods."""
    return (
        load_cluster(TRACE_DIR / "openb_node_list_gpu_node.csv"),
        load_pods(TRACE_DIR / "openb_pod_list_default.csv"),
    )


def workload_path(name: str | Path) -> Path:
    """The pod list of a workload of the family by name ('gpuspec33' or 'openb_pod_list_gpuspec33'), or a file.

    The shipped copies are plain (default) or gzip-compressed (the others); a file may be either.
    """
    text = str(name)
    short = text.removeprefix("openb_pod_list_")
    if short in WORKLOADS:
        for suffix in (".csv", ".csv.gz"):
            path = TRACE_DIR / f"openb_pod_list_{short}{suffix}"
            if path.is_file():
                return path
        raise TraceError(f"workload {short!r}: no openb_pod_list_{short}.csv[.gz] in {TRACE_DIR}")
    path = Path(text)
    if not path.is_file():
        raise TraceError(
            f"workload {text!r}: neither a file nor one of the family's names "
            f"(accepted: {', '.join(WORKLOADS)}, or a path to an openb pod list, .csv or .csv.gz)"
        )
    return path


def workload_name(path: Path) -> str:
    """The family name of a pod list file ('gpuspec33'), or its file name when it is not one of the family."""
    stem = path.name.removesuffix(".gz").removesuffix(".csv").removeprefix("openb_pod_list_")
    return stem if stem in WORKLOADS else path.name


def load_workload(name: str | Path) -> tuple[Pod, ...]:
    """The pods of a workload of the family (by name) or of an openb pod list file."""
    return load_pods(workload_path(name))
