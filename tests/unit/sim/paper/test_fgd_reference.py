"""FGD's vectorised choices against a plain, per-node reading of the simulator's rules, where CPUs run short.

The reference below restates, in floats and loops, what hkust-adsl/kubernetes-scheduler-simulator
does for one pod (read, not copied): target workload (pkg/utils/frag.go ``GetTypicalPods``),
fragmentation (``NodeGpuShareFragAmountScore``, ``GetNodePodFrag``: a CPU-only class counts all
idle GPU milli), score (plugin/fgd_score.go: a share tried on every GPU, the first best kept;
otherwise ``NodeResource.Sub``), ties to the smallest node name (the seeded rank). The workload is
CPU-heavy like cpu250 (CPU-only pods, pods asking most of a node's CPUs), so the CPU-only and
CPU-short paths of ``FragMeasure`` are the ones exercised.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode
from slurm_gpushare.sim.paper.fgd import FGD


def typical(pods: tuple[Pod, ...]) -> list[tuple[tuple[int, int, int], float]]:
    """GetTypicalPods: most frequent first (ties: larger resources first), to 95 %, renormalised."""
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu) for p in pods)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen, covered = [], 0
    while covered < 0.95 * len(pods):
        chosen.append(ranked[len(chosen)])
        covered += chosen[-1][1]
    return [(key, n / covered) for key, n in chosen]


def frag(classes, cpu_left: int, lefts: list[int]) -> float:
    idle, out = sum(lefts), 0.0
    for (cpu, milli, num), share in classes:
        hosts = sum(1 for x in lefts if x >= milli) >= num
        if milli and hosts and cpu_left >= cpu:
            out += share * sum(x for x in lefts if x < milli)  # Q3: only GPUs too small for it
        else:
            out += share * idle  # CPU-only class, or one the node cannot take now
    return out


def score(classes, cpu: int, lefts: list[int], pod: Pod) -> tuple[int, int]:
    """(score, GPU index) of ``pod`` on a node: fgd_score.go ``calculateGpuShareFragExtendScore``."""

    def sig(after_cpu, after):
        x = (frag(classes, cpu, lefts) - frag(classes, after_cpu, after)) / 1000
        return int(1 / (1 + math.exp(-x)) * 100)

    if pod.num_gpu == 1 and pod.gpu_milli < 1000:
        best, gpu = 0, -1
        for i, x in enumerate(lefts):
            if x >= pod.gpu_milli:
                s = sig(cpu - pod.cpu_milli, [v - pod.gpu_milli if k == i else v for k, v in enumerate(lefts)])
                if gpu < 0 or s > best:
                    best, gpu = s, i
        return best, gpu
    after, need = list(lefts), pod.num_gpu
    for i in sorted(range(len(after)), key=lambda k: after[k]):  # Sub: least milli left first
        if need and after[i] >= pod.gpu_milli:
            after[i] -= pod.gpu_milli
            need -= 1
    return sig(cpu - pod.cpu_milli, after), -1


def cpu_heavy_case(rng: np.random.Generator) -> tuple[SimCluster, tuple[Pod, ...]]:
    """12 nodes; 200 pods of cpu250's most frequent classes (cpu, milli, GPUs), a third of them CPU-only, and
    (16000, 1000, 1), exactly a 16-CPU node's CPUs (the ``>=`` of the CPU check); they ask 3.5x the CPUs.

    The seed is one whose case catches each of: CPU not taken off in a share's or a node's after-state,
    ``>`` for ``>=``, ties by node index, CPU-only pods left out of the target workload."""
    shapes = [(16, 1), (32, 2), (64, 4), (96, 8), (64, 2), (128, 8)]
    nodes = tuple(
        SimNode(f"n{i}", cpus, 10**6, tuple(SimGpu(mode="exclusive", model="T4") for _ in range(gpus)))
        for i, (cpus, gpus) in enumerate(shapes * 2)
    )
    kinds = [
        (12500, 0, 0),
        (32000, 0, 0),
        (8000, 0, 0),
        (3152, 810, 1),
        (11300, 1000, 1),
        (11908, 470, 1),
        (8000, 470, 1),
        (18708, 1000, 1),
        (6000, 250, 1),
        (40000, 1000, 2),
        (60000, 1000, 4),
        (16000, 1000, 1),
    ]
    weights = np.array([8, 6, 4, 10, 8, 4, 4, 3, 3, 2, 1, 3], dtype=float)
    picks = rng.choice(len(kinds), size=200, p=weights / weights.sum())
    pods = []
    for k, i in enumerate(picks):
        cpu, milli, num = kinds[i]
        pods.append(Pod(f"p{k:03d}", cpu_milli=cpu, memory_mib=1, num_gpu=num, gpu_milli=milli))
    return SimCluster(nodes), tuple(pods)


def test_fgd_choices_match_a_plain_reading_of_the_simulator_when_cpus_run_short():
    cluster, pods = cpu_heavy_case(np.random.default_rng(2))
    classes = typical(pods)
    policy = FGD()
    policy.start(cluster, pods, np.random.default_rng(3))
    s = policy.s
    refused_for_cpu = 0
    for pod in range(len(pods)):
        p = pods[pod]
        ok, _ = s.fits(pod)
        expected = None
        for node in np.flatnonzero(ok):
            lefts = [int(s.kind.left[x]) for x in s.st[node, : len(cluster.nodes[node].gpus)]]
            sc, gpu = score(classes, int(s.cpu[node]), lefts, p)
            key = (sc, -int(s.rank[node]))
            if expected is None or key > expected[0]:
                expected = (key, int(node), gpu)
        if expected is None and p.cpu_milli > s.cpu.max():
            refused_for_cpu += 1
        st, cpu = s.st.copy(), s.cpu.copy()
        assert policy.place(pod) == (expected is not None), p
        if expected is None:
            continue
        node = int(np.flatnonzero((s.cpu != cpu) | (s.st != st).any(axis=1))[0])
        assert node == expected[1], (pod, p)
        if expected[2] >= 0:
            assert int(np.flatnonzero(s.st[node] != st[node])[0]) == expected[2], (pod, p)
    assert refused_for_cpu > 20  # the case does reach the CPU-short regime it is meant to check
