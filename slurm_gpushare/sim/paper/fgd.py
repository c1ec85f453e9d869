"""FGD (fragmentation gradient descent, Weng et al., USENIX ATC 2023), vectorised with numpy. Pure.

As its simulator defines it (hkust-adsl/kubernetes-scheduler-simulator, read,
not copied):
- Target workload (pkg/utils/frag.go ``GetTypicalPods``, with the paper's run
  settings in scripts/generate_config_and_run.py: CPU pods included,
  popularity threshold 95 %, step 1, no GPU weight): the original pod list's
  distinct (cpu, gpu share, GPU count, GPU type) classes, most frequent first
  (equal counts: larger class first), taken until they cover 95 % of pods, then
  renormalised to popularities summing to 1.
- A node's fragmentation (``NodeGpuShareFragAmountScore``): for each class,
  popularity x the GPU milli the class could not use: all the node's idle GPU
  milli if the node lacks CPU for it or cannot host it at all (or it is a
  CPU-only class: the simulator counts its whole idle GPU milli as well);
  otherwise only the idle milli of GPUs too small for its share. A class whose
  GPU type (``gpu_spec``) excludes the node's model counts all the node's idle
  GPU milli too (frag.go ``GetNodePodFrag``: ``NoAccess``), and the Filter
  keeps such pods off the node (baselines.py ``spec_allows``).
- Score (plugin/fgd_score.go): ``int64(sigmoid((frag_before - frag_after)/1000) x 100)``.
  A share is tried on every GPU of the node that fits and keeps the first best
  GPU; whole GPUs are the lowest-indexed free ones. The best node wins; equal
  scores go to the node first in a seeded random order (see baselines.py).

The fragmentation sum is computed in integers (class counts instead of
popularities, divided once), so an unchanged node scores exactly 50 as in Go.
With a ``MigKind`` the same measure runs on MIG GPUs: a class "fits" a GPU
where its covering profile has a free placement, idle milli is free compute
slices, and every valid start of the profile on every GPU is a candidate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cluster import Pod, SimCluster
from .baselines import PaperState, pick_max, spec_allows
from .gpustate import GpuKind, milli_kind

POPULARITY = 95  # percent of pods the target workload's classes must cover
SCORE_MAX = 100


@dataclass(frozen=True)
class TaskClass:
    """One class of the target workload: its resources and how many pods of the trace have them."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: str
    count: int


def typical_classes(pods: tuple[Pod, ...], popularity: int = POPULARITY) -> tuple[tuple[TaskClass, ...], int]:
    """The target workload's classes and the pod count they cover (the popularity denominator)."""
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec) for p in pods)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    expected = popularity * len(pods) / 100.0
    chosen, covered = [], 0
    for key, count in ranked:
        if covered >= expected:
            break
        chosen.append(TaskClass(*key, count=count))
        covered += count
    return tuple(chosen), covered


class FragMeasure:
    """The fragmentation of node states under one target workload, in integer units (x covered pods).

    With ``models`` (each node's GPU model) a class counts as hostable only on nodes whose model its
    ``gpu_spec`` allows: the class weights ``W`` are kept per model, and each node reads its model's.
    Without, or when no class names a type, every node reads the same weights.
    """

    def __init__(self, classes: tuple[TaskClass, ...], kind: GpuKind, width: int, models: Sequence[str] | None = None):
        self.kind = kind
        self.total = sum(c.count for c in classes)
        gpu_classes = [c for c in classes if c.num_gpu]
        acts = [kind.action(Pod("", c.cpu_milli, 0, c.num_gpu, c.gpu_milli, gpu_spec=c.gpu_spec)) for c in gpu_classes]
        self.actions = sorted(set(acts))
        host = kind.host[:, self.actions].astype(np.int64)  # [S, M]
        self.H = host
        self.P = kind.left[:, None] * (1 - host)
        self.cvals = np.array(sorted({c.cpu_milli for c in gpu_classes}), dtype=np.int64)
        typed = models if models is not None and any(c.gpu_spec for c in gpu_classes) else None  # per model
        groups: list[str | None] = [*sorted(set(typed))] if typed is not None else [None]
        self.group = np.array([groups.index(m) for m in typed], dtype=np.int64) if typed is not None else None
        self.W = np.zeros((len(groups), len(self.actions), len(self.cvals) + 1, width + 1), dtype=np.int64)
        for c, a in zip(gpu_classes, acts, strict=True):
            m = self.actions.index(a)
            rank = int(np.searchsorted(self.cvals, c.cpu_milli))
            if c.num_gpu > width:
                continue
            for g, model in enumerate(groups):
                if model is None or spec_allows(c.gpu_spec, model):
                    self.W[g, m, rank + 1 :, c.num_gpu :] += c.count
        self._m = np.arange(len(self.actions))
        self.width = width

    def node_terms(self, st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node: idle milli T, GPUs able to host each action, idle milli of GPUs that cannot."""
        return self.kind.left[st].sum(axis=1), self.H[st].sum(axis=1), self.P[st].sum(axis=1)

    def value(
        self, cpu: np.ndarray, T: np.ndarray, cnt: np.ndarray, part: np.ndarray, nodes: np.ndarray | None = None
    ) -> np.ndarray:
        """Fragmentation x covered pods, for arrays of node states (cpu, T: [C]; cnt, part: [C, M]) of the
        nodes ``nodes`` (their indexes, needed when the measure has models)."""
        b = np.searchsorted(self.cvals, cpu, side="right")
        g = 0 if self.group is None else self.group[nodes][:, None]
        w = self.W[g, self._m[None, :], b[:, None], np.minimum(cnt, self.width)]
        return self.total * T - ((T[:, None] - part) * w).sum(axis=1)

    def frag(self, cpu: np.ndarray, st: np.ndarray, nodes: np.ndarray | None = None) -> np.ndarray:
        """Fragmentation (milli-GPU) of nodes with ``cpu`` millicores left and GPU states ``st``."""
        T, cnt, part = self.node_terms(st)
        return self.value(cpu, T, cnt, part, nodes) / self.total


def fgd_score(before: np.ndarray, after: np.ndarray, total: int) -> np.ndarray:
    """fgd_score.go: int64(sigmoid((before - after) / 1000) x 100), fragmentation given x ``total``."""
    x = (before - after) / total / 1000.0
    return np.trunc(1.0 / (1.0 + np.exp(-x)) * SCORE_MAX).astype(np.int64)


class FGD:
    """The paper's FGD (06-FGD in its published results)."""

    name = "FGD"

    def __init__(self, kind: GpuKind | None = None, workload: tuple[Pod, ...] | None = None):
        self._kind = kind
        self._workload = workload

    def start(self, cluster: SimCluster, pods: tuple[Pod, ...], rng: np.random.Generator) -> None:
        kind = self._kind or milli_kind(pods)
        self.s = s = PaperState(cluster, pods, kind, rng)
        self.rng = rng
        classes, _ = typical_classes(self._workload or pods)
        self.fm = FragMeasure(classes, kind, s.st.shape[1], s.models)
        self.T, self.cnt, self.part = self.fm.node_terms(s.st)
        self.F = self.fm.value(s.cpu, self.T, self.cnt, self.part, np.arange(len(s.cpu)))
        free = kind.free
        self._whole_after = {}
        for a in range(kind.nxt.shape[1]):
            opts = np.flatnonzero(kind.nxt[free, a] >= 0)
            if len(opts):
                self._whole_after[a] = int(kind.nxt[free, a, opts[0]])

    def place(self, pod: int) -> bool:
        s = self.s
        ok, _ = s.fits(pod)
        if not ok.any():
            return False
        if s.p_share[pod]:
            node, gpu, option = self._best_share(pod, ok)
        else:
            node, gpu, option = self._best_node(pod, ok), -1, -1
        s.commit(pod, node, gpu, option)
        self._refresh(node)
        return True

    def _best_node(self, pod: int, ok: np.ndarray) -> int:
        """CPU-only and whole-GPU pods: one after-state per node."""
        s, fm = self.s, self.fm
        nodes = np.flatnonzero(ok)
        cpu = s.cpu[nodes] - s.p_cpu[pod]
        T, cnt, part = self.T[nodes], self.cnt[nodes], self.part[nodes]
        num = int(s.p_num[pod])
        if num:
            after = self._whole_after[int(s.p_act[pod])]
            free = s.kind.free
            T = T - num * (s.kind.left[free] - s.kind.left[after])
            cnt = cnt + num * (fm.H[after] - fm.H[free])
            part = part + num * (fm.P[after] - fm.P[free])
        score = np.full(len(s.cpu), -1, dtype=np.int64)
        score[nodes] = fgd_score(self.F[nodes], fm.value(cpu, T, cnt, part, nodes), fm.total)
        return pick_max(score, ok, s.rank)

    def _best_share(self, pod: int, ok: np.ndarray) -> tuple[int, int, int]:
        """A share: every (node, GPU, start) where it fits is a candidate; a node keeps its first best."""
        s, fm = self.s, self.fm
        act = int(s.p_act[pod])
        nxt = s.kind.nxt[s.st, act]  # [n, G, O]
        valid = (nxt >= 0) & ok[:, None, None]
        node, gpu, opt = np.nonzero(valid)
        old, new = s.st[node, gpu], nxt[node, gpu, opt]
        T = self.T[node] - s.kind.left[old] + s.kind.left[new]
        cnt = self.cnt[node] - fm.H[old] + fm.H[new]
        part = self.part[node] - fm.P[old] + fm.P[new]
        after = fm.value(s.cpu[node] - s.p_cpu[pod], T, cnt, part, node)
        n_nodes, G, n_opt = nxt.shape
        dense = np.full((n_nodes, G * n_opt), -1, dtype=np.int64)
        dense[node, gpu * n_opt + opt] = fgd_score(self.F[node], after, fm.total)
        best_slot = dense.argmax(axis=1)
        chosen = pick_max(dense.max(axis=1), ok, s.rank)
        slot = int(best_slot[chosen])
        return chosen, slot // n_opt, slot % n_opt

    def _refresh(self, node: int) -> None:
        T, cnt, part = self.fm.node_terms(self.s.st[node : node + 1])
        self.T[node], self.cnt[node], self.part[node] = T[0], cnt[0], part[0]
        self.F[node] = self.fm.value(self.s.cpu[node : node + 1], T, cnt, part, np.array([node]))[0]

    def metrics(self) -> dict[str, float]:
        return self.s.metrics()
