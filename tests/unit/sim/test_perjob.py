"""Per-job MIG in the Slurm placement model: Slurm counts the carrier shards, the prolog places the slice on the
GPU Slurm picked, and a slice with no legal placement there is refused with its allocation undone."""

from __future__ import annotations

import numpy as np
import pytest

from slurm_gpushare.policy.share import Mode
from slurm_gpushare.sim.cluster import Pod, SimCluster, SimGpu, SimNode, SlurmRequest
from slurm_gpushare.sim.perjob import Carrier, Slices
from slurm_gpushare.sim.slurmmodel import LL_SHARED_GRES, SlurmPolicy, SlurmState

MODEL = "A100-SXM4-40GB"
# the least exact weights of these three profiles (hardware.migweights): Count=15
THREE = (("1g.5gb", 2), ("2g.10gb", 4), ("3g.20gb", 7))


def per_job_gpu(slices=THREE, capacity=15) -> SimGpu:
    return SimGpu(Mode.MIG, MODEL, "a100_40g", capacity, (), slices)


def cluster(gpus: int = 1, flags=frozenset()) -> SimCluster:
    return SimCluster(
        (SimNode("n1", 64, 100_000, tuple(per_job_gpu() for _ in range(gpus)), partitions=("p",)),), flags
    )


def slice_req(profile: str, cpus: int = 1) -> SlurmRequest:
    weight = dict(THREE)[profile]
    return SlurmRequest(("p",), cpus, 0, "shard", "", weight, mig_profile=profile)


def run(requests: list[SlurmRequest | None], c: SimCluster) -> tuple[SlurmPolicy, list[bool]]:
    pods = tuple(Pod(f"p{i}", 1000, 0, 1, 100) for i in range(len(requests)))
    policy = SlurmPolicy("t", lambda pod: requests[int(pod.name[1:])])
    policy.start(c, pods, np.random.default_rng(0))
    return policy, [policy.place(i) for i in range(len(requests))]


def test_a_per_job_gpu_is_a_gpu_record_and_carrier_shards():
    s = SlurmState(cluster())
    assert s.usable_any.tolist() == [1]
    assert s.sh_cap.tolist() == [[15]] and s.per_job.tolist() == [[True]]
    assert s.fits(slice_req("3g.20gb")).tolist() == [True]
    assert s.fits(SlurmRequest(("p",), 1, 0, "shard", "", 16)).tolist() == [False]


def test_slices_are_placed_on_the_gpu_slurm_picked():
    policy, placed = run([slice_req("3g.20gb"), slice_req("3g.20gb"), slice_req("1g.5gb")], cluster())
    assert placed == [True, True, False]  # 7 + 7 + 2 > 15: Slurm's count says no, nothing to place
    assert sorted(policy.slices.on[(0, 0)]) == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert policy.metrics()["slices_refused"] == 0.0


def test_an_admitted_slice_without_a_placement_is_refused_and_its_allocation_undone():
    # 1g + 1g + 2g + 3g weigh 15 of 15, and fit an empty GPU together, but the largest-first starts of the two
    # 1g (6, then 4: both keep 4g.20gb's and 3g.20gb's start at 0) and of the 2g (0) leave the 3g no legal start
    reqs = [slice_req("1g.5gb"), slice_req("1g.5gb"), slice_req("2g.10gb"), slice_req("3g.20gb", cpus=5)]
    policy, placed = run(reqs, cluster())
    assert placed == [True, True, True, False]
    assert sorted(policy.slices.on[(0, 0)]) == [("1g.5gb", 4), ("1g.5gb", 6), ("2g.10gb", 0)]
    s = policy.state
    assert s.sh_used.tolist() == [[8]] and s.room[2].tolist() == [[7]]
    assert s.cpu.tolist() == [61]  # the refused job's 5 CPUs came back
    assert policy.metrics()["slices_refused"] == 1.0
    assert len(policy.slices.on[(0, 0)]) == 3


def test_a_gpu_whose_last_slice_job_is_refused_takes_a_whole_gpu_job_again():
    s = SlurmState(cluster())
    req = slice_req("2g.10gb")
    got = s.allocate(req, 0)
    assert s.usable_any.tolist() == [0]  # a GPU with shard jobs takes no gpu job
    s.release_shared(req, 0, got)
    assert s.usable_any.tolist() == [1] and s.sh_used.tolist() == [[0]]
    assert s.choose_node(SlurmRequest(("p",), 1, 0, "gpu", "", 1)) == 0


@pytest.mark.parametrize("flags, second", [(frozenset(), 0), (frozenset({LL_SHARED_GRES}), 1)])
def test_slurm_picks_the_gpu_first_fit_or_least_loaded(flags, second):
    policy, placed = run([slice_req("1g.5gb"), slice_req("1g.5gb")], cluster(gpus=2, flags=flags))
    assert placed == [True, True]
    assert len(policy.slices.on[(0, second)]) == (2 if second == 0 else 1)


def test_carrier_weight_names_the_allowed_profiles():
    with pytest.raises(KeyError, match=r"4g.20gb is not a per-job profile .*1g.5gb, 2g.10gb, 3g.20gb"):
        Carrier(MODEL, THREE, 15).weight("4g.20gb")


def test_slices_count_refusals_and_release():
    c, slices = Carrier(MODEL, (("7g.40gb", 15),), 15), Slices()
    first = slices.place(c, "g", "7g.40gb")
    assert first == ("7g.40gb", 0) and slices.place(c, "g", "7g.40gb") is None and slices.refused == 1
    slices.release("g", first)
    assert slices.place(c, "g", "7g.40gb") == ("7g.40gb", 0)
