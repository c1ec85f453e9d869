"""The MIG what-if scenarios (S2, S3) of the GPU-trace benchmark: cluster, routers, stand-in layouts. Pure.

S2 and S3 turn every GPU of the trace into an A100-SXM4-40GB (same count per
node, same CPUs and memory) and round a fractional request up to the smallest
MIG profile that covers it (``gpustate.covering_profile``: the profile's share
of the GPU, the larger of its compute and memory slice shares).

The static layouts and the mode split are the planner's to choose (the
bench's ``scenarios.py``); beside them, this module gives plain stand-ins,
named as such wherever they are reported:
- ``proportional_layouts``: as many 7g.40gb GPUs as whole-GPU demand needs,
  packed node by node from the first node, and the other GPUs filled with the
  fractional profiles in proportion to their demand (first fit, largest first,
  within the catalogue's placement rules);
- ``split_by_qos``: the S3 stand-in: latency-sensitive (qos LS) fractional
  demand gets MIG GPUs with proportional layouts, every other GPU runs MPS
  (100 units) and serves whole-GPU and best-effort fractional jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from ...hardware import get_model
from ...hardware.layout import place_layout
from ...hardware.model import GpuModel
from ...policy.share import Mode
from ..cluster import GPU_MILLI, Pod, SimCluster, SimGpu, SlurmRequest
from .gpustate import covering_profile, mig_profiles

A100 = "A100-SXM4-40GB"
LS = "LS"


def a100_cluster(cluster: SimCluster) -> SimCluster:
    """The same nodes with every GPU an exclusive A100-SXM4-40GB."""
    model = get_model(A100)
    nodes = tuple(
        replace(n, gpus=tuple(SimGpu(mode=Mode.EXCLUSIVE, model=A100, gres_type=model.slurm_type) for _ in n.gpus))
        for n in cluster.nodes
    )
    return replace(cluster, nodes=nodes)


def whole_profile(model: GpuModel) -> str:
    return max(mig_profiles(model), key=lambda p: p.compute_slices).name


def rounded_profile(pod: Pod, model: GpuModel) -> str:
    """The MIG profile a GPU pod gets: the covering profile of its share (the whole-GPU profile for 1000)."""
    return covering_profile(model, pod.gpu_milli).name


def mig_router(model_name: str = A100):
    """S2 submission: every GPU pod asks for typed MIG GRES, ``gpu:<model>_<profile>:N``."""
    model = get_model(model_name)

    def route(pod: Pod) -> SlurmRequest:
        cpus = -(-pod.cpu_milli // 1000)
        if not pod.num_gpu:
            return SlurmRequest((), cpus, pod.memory_mib)
        gres_type = model.mig_slurm_type(rounded_profile(pod, model))
        return SlurmRequest((), cpus, pod.memory_mib, gres="gpu", gres_type=gres_type, count=pod.num_gpu)

    return route


def qos_router(model_name: str = A100, units: int = 100):
    """S3 submission: LS fractional -> typed MIG slice; other fractional -> mps; whole -> typed whole GPUs."""
    model = get_model(model_name)

    def route(pod: Pod) -> SlurmRequest:
        cpus = -(-pod.cpu_milli // 1000)
        if not pod.num_gpu:
            return SlurmRequest((), cpus, pod.memory_mib)
        if pod.gpu_milli >= GPU_MILLI:
            return SlurmRequest((), cpus, pod.memory_mib, gres="gpu", gres_type=model.slurm_type, count=pod.num_gpu)
        if pod.qos == LS:
            gres_type = model.mig_slurm_type(rounded_profile(pod, model))
            return SlurmRequest((), cpus, pod.memory_mib, gres="gpu", gres_type=gres_type, count=1)
        return SlurmRequest((), cpus, pod.memory_mib, gres="mps", count=-(-pod.gpu_milli * units // GPU_MILLI))

    return route


def pack_profiles(model: GpuModel, wanted: Counter, gpus: int) -> list[tuple[str, ...]]:
    """Fill GPU after GPU with the ``wanted`` instances, largest profile first, in valid layouts only.

    Instances left when the GPUs are full are dropped; GPUs left over stay empty.
    """
    left = Counter(wanted)
    names = sorted(left, key=lambda n: (-model.profile(n).compute_slices, n))
    layouts: list[tuple[str, ...]] = []
    for _ in range(gpus):
        layout: list[str] = []
        for name in names:
            while left[name] > 0 and place_layout(model, [*layout, name]) is not None:
                layout.append(name)
                left[name] -= 1
        layouts.append(tuple(layout))
    return layouts


def proportional_counts(model: GpuModel, pods: list[Pod], gpus: int) -> Counter:
    """Instances per fractional profile, in proportion to how many pods want each, filling ``gpus`` GPUs.

    A profile is counted by its share of the GPU (``MigProfile.fraction``: a
    3g.20gb holds half the memory), so the counts can be packed.
    """
    want = Counter(rounded_profile(p, model) for p in pods)
    need = sum(model.profile(n).fraction(model) * c for n, c in want.items())
    if not need:
        return Counter()
    scale = gpus / need
    return Counter({n: max(1, int(c * scale)) for n, c in want.items()})


def with_layouts(cluster: SimCluster, layouts: list[tuple[str, ...] | None], model_name: str = A100) -> SimCluster:
    """Give GPU k (in node order, then index) layout ``layouts[k]``: MIG records in creation order, or None: mps."""
    model = get_model(model_name)
    it = iter(layouts)
    nodes = []
    for n in cluster.nodes:
        gpus = []
        for _ in n.gpus:
            layout = next(it)
            if layout is None:
                gpus.append(SimGpu(mode=Mode.MPS, model=model_name, gres_type=model.slurm_type, units=100))
            else:
                mig = tuple(model.mig_slurm_type(p) for p in layout)
                gpus.append(SimGpu(mode=Mode.MIG, model=model_name, mig=mig))
        nodes.append(replace(n, gpus=tuple(gpus)))
    return replace(cluster, nodes=tuple(nodes))


def _whole_gpus_needed(pods: tuple[Pod, ...], model: GpuModel, gpus: int, shared_milli: int) -> int:
    whole = sum(p.num_gpu for p in pods if p.num_gpu and rounded_profile(p, model) == whole_profile(model))
    return min(gpus, round(gpus * whole / max(whole + shared_milli / GPU_MILLI, 1)))


def proportional_layouts(cluster: SimCluster, pods: tuple[Pod, ...], model_name: str = A100) -> SimCluster:
    """S2 stand-in: whole-GPU layouts first (node order), proportional fractional layouts on the rest."""
    model = get_model(model_name)
    a100 = a100_cluster(cluster)
    total = a100.gpu_count
    big = whole_profile(model)
    fractional = [p for p in pods if p.num_gpu and rounded_profile(p, model) != big]
    shared_milli = sum(round(model.profile(rounded_profile(p, model)).fraction(model) * GPU_MILLI) for p in fractional)
    n_whole = _whole_gpus_needed(pods, model, total, shared_milli)
    rest = total - n_whole
    counts = proportional_counts(model, fractional, rest)
    mixed = pack_profiles(model, counts, rest)
    layouts: list[tuple[str, ...] | None] = [(big,)] * n_whole + list(mixed)
    return replace(with_layouts(a100, layouts, model_name), select_flags=cluster.select_flags)


def split_by_qos(cluster: SimCluster, pods: tuple[Pod, ...], model_name: str = A100) -> SimCluster:
    """S3 stand-in: MIG GPUs (proportional layouts) for LS fractional demand, MPS GPUs for everything else."""
    model = get_model(model_name)
    a100 = a100_cluster(cluster)
    total = a100.gpu_count
    is_ls = [p.num_gpu == 1 and p.gpu_milli < GPU_MILLI and p.qos == LS for p in pods]
    ls = [p for p, flag in zip(pods, is_ls, strict=True) if flag]
    ls_slices = sum(model.profile(rounded_profile(p, model)).compute_slices for p in ls)
    other_milli = sum(p.gpu_demand_milli for p, flag in zip(pods, is_ls, strict=True) if p.num_gpu and not flag)
    ls_share = ls_slices / model.compute_slices
    n_mig = min(total, round(total * ls_share / max(ls_share + other_milli / GPU_MILLI, 1)))
    counts = proportional_counts(model, ls, n_mig)
    mig = pack_profiles(model, counts, n_mig)
    # MIG GPUs last in node order, so whole-GPU jobs find their MPS GPUs on full nodes first
    layouts: list[tuple[str, ...] | None] = [None] * (total - n_mig) + list(mig)
    return replace(with_layouts(a100, layouts, model_name), select_flags=cluster.select_flags)


def mig_slices(model_name: str = A100) -> dict[str, int]:
    """Compute slices per MIG GRES type, for slice occupancy."""
    model = get_model(model_name)
    return {model.mig_slurm_type(p.name): p.compute_slices for p in model.mig_profiles}


def mig_shares(model_name: str = A100) -> dict[str, int]:
    """Milli-GPU each MIG GRES type stands for (its ``fraction``), to spot jobs given a smaller slice."""
    model = get_model(model_name)
    return {model.mig_slurm_type(p.name): round(p.fraction(model) * GPU_MILLI) for p in model.mig_profiles}


def profile_from_router(router, model_name: str = A100) -> Callable[[Pod], str]:
    """The MIG profile a submission router gives a GPU pod, read off its typed GRES.

    ``gpu:<model>_<profile>`` is that profile; the whole-GPU type ``gpu:<model>``
    (or untyped) is the whole-GPU profile. So FGD can run on exactly the
    requests the product's submission makes.
    """
    model = get_model(model_name)
    big = whole_profile(model)
    prefix = model.slurm_type + "_"

    def profile_of(pod: Pod) -> str:
        req = router(pod)
        if req is None or req.gres != "gpu" or not req.gres_type.startswith(prefix):
            return big if (req is None or req.gres == "gpu") else covering_profile(model, pod.gpu_milli).name
        return model.profile(req.gres_type[len(prefix) :]).name

    return profile_of
