"""bench/workloads.py: new workloads of the paper's family from the production trace, by the published variants'
rules (sharing, multi, cpu, typed), each target hit within TOLERANCE."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.workloads import (
    TOLERANCE,
    Mix,
    family,
    generate,
    kind,
    main,
    stats,
    trace_pods,
    typed_pods,
    write_pod_list,
)
from slurm_gpushare.sim.cluster import Pod
from slurm_gpushare.sim.paper.workloads import load_workload
from slurm_gpushare.sim.trace import load_pods

TRACE = trace_pods()  # read once for the module
TYPED = typed_pods()


def assert_unique_names(pods):
    names = [p.name for p in pods]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "mix, field",
    [
        (Mix(sharing=0.6), "sharing"),
        (Mix(sharing=1.0), "sharing"),
        (Mix(sharing=0.25), "sharing"),
        (Mix(multi=0.35), "multi"),
        (Mix(typed=0.2), "typed"),
        (Mix(cpu=0.05), "cpu"),
        (Mix(cpu=0.4), "cpu"),
    ],
)
def test_each_rule_alone_hits_its_target_and_leaves_the_rest_of_the_trace(mix, field):
    pods = generate(mix, seed=7)
    s, t = stats(pods), stats(TRACE)
    assert abs(s[field] - getattr(mix, field)) <= TOLERANCE
    assert_unique_names(pods)
    if field == "sharing":  # pod count and CPU-only pods kept, GPU pods redrawn
        assert (s["pods"], s["cpu_only"], s["cpu_only_cpus"]) == (t["pods"], t["cpu_only"], t["cpu_only_cpus"])
    if field == "multi":  # every original pod kept, multi-GPU pods appended
        assert set(TRACE) <= set(pods)
        assert all(kind(p) == "multi" and p.name.startswith("gen-pod-") for p in pods[len(TRACE) :])
    if field == "cpu":  # GPU pods kept, CPU-only pods redrawn
        assert [p for p in pods if p.num_gpu] == [p for p in TRACE if p.num_gpu]
    if field == "typed":  # the same pods, some constrained with the trace's own strings
        assert [p.name for p in pods] == [p.name for p in TRACE]
        specs = {p.gpu_spec for p in TYPED}
        assert {p.gpu_spec for p in pods if p.gpu_spec} <= specs
        assert all(p.num_gpu for p in pods if p.gpu_spec)


def test_a_mix_of_all_four_hits_every_target_together():
    mix = Mix(sharing=0.55, multi=0.3, typed=0.25, cpu=0.1)
    s = stats(generate(mix, seed=3))
    for field in ("sharing", "multi", "typed", "cpu"):
        assert abs(s[field] - getattr(mix, field)) <= TOLERANCE, field
    # sharing + multi = 1: no whole one-GPU pods, both shares held
    s = stats(generate(Mix(sharing=0.6, multi=0.4), seed=3))
    assert s["whole_pods"] == 0 and abs(s["sharing"] - 0.6) <= TOLERANCE and abs(s["multi"] - 0.4) <= TOLERANCE
    # a multi target below what the sharing draw gives: multi-GPU pods removed
    s = stats(generate(Mix(sharing=0.2, multi=0.0), seed=3))
    assert s["multi_pods"] == 0 and abs(s["sharing"] - 0.2) <= TOLERANCE


def test_drawn_pods_are_the_trace_pods_with_new_names_and_their_qos():
    pods = generate(Mix(sharing=0.8, cpu=0.3), seed=5)
    resources = {(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.qos) for p in TRACE}
    new = [p for p in pods if p.name.startswith("gen-pod-")]
    assert new and all((p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.qos) in resources for p in new)
    assert_unique_names(pods)
    assert all(isinstance(p, Pod) and p.gpu_spec == "" for p in pods)


def test_a_seed_gives_the_same_workload_and_another_seed_another():
    mix = Mix(sharing=0.5, multi=0.2, typed=0.1, cpu=0.2)
    assert generate(mix, 11) == generate(mix, 11)
    assert generate(mix, 11) != generate(mix, 12)
    assert generate(Mix(), 11) == TRACE  # nothing set: the trace as it is


@pytest.mark.parametrize(
    "values, field",
    [
        ({"sharing": 0.0}, "sharing"),
        ({"sharing": 1.2}, "sharing"),
        ({"multi": 1.0}, "multi"),
        ({"multi": -0.1}, "multi"),
        ({"typed": 1.5}, "typed"),
        ({"cpu": 2.5}, "cpu"),
        ({"cpu": float("nan")}, "cpu"),
        ({"sharing": "0.5"}, "sharing"),
        ({"sharing": 0.7, "multi": 0.4}, r"sharing \+ Mix\.multi"),
    ],
)
def test_a_share_out_of_range_raises_naming_the_field_and_the_range(values, field):
    with pytest.raises(ValueError, match=rf"Mix\.{field}") as e:
        Mix(**values)
    assert "accepted" in str(e.value)


def test_an_unknown_field_raises_naming_it():
    with pytest.raises(ValueError, match="unknown field 'gpus'.*accepted: sharing, multi, typed, cpu"):
        Mix.parse("sharing=0.5,gpus=0.2")
    with pytest.raises(TypeError, match="gpus"):
        Mix(gpus=0.2)
    assert Mix.parse("sharing=0.6, multi=0.3") == Mix(sharing=0.6, multi=0.3)
    with pytest.raises(ValueError, match="Mix.cpu"):
        Mix.parse("cpu=lots")
    assert Mix(sharing=0.63, multi=0.31).text() == "sharing 0.63, multi 0.31"
    assert Mix().text() == "as the trace"


def test_a_rule_the_base_cannot_follow_raises_naming_the_field():
    cpu_only = (Pod("a", 1000, 10, 0, 0), Pod("b", 2000, 10, 0, 0))
    whole = (Pod("w", 1000, 10, 1, 1000),) + cpu_only
    with pytest.raises(ValueError, match="Mix.sharing"):
        generate(Mix(sharing=0.5), 1, base=whole)
    with pytest.raises(ValueError, match="Mix.multi"):
        generate(Mix(multi=0.5), 1, base=whole)
    with pytest.raises(ValueError, match="Mix.typed"):
        generate(Mix(typed=0.5), 1, base=whole, typed_from=cpu_only)
    with pytest.raises(ValueError, match="Mix.cpu"):
        generate(Mix(cpu=0.5), 1, base=whole[:1], cluster_cpus=10)


def test_a_small_base_and_cluster_are_followed_too():
    base = (
        Pod("s", 1000, 10, 1, 500, "BE"),
        Pod("w", 1000, 10, 1, 1000, "LS"),
        Pod("m", 4000, 10, 4, 1000, "LS"),
        Pod("c", 2000, 10, 0, 0, "BE"),
    )
    pods = generate(Mix(cpu=0.5), 1, base=base, cluster_cpus=200)
    assert stats(pods, cluster_cpus=200)["cpu"] == pytest.approx(0.5, abs=TOLERANCE)


def test_a_written_pod_list_reads_back_the_same(tmp_path):
    pods = generate(Mix(sharing=0.7, multi=0.2, typed=0.3, cpu=0.1), seed=2)
    assert any(p.gpu_spec for p in pods) and any(p.qos for p in pods)
    for name in ("openb_pod_list_x.csv", "openb_pod_list_y.csv.gz"):
        assert load_pods(write_pod_list(pods, tmp_path / name)) == pods


def test_the_family_is_deterministic_and_mixes_rules():
    mixes = family(4, count=12)
    assert mixes == family(4, count=12) and mixes != family(5, count=12)
    assert len(mixes) == 12 and len({n for n, _ in mixes}) == 12
    assert [n for n, _ in mixes][:2] == ["gen4-00", "gen4-01"]
    assert all(1 <= m.rules() <= 4 for _, m in mixes)
    assert sum(m.rules() >= 2 for _, m in mixes) >= 4
    for _, m in mixes:
        assert m.sharing is None or 0.2 <= m.sharing <= 1.0
        assert m.multi is None or 0.05 <= m.multi <= 0.5
        assert m.typed is None or 0.05 <= m.typed <= 0.4
        assert m.cpu is None or 0.03 <= m.cpu <= 0.45
    for count in (1, 2, 3, 10):
        got = family(9, count)
        assert len(got) == count and sum(m.rules() >= 2 for _, m in got) * 3 >= count
    assert family(4, count=3) == mixes[:3]  # mix i depends on (seed, i) only
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="count"):
            family(1, bad)


@pytest.mark.parametrize(
    "workload, mix",
    [
        ("gpushare60", Mix(sharing=0.6)),
        ("gpushare100", Mix(sharing=1.0)),
        ("multigpu30", Mix(multi=0.3)),
        ("cpu200", Mix(cpu=0.29)),
        ("gpuspec25", Mix(typed=0.26)),
    ],
)
def test_the_rules_reproduce_the_published_variants(workload, mix):
    s, pub = stats(generate(mix, seed=42)), stats(load_workload(workload))
    for field in ("sharing", "multi", "typed", "cpu"):
        assert s[field] == pytest.approx(pub[field], abs=0.015), field
    for field in ("pods", "cpu_only", "sharing_pods", "whole_pods", "multi_pods"):  # counts: as the draws fall
        assert s[field] == pytest.approx(pub[field], rel=0.1, abs=10), field
    if workload.startswith("gpushare"):
        assert s["pods"] == pub["pods"] == 8152
    if workload.startswith("gpuspec"):  # the constraints the trace puts on each kind of pod
        typed = Counter(kind(p) for p in generate(mix, seed=42) if p.gpu_spec)
        assert set(typed) == {"sharing", "whole", "multi"}


def test_the_cli_prints_a_line_per_workload_and_writes_them(tmp_path, capsys):
    main(["--seed", "3", "--count", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "gen3-00" in out and "gen3-01" in out
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["openb_pod_list_gen3-00.csv", "openb_pod_list_gen3-01.csv"]
    main(["--stats", "gpushare60"])
    assert "sharing 0.600" in capsys.readouterr().out
