"""The paper's cluster state and its BestFit and Random baselines, vectorised with numpy. Pure.

As the FGD paper's simulator (hkust-adsl/kubernetes-scheduler-simulator)
runs them, read from its Go sources:
- Filter: CPU (millicores) and memory are hard limits (Kubernetes
  NodeResourcesFit); a GPU pod needs, on one node, one GPU with enough milli
  left (a share) or ``num_gpu`` wholly free GPUs (pkg/type/open-gpu-share/cache
  gpunodeinfo.go ``AllocateGpuId``). GPU memory is not modelled.
- BestFit (pkg/simulator/plugin/best_fit_score.go): a node's score is
  ``int64((1 - (0.5 (cpu_left - cpu_req)/128000 + 0.5 (gpu_left - gpu_req)/8000)) x 100)``
  with gpu_left the node's total milli left; highest wins. Its GPU choice is
  the configured default "best" (open_gpu_share.go ``allocateGpuIdBasedOnBestFit``):
  a share goes to the GPU with the least milli left that fits, lowest index
  among equals; whole GPUs are the lowest-indexed free ones
  (resource.go ``AllocateExclusiveGpuId``).
- Random (random_score.go): one node drawn uniformly from the nodes that pass
  the filter; the GPU is drawn uniformly among those that fit (``-gpusel random``,
  ``allocateGpuIdBasedOnRandomFit``).
- GPU type (pkg/utils/utils.go ``IsNodeAccessibleToPodByType``, called by the
  open-gpu-share Filter for every pod asking GPU milli): a pod's ``gpu_spec``
  (the ``alibabacloud.com/gpu-card-model`` annotation, e.g. ``V100M16|V100M32``)
  lists the GPU models it may run on, split on '|' (empty entries ignored); a
  node passes when its model is one of them. An empty spec passes every node; a
  spec names no model of a node without GPUs; a spec of separators only passes
  every GPU node. A CPU-only pod's spec is never checked.
- Ties between equal node scores: the simulator's vendored Kubernetes
  ``selectHost`` (pkg/scheduler/core/generic_scheduler.go) keeps the smallest
  node name, and simulator.go ``syncClusterResourceList`` prefixes every node
  name with its place in a seeded random permutation; so ties go to a fixed,
  seeded random node order. ``PaperState.rank`` is that order, drawn from the
  run's ``rng`` (not Go's generator).
"""

from __future__ import annotations

import numpy as np

from ..cluster import GPU_MILLI, Pod, SimCluster
from .gpustate import GpuKind, milli_kind

MAX_SPEC_CPU = 128000  # pkg/type/open-gpu-share/utils/const.go
MAX_SPEC_GPU = 8000


def spec_allows(spec: str, model: str) -> bool:
    """utils.go ``IsNodeAccessibleToPodByType``: may a pod with GPU type ``spec`` run on a node of GPU ``model``."""
    if not spec:
        return True
    if not model:
        return False  # a node without GPUs
    types = [t for t in spec.split("|") if t]
    return model in types or not types


def node_models(cluster: SimCluster) -> list[str]:
    """Each node's GPU model ('' for a node without GPUs), as the simulator labels a node."""
    return [n.gpus[0].model if n.gpus else "" for n in cluster.nodes]


class PaperState:
    """Node state as the paper's simulator keeps it: millicores, MiB and one state code per GPU."""

    def __init__(self, cluster: SimCluster, pods: tuple[Pod, ...], kind: GpuKind, rng: np.random.Generator):
        self.kind = kind
        self.models = node_models(cluster)
        specs = sorted({p.gpu_spec for p in pods if p.num_gpu} | {""})
        index = {spec: k for k, spec in enumerate(specs)}
        # [N, K]: may node n host a GPU pod of spec k; p_spec: each pod's spec column ('' for CPU-only pods)
        self.spec_ok = np.array([[spec_allows(spec, m) for spec in specs] for m in self.models], dtype=bool)
        self.spec_ok = self.spec_ok.reshape(len(self.models), len(specs))
        self.p_spec = np.array([index[p.gpu_spec] if p.num_gpu else index[""] for p in pods], dtype=np.int64)
        self.rank = rng.permutation(len(cluster.nodes))  # tie order: lowest rank wins
        self.host = kind.host  # [S, A]
        width = max((len(n.gpus) for n in cluster.nodes), default=0)
        self.cpu = np.array([n.milli for n in cluster.nodes], dtype=np.int64)
        self.mem = np.array([n.memory_mib for n in cluster.nodes], dtype=np.int64)
        self.present = np.zeros((len(cluster.nodes), max(width, 1)), dtype=bool)
        for i, n in enumerate(cluster.nodes):
            self.present[i, : len(n.gpus)] = True
        self.st = np.where(self.present, kind.free, kind.absent).astype(np.int64)
        self.p_cpu = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        self.p_mem = np.array([p.memory_mib for p in pods], dtype=np.int64)
        self.p_num = np.array([p.num_gpu for p in pods], dtype=np.int64)
        self.p_act = np.array([kind.action(p) for p in pods], dtype=np.int64)
        self.p_share = (self.p_num == 1) & (self.p_act >= 0) & (self.p_act != kind.whole)
        self.p_gpu_milli = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)

    def fits(self, pod: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Nodes that pass the filter, and for a share the [node, gpu] mask of GPUs it fits on."""
        ok = (self.cpu >= self.p_cpu[pod]) & (self.mem >= self.p_mem[pod])
        num = self.p_num[pod]
        if num == 0:
            return ok, None
        ok = ok & self.spec_ok[:, self.p_spec[pod]]
        if self.p_share[pod]:
            gpu_ok = self.host[self.st, self.p_act[pod]] & ok[:, None]
            return gpu_ok.any(axis=1), gpu_ok
        return ok & ((self.st == self.kind.free).sum(axis=1) >= num), None

    def left_total(self) -> np.ndarray:
        return self.kind.left[self.st].sum(axis=1)

    def commit(self, pod: int, node: int, gpu: int = -1, option: int = -1) -> None:
        """Place ``pod`` on ``node``: a share on ``gpu`` (at ``option``), whole GPUs on the lowest free indexes."""
        self.cpu[node] -= self.p_cpu[pod]
        self.mem[node] -= self.p_mem[pod]
        num, act = self.p_num[pod], self.p_act[pod]
        if num == 0:
            return
        nxt = self.kind.nxt
        if self.p_share[pod]:
            if option < 0:
                option = int(np.flatnonzero(nxt[self.st[node, gpu], act] >= 0)[0])
            self.st[node, gpu] = nxt[self.st[node, gpu], act, option]
            return
        free = np.flatnonzero(self.st[node] == self.kind.free)[:num]
        first = int(np.flatnonzero(nxt[self.kind.free, act] >= 0)[0])
        self.st[node, free] = nxt[self.kind.free, act, first]

    def metrics(self) -> dict[str, float]:
        if self.kind.slices is None:
            return {}
        used = self.kind.slices[self.st][self.present].sum()
        share = 100.0 * used / (self.kind.slices_per_gpu * self.present.sum())
        # every GPU is a MIG GPU in this model (a whole-GPU job holds the 7g instance, all compute slices), so the
        # MIG GPUs are all the GPUs: both figures are the same count (slurmmodel.occupied_slices for Slurm)
        gpus = float(self.present.sum())
        return {"slices_occupied": share, "mig_gpus": gpus, "slices_occupied_all": share, "gpus": gpus}


def pick_max(scores: np.ndarray, ok: np.ndarray, rank: np.ndarray) -> int:
    """The best-scoring node among ``ok``, the lowest ``rank`` among equals (selectHost), or -1."""
    cand = np.flatnonzero(ok)
    if not len(cand):
        return -1
    s = scores[cand]
    best = cand[s == s.max()]
    return int(best[np.argmin(rank[best])]) if len(best) > 1 else int(best[0])


class _PaperPolicy:
    """What BestFit and Random share: the paper's node state on a GPU kind (milli shares unless given)."""

    def __init__(self, kind: GpuKind | None = None):
        self._kind = kind

    def start(self, cluster: SimCluster, pods: tuple[Pod, ...], rng: np.random.Generator) -> None:
        self.s = PaperState(cluster, pods, self._kind or milli_kind(pods), rng)
        self.rng = rng

    def metrics(self) -> dict[str, float]:
        return self.s.metrics()


class BestFit(_PaperPolicy):
    """The paper's BestFit (05-BestFit in its published results)."""

    name = "BestFit"

    def place(self, pod: int) -> bool:
        s = self.s
        ok, gpu_ok = s.fits(pod)
        if not ok.any():
            return False
        score = best_fit_score(s.cpu, s.left_total(), s.p_cpu[pod], s.p_gpu_milli[pod])
        node = pick_max(score, ok, s.rank)
        gpu = -1
        if gpu_ok is not None:
            left = np.where(gpu_ok[node], s.kind.left[s.st[node]], np.iinfo(np.int64).max)
            gpu = int(np.argmin(left))
        s.commit(pod, node, gpu)
        return True


def best_fit_score(cpu_left: np.ndarray, gpu_left: np.ndarray, cpu_req: int, gpu_req: int) -> np.ndarray:
    """best_fit_score.go ``getBestFitScore``, in the same float64 operation order, truncated like int64()."""
    score = 0.0 + (cpu_left - cpu_req) / MAX_SPEC_CPU * 0.5
    score = score + (gpu_left - gpu_req) / MAX_SPEC_GPU * 0.5
    return np.trunc((1.0 - score) * 100.0).astype(np.int64)


class RandomPolicy(_PaperPolicy):
    """The paper's Random (01-Random): a uniformly random feasible node, a random fitting GPU."""

    name = "Random"

    def place(self, pod: int) -> bool:
        ok, gpu_ok = self.s.fits(pod)
        cand = np.flatnonzero(ok)
        if not len(cand):
            return False
        node = int(cand[self.rng.integers(len(cand))])
        gpu = -1
        if gpu_ok is not None:
            gpus = np.flatnonzero(gpu_ok[node])
            gpu = int(gpus[self.rng.integers(len(gpus))])
        self.s.commit(pod, node, gpu)
        return True


__all__ = [
    "GPU_MILLI",
    "BestFit",
    "PaperState",
    "RandomPolicy",
    "best_fit_score",
    "node_models",
    "pick_max",
    "spec_allows",
]
