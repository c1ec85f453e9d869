"""The planner's choices on small hand-checked cases: MIG layouts with a known best, MPS pools, routing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.errors import PolicyError
from slurm_gpushare.hardware import check_layout, get_model
from slurm_gpushare.hardware.packing import covering, pack
from slurm_gpushare.planner.demand import Demand, RequestClass
from slurm_gpushare.planner.estimates import slices_needed
from slurm_gpushare.planner.knobs import Knobs, default_candidates
from slurm_gpushare.planner.plan import plan
from slurm_gpushare.policy import build_site
from slurm_gpushare.render import render_all

A100 = get_model("A100-SXM4-40GB")


def demand(*rows) -> Demand:
    """rows: (num_gpu, gpu_milli, cpus, jobs[, qos])."""
    counts = {}
    for row in rows:
        gpus, milli, cpus, n, *qos = row
        counts[RequestClass(gpus, milli if gpus else 0, cpus, 4096, qos[0] if qos else "")] = n
    return Demand("test", counts)


def cluster(*groups) -> dict:
    """groups: (name, nodes, model, gpus, cpus)."""
    return {
        "version": 1,
        "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
        "node_groups": [
            {"name": name, "nodes": nodes, "gpu": {"model": model, "count": gpus}, "cpus": cpus, "memory_mb": 512000}
            for name, nodes, model, gpus, cpus in groups
        ],
        "tiers": [{"name": "main", "node_groups": [g[0] for g in groups], "default": True}],
    }


# ---- MIG: which slice covers a share, and layouts with a known best ----


@pytest.mark.parametrize(
    "milli, profile",
    [
        (50, "1g.5gb"),
        (140, "1g.5gb"),
        (142, "1g.10gb"),
        (150, "1g.10gb"),
        (250, "1g.10gb"),
        (280, "2g.10gb"),
        (470, "3g.20gb"),
        (500, "3g.20gb"),
        (550, "4g.20gb"),
        (580, "7g.40gb"),
        (1000, "7g.40gb"),
    ],
)
def test_covering_slice_is_the_smallest_billed_share_at_least_the_request(milli, profile):
    assert covering(A100, milli) == profile


def test_four_3g_and_four_1g10_fit_three_gpus_the_known_best():
    # 4 x 3g.20gb need 16 memory slices (two GPUs: at most 2 per GPU); 4 x 1g.10gb need 8 (one GPU)
    layouts = pack(A100, Counter({"3g.20gb": 4, "1g.10gb": 4}))
    assert sorted(layouts) == sorted([("3g.20gb", "3g.20gb"), ("3g.20gb", "3g.20gb"), ("1g.10gb",) * 4])


def test_4g_pairs_with_3g():
    assert pack(A100, Counter({"4g.20gb": 2, "3g.20gb": 2})) == [("4g.20gb", "3g.20gb")] * 2


def test_every_packed_layout_is_valid_and_full():
    need = Counter({"7g.40gb": 2, "3g.20gb": 5, "2g.10gb": 3, "1g.10gb": 3, "1g.5gb": 2})
    layouts = pack(A100, need)
    got = Counter(p for lay in layouts for p in lay)
    assert all(got[p] >= n for p, n in need.items())
    for lay in layouts:
        assert check_layout(A100, list(lay)) == []
        # full: not even the smallest slice fits any more
        assert check_layout(A100, [*lay, "1g.5gb"]) != []


def test_fill_packing_uses_every_compute_slice_where_greedy_leaves_one():
    need = Counter({"3g.20gb": 2, "2g.10gb": 4})
    # greedy: 3g+3g (6 of 7 compute slices), then the 2g.10gb on a GPU of their own: 3 GPUs
    assert pack(A100, need) == [
        ("3g.20gb", "3g.20gb"),
        ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"),
        ("2g.10gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"),
    ]
    # fill: each 3g.20gb with two 2g.10gb, 7 of 7 compute and 8 of 8 memory slices: the known best, 2 GPUs
    assert pack(A100, need, fill=True) == [("3g.20gb", "2g.10gb", "2g.10gb")] * 2
    # with nothing to mix in, fill packs as greedy does (the memory-bound best)
    assert pack(A100, Counter({"3g.20gb": 4, "1g.10gb": 4}), fill=True) == pack(
        A100, Counter({"3g.20gb": 4, "1g.10gb": 4})
    )


def test_allowed_types_bound_rounding_and_top_up():
    allowed = ("1g.5gb", "2g.10gb", "3g.20gb")
    assert covering(A100, 200) == "1g.10gb"
    assert covering(A100, 200, allowed) == "2g.10gb"  # no 1g.10gb offered: the next covering type
    assert covering(A100, 550, allowed) == "7g.40gb"  # no 4g.20gb: only the whole-GPU slice covers it
    layouts = pack(A100, Counter({"3g.20gb": 3}), allowed, fill=True)
    assert {p for lay in layouts for p in lay} <= set(allowed)  # topped up with 1g.5gb, never 1g.10gb
    assert all(check_layout(A100, list(lay)) == [] for lay in layouts)


def test_planner_held_to_slice_types_rounds_to_them():
    base = cluster(("a", "a[1-4]", "A100-SXM4-40GB", 2, 64))
    d = demand((1, 470, 4, 4), (1, 200, 4, 4), (1, 1000, 8, 2))
    free = plan(base, d, mig_fractions=True)
    held = plan(base, d, mig_fractions=True, mig_types=["1g.5gb", "2g.10gb", "3g.20gb"])
    types = lambda r: {p for g in r.site.groups for s in g.gpus if s.mode == "mig" for p in s.layout}  # noqa: E731
    assert "1g.10gb" in types(free)
    assert types(held) <= {"1g.5gb", "2g.10gb", "3g.20gb"} and "2g.10gb" in types(held)
    assert held.knobs.mig_fill and held.knobs.mig_types == ("1g.5gb", "2g.10gb", "3g.20gb")
    with pytest.raises(ValueError, match="9g.80gb not offered.*accepted: .*3g.20gb"):
        plan(base, d, mig_fractions=True, mig_types=["9g.80gb"])


def test_slices_needed_gives_big_shares_the_whole_gpu_slice():
    need, uncovered = slices_needed(A100, {470: 3, 810: 2, 230: 1})
    assert need == Counter({"3g.20gb": 3, "7g.40gb": 2, "1g.10gb": 1}) and uncovered == 0
    assert slices_needed(get_model("L40S"), {470: 1}) == (Counter(), 1)


def test_planner_mig_layouts_for_isolated_class():
    base = cluster(("a", "a[1-2]", "A100-SXM4-40GB", 2, 64))
    d = demand((1, 470, 4, 2, "LS"), (1, 230, 4, 2, "LS"), (1, 470, 4, 4, "BE"), (1, 1000, 8, 1))
    result = plan(base, d, isolate_qos=["LS"])
    site = result.site
    mig = [s for g in site.groups for s in g.gpus if s.mode == "mig" for _ in g.nodes]
    # LS: 2 x 3g.20gb + 2 x 1g.10gb (x1.03 headroom, rounded up: 3 + 3) -> 3g,3g | 3g,1g.10gb,1g.10gb... on 2 GPUs
    assert 1 <= len(mig) <= 2
    assert all(check_layout(A100, list(s.layout)) == [] for s in mig)
    routes = result.policy["submission"]["routes"]
    # every LS share has a slice (up to 7g.40gb), so the class stays on MIG
    assert routes[0] == {"match": {"gres": "mps", "qos": ["LS"]}, "tiers": ["mig"], "round_to": "mig"}
    assert any(s.mode == "mps" for g in site.groups for s in g.gpus)


# ---- MPS pools, CPU-rich nodes, weights, routes ----


def s1_base() -> dict:
    return cluster(("big", "b[1-3]", "L40S", 8, 96), ("rich", "r[1-2]", "L40S", 2, 104))


def s1_demand() -> Demand:
    # 16 x 500 milli (8 GPUs' worth), 6 whole GPUs at 8 CPUs, 2 at 40 CPUs, 10 CPU-only jobs at 8 CPUs
    return demand((1, 500, 6, 16), (1, 1000, 8, 6), (1, 1000, 40, 2), (0, 0, 8, 10))


def test_s1_plan_pools_modes_and_routes():
    result = plan(s1_base(), s1_demand())
    site = result.site
    # every GPU may be shared: MPS with 2 units (every share is a multiple of 500 milli)
    assert {(s.mode, s.units) for g in site.groups for s in g.gpus} == {("mps", 2)}
    tiers = {t.name: [g.name for g in t.groups] for t in site.tiers}
    # the shares pack into 8 GPUs: one 8-GPU node is the fractional pool (x1.03 would want 9: two nodes)
    assert tiers["frac"] in (["big-frac"],)
    assert tiers["cpu"] == ["rich"]
    assert tiers["gpu"] == ["big"]
    frac = next(g for g in site.groups if g.name == "big-frac")
    assert len(frac.nodes) == 2
    assert [r["match"] for r in result.policy["submission"]["routes"]] == [
        {"gres": "mps"},
        {"gres": "none"},
        {"gres": "gpu", "max_gpus": 1, "min_cpus": 40},
        {"gres": "gpu"},
    ]
    # the CPU-rich pool (4 GPUs, 208 CPUs) keeps 128 CPUs after the CPU-only jobs: enough for the two
    # 40-CPU jobs, not for the six 8-CPU ones too (6 GPUs > the 2 left), so the threshold is 39
    # weights: fewer GPUs per node first in the whole-GPU pools
    weights = {g["name"]: g["weight"] for g in result.policy["node_groups"]}
    assert weights["rich"] < weights["big"]


def test_s1_plan_renders_and_reports():
    result = plan(s1_base(), s1_demand())
    files = render_all(result.site)
    assert any("Weight=" in text for text in files.values())
    text = "\n".join(result.report)
    for fragment in (
        "demand: 34 jobs",
        "supply (base policy)",
        "planned layout",
        "tier frac",
        "fragments",
        "route gres=mps -> frac,gpu,cpu",
        "CPU-rich nodes (rich",
    ):
        assert fragment in text, fragment


def test_without_fractions_gpus_stay_exclusive():
    result = plan(s1_base(), demand((1, 1000, 8, 10), (0, 0, 4, 3)))
    assert {s.mode for g in result.site.groups for s in g.gpus} == {"exclusive"}
    assert "frac" not in {t.name for t in result.site.tiers}


def test_evaluate_keeps_the_best_candidate():
    seen = []

    def score(raw):  # more nodes in the fractional pool score higher
        seen.append(raw)
        site = build_site(raw, "c")
        return float(sum(len(g.nodes) for t in site.tiers if t.name == "frac" for g in t.groups))

    knobs = [Knobs(), Knobs(frac_factor=2.0), Knobs(frac_factor=0.5)]
    result = plan(s1_base(), s1_demand(), evaluate=score, candidates=knobs)
    assert len(seen) == 4 and seen[0] == s1_base()  # the policy as given is scored first
    assert result.knobs == Knobs(frac_factor=2.0)
    assert result.score == 3.0  # all three 8-GPU nodes
    assert "candidates (packing score" in "\n".join(result.report)


def test_budget_scores_the_first_candidate_at_least():
    result = plan(
        s1_base(), s1_demand(), evaluate=lambda raw: 1.0, candidates=[Knobs(), Knobs(frac_factor=2)], budget_s=0
    )
    assert len(result.tried) == 1


def test_empty_demand_is_refused():
    with pytest.raises(ValueError, match="no jobs"):
        plan(s1_base(), Demand("x", {}))


def test_base_policy_is_validated_first():
    base = s1_base()
    base["node_groups"][0]["gpu"]["model"] = "nope"
    with pytest.raises(PolicyError) as info:
        plan(base, s1_demand())
    assert "node_groups[0].gpu.model: unknown GPU model 'nope'" in info.value.report()


def test_candidates_giving_the_same_policy_are_scored_once():
    calls = []
    # without MIG, cpu_jobs 'auto' is 'rich': the same policy as Knobs()
    plan(
        s1_base(),
        s1_demand(),
        evaluate=lambda raw: calls.append(raw) or 1.0,
        candidates=[Knobs(), Knobs(cpu_jobs="rich"), Knobs(frac_factor=2.0)],
    )
    assert len(calls) == 3  # the policy as given, then two distinct candidates


def test_isolation_needs_mig_capable_gpus():
    with pytest.raises(ValueError, match=r"no GPU of the policy supports MIG \(L40S\)"):
        plan(s1_base(), s1_demand(), isolate_qos=["LS"])


# ---- the example policies: whatever the planner writes validates and renders ----

ETC = Path(__file__).resolve().parents[3] / "etc"
MIXED_DEMANDS = {
    # shares of every size, whole GPUs, pairs, CPU-only jobs
    "mixed": demand((1, 150, 1, 6), (1, 470, 2, 5), (1, 810, 1, 4), (1, 1000, 2, 8), (2, 1000, 4, 2), (0, 0, 4, 4)),
    "shares": demand((1, 230, 1, 10), (1, 500, 2, 10), (0, 0, 2, 3)),
    "whole": demand((1, 1000, 2, 10), (0, 0, 1, 2)),
}


@pytest.mark.parametrize("policy", ["small-lab.yaml", "mixed-production.yaml", "mps-inference.yaml"])
@pytest.mark.parametrize("which", sorted(MIXED_DEMANDS))
@pytest.mark.parametrize("knobs", [Knobs(), Knobs(frac_factor=0.95, frac_weights="node"), Knobs(cpu_jobs="rich")])
def test_example_policies_plan_into_valid_rendered_policies(policy, which, knobs):
    """Heterogeneous sites (several models and billing weights, MIG/shard/mps/exclusive, aliases): the plan
    validates (``plan`` runs ``build_site``) and renders every file."""
    base = yaml.safe_load((ETC / policy).read_text())
    result = plan(base, MIXED_DEMANDS[which], candidates=[knobs])
    files = render_all(result.site)
    assert files and all(text.strip() for text in files.values())
    build_site(result.policy, "planned again")  # the mapping the CLI writes out validates on its own


@pytest.mark.parametrize("policy", ["small-lab.yaml", "mixed-production.yaml"])
@pytest.mark.parametrize("which", sorted(MIXED_DEMANDS))
@pytest.mark.parametrize("mig", [{"mig_fractions": True}, {"isolate_qos": ["LS"]}])
def test_example_policies_plan_mig_into_valid_rendered_policies(policy, which, mig):
    """Slices on sites with two MIG-capable models (the small lab's A100 and A30; mixed production's MIG GPUs
    and a whole-GPU slice where the packed layouts run out): still valid and rendered."""
    d = MIXED_DEMANDS[which]
    d = Demand(
        d.source,
        {
            RequestClass(c.num_gpu, c.gpu_milli, c.cpus, c.memory_mib, "LS" if i % 2 else "BE"): n
            for i, (c, n) in enumerate(d.counts.items())
        },
    )
    result = plan(yaml.safe_load((ETC / policy).read_text()), d, **mig)
    assert render_all(result.site)
    build_site(result.policy, "planned again")
    for g in result.site.groups:  # every MIG layout is one of its own model's
        for s in g.gpus:
            if s.mode == "mig":
                assert check_layout(s.model, s.layout) == [], (g.name, s.layout)


def test_mig_pool_is_one_models_and_says_so():
    base = yaml.safe_load((ETC / "small-lab.yaml").read_text())
    result = plan(base, demand((1, 140, 1, 12), (1, 1000, 2, 2)), mig_fractions=True)
    migs = {g.model.name for g in result.site.groups for s in g.gpus if s.mode == "mig"}
    assert migs == {"A100-SXM4-40GB"}
    assert any("MIG pool on A100-SXM4-40GB only" in line and "not on A30-24GB" in line for line in result.report)


def lab_mps_everywhere() -> tuple[dict, Demand]:
    """The small lab with mostly shares: every GPU goes to the MPS pool (the models weigh 100 and 50)."""
    base = yaml.safe_load((ETC / "small-lab.yaml").read_text())
    return base, demand((1, 470, 2, 20), (1, 810, 1, 10), (1, 1000, 2, 1), (0, 0, 4, 1))


def test_mps_gpus_of_different_billing_weights_get_separate_tiers():
    base, d = lab_mps_everywhere()
    result = plan(base, d)
    weights = {"L40S": 100, "A100-SXM4-40GB": 100, "A30-24GB": 50}
    for tier in result.site.tiers:
        per_unit = {weights[g.model.name] / s.units for g in tier.groups for s in g.gpus if s.mode == "mps"}
        assert len(per_unit) <= 1, (tier.name, per_unit)
    tiers = {t.name: [g.name for g in t.groups] for t in result.site.tiers}
    assert tiers["frac-2"] == ["lab-mps-frac"]
    # the split tier follows its tier on every route that lists it
    for r in result.policy["submission"]["routes"]:
        if "frac" in r["tiers"]:
            assert r["tiers"][r["tiers"].index("frac") + 1] == "frac-2"
    assert any("tier 'frac' split by the billing weight of one mps unit" in line for line in result.report)


def test_alias_to_a_vanished_mig_slice_is_remapped_with_a_report_line():
    base, d = lab_mps_everywhere()
    result = plan(base, d)
    assert result.policy["submission"]["aliases"] == {"small": "mps:15", "half": "mps:50"}
    assert any(
        "alias 'small': gpu:a100_40g_1g.5gb no longer exists" in line and "remapped to mps:15" in line
        for line in result.report
    )


def test_alias_with_nothing_left_to_map_to_is_dropped():
    base = yaml.safe_load((ETC / "small-lab.yaml").read_text())
    base["submission"]["aliases"] = {"small": "gpu:a100_40g_1g.5gb", "half": "mps:50", "slice": "shard"}
    result = plan(base, demand((1, 1000, 2, 10)))  # whole GPUs only: every GPU exclusive
    assert result.policy["submission"]["aliases"] == {"small": "gpu:a100_40g"}
    text = "\n".join(result.report)
    assert (
        "alias 'half': mps:50 no longer exists in the planned layout and nothing planned covers 0.50 of a GPU; dropped"
        in text
    )
    assert "alias 'slice': shard no longer exists" in text and "dropped" in text


def lean_base() -> dict:
    # 'thin' has 8 CPUs per GPU, under what the GPU jobs ask on average; 'big' has 12
    return cluster(("big", "b[1-4]", "L40S", 8, 96), ("thin", "t[1-2]", "L40S", 4, 32))


def test_cpu_poor_nodes_form_a_lean_pool_for_light_single_gpu_jobs():
    d = demand((1, 1000, 4, 10), (1, 1000, 16, 20), (2, 1000, 24, 2))
    result = plan(lean_base(), d)
    tiers = {t.name: [g.name for g in t.groups] for t in result.site.tiers}
    assert tiers["lean"] == ["thin"] and tiers["gpu"] == ["big"]
    routes = [(r["match"], r["tiers"]) for r in result.policy["submission"]["routes"]]
    # heavier single-GPU jobs than 8 CPUs reach 'lean' only when 'gpu' is full; the light ones start there;
    # multi-GPU jobs keep to 'gpu' first
    assert routes == [
        ({"gres": "gpu", "max_gpus": 1, "min_cpus": 9}, ["gpu", "lean"]),
        ({"gres": "gpu", "max_gpus": 1}, ["lean", "gpu"]),
        ({"gres": "gpu"}, ["gpu", "lean"]),
    ]
    assert "pool 'lean' takes single-GPU jobs asking at most 8 CPUs first" in "\n".join(result.report)


def test_no_lean_pool_when_most_gpus_are_cpu_poor_or_when_turned_off():
    d = demand((1, 1000, 4, 10), (1, 1000, 16, 20))
    poor = cluster(("big", "b[1-2]", "L40S", 8, 64), ("thin", "t[1-2]", "L40S", 4, 32))  # every GPU 8 CPUs
    assert "lean" not in {t.name for t in plan(poor, d).site.tiers}
    assert "lean" not in {t.name for t in plan(lean_base(), d, candidates=[Knobs(lean=False)]).site.tiers}


def test_with_a_mig_pool_cpu_only_jobs_go_to_the_cpu_rich_pool_first_when_it_can_hold_a_third_of_them():
    # LS shares get MIG slices on CPU-rich nodes; the CPU-rich nodes left form pool 'cpu'
    base = cluster(("big", "b[1-6]", "A100-SXM4-40GB", 8, 96), ("rich", "r[1-8]", "A100-SXM4-40GB", 2, 104))

    def cpu_route(cpu_jobs: int) -> list[str]:
        d = demand(
            (1, 470, 12, 8, "LS"), (1, 470, 4, 10, "BE"), (1, 1000, 12, 30), (1, 1000, 30, 4), (0, 0, 16, cpu_jobs)
        )
        result = plan(base, d, isolate_qos=["LS"])
        assert {t["name"] for t in result.policy["tiers"]} >= {"mig", "cpu"}
        return next(r["tiers"] for r in result.policy["submission"]["routes"] if r["match"] == {"gres": "none"})

    # few CPU-only jobs: the CPU-rich pool's spare CPUs hold them, it goes first (MIG nodes keep CPUs for slices)
    assert cpu_route(4)[:2] == ["cpu", "mig"]
    # many: the pools by the CPUs their GPU jobs leave, the MIG pool (most left) first
    assert cpu_route(40)[:2] == ["mig", "cpu"]


def test_a_pools_gpu_jobs_use_its_cpus_only_as_far_as_its_gpus_hold_them():
    from slurm_gpushare.planner.estimates import spare_cpus

    d = demand((1, 1000, 40, 10), (1, 1000, 4, 10))  # 10 heavy jobs (pool 'cpu'), 10 light ones ('gpu')
    cpus, gpus = {"cpu": 500, "gpu": 400}, {"cpu": 2, "gpu": 40}
    # without GPU counts: the heavy jobs' 400 CPUs all count on 'cpu', which seems to have 100 left
    assert dict(spare_cpus(cpus, d, 1.0, {}, 8, True, "spare")) == {"cpu": 100, "gpu": 360}
    # 'cpu' holds 2 of the 10 heavy jobs (80 CPUs); the other 320 CPUs spill to 'gpu'
    assert dict(spare_cpus(cpus, d, 1.0, {}, 8, True, "spare", gpus)) == {"cpu": 420, "gpu": 40}


def test_pack_estimate_is_the_same_first_fit_with_or_without_numpy():
    import random

    from slurm_gpushare.planner.demand import _first_fit, pack_estimate

    rng = random.Random(3)
    for _ in range(100):
        shares = {rng.randint(1, 999): rng.randint(0, 25) for _ in range(rng.randint(1, 6))}
        items = [m for m, n in shares.items() for _ in range(n)]
        random.Random(1).shuffle(items)
        assert pack_estimate(shares) == _first_fit(items)
    assert _first_fit([600, 600, 400, 400]) == 2


def test_compact_slice_types_one_per_compute_size_least_memory():
    from slurm_gpushare.hardware.packing import compact_types

    assert compact_types(A100) == ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    base = cluster(("a", "a[1-4]", "A100-SXM4-40GB", 2, 64))
    d = demand((1, 470, 4, 4), (1, 200, 4, 4), (1, 550, 4, 2), (1, 1000, 8, 2))
    held = plan(base, d, mig_fractions=True, mig_types=["compact"])
    types = {p for g in held.site.groups for s in g.gpus if s.mode == "mig" for p in s.layout}
    assert "1g.10gb" not in types and {"2g.10gb", "3g.20gb", "4g.20gb"} <= types
    assert held.knobs.mig_compact
    assert any("one per compute size" in line for line in held.report)


def test_isolated_classes_keep_at_least_95_percent_of_their_slices():
    from slurm_gpushare.planner.knobs import default_candidates

    assert min(k.mig_factor for k in default_candidates()) == 0.9
    assert min(k.mig_factor for k in default_candidates(isolating=True)) == 0.95


def test_cpu_heavy_shares_start_in_the_cpu_rich_pool_and_keep_the_shared_nodes_cpus():
    # 'big' has 12 CPUs per GPU; shares asking 16 CPUs would take a big node's CPUs with few of its GPUs
    from slurm_gpushare.planner.evaluate import evaluator

    base = cluster(("big", "b[1-3]", "L40S", 8, 96), ("rich", "r[1-4]", "L40S", 2, 104))
    d = demand((1, 500, 16, 12), (1, 500, 2, 28), (0, 0, 8, 6))
    score = evaluator(d)
    plain = plan(base, d, evaluate=score, candidates=[Knobs()])
    heavy = plan(base, d, evaluate=score, candidates=[Knobs(frac_heavy=4)])
    routes = [(r["match"], r["tiers"]) for r in heavy.policy["submission"]["routes"]]
    assert routes[:2] == [({"gres": "mps", "min_cpus": 5}, ["cpu", "frac"]), ({"gres": "mps"}, ["frac", "cpu"])]
    assert "fractional jobs asking more than 4 CPUs start in pool 'cpu'" in "\n".join(heavy.report)
    # Slurm's placement on the first sampled order: every share placed, against 90.6 % without the route
    assert dict(heavy.tried)[Knobs(frac_heavy=4)] == 100.0 and dict(plain.tried)[Knobs()] < 91
    assert heavy.score == 100.0 and plain.score < heavy.score  # and on the race's orders
    assert (
        Knobs(frac_heavy=4) in default_candidates() and Knobs(frac_heavy=2, cpu_order=("cpu",)) in default_candidates()
    )


def test_cpu_only_jobs_held_to_the_cpu_rich_pool_say_so():
    base = cluster(("big", "b[1-3]", "L40S", 8, 96), ("rich", "r[1-4]", "L40S", 2, 104))
    d = demand((1, 500, 16, 12), (1, 500, 2, 28), (0, 0, 8, 6))
    held = plan(base, d, candidates=[Knobs(frac_heavy=2, cpu_order=("cpu",))])
    routes = [(r["match"], r["tiers"]) for r in held.policy["submission"]["routes"]]
    assert ({"gres": "none"}, ["cpu"]) in routes and ({"gres": "mps", "min_cpus": 3}, ["cpu", "frac"]) in routes
    assert "CPU-only jobs start only in pool(s) cpu: when those are full they wait" in "\n".join(held.report)


def test_first_fit_candidates_give_each_mps_node_its_own_weight_in_order():
    """The FIRST_FIT candidates are scored by default; under them Slurm fills the MPS pool node by node (each
    node a lower weight than the next), not by fewest idle CPUs among equal weights."""
    from slurm_gpushare.planner.knobs import FIRST_FIT

    assert set(FIRST_FIT) <= set(default_candidates()) and set(FIRST_FIT) <= set(default_candidates(isolating=True))
    result = plan(
        cluster(("big", "b[1-4]", "L40S", 2, 32)),
        demand((1, 600, 1, 6), (1, 400, 1, 6)),
        candidates=[Knobs(frac_weights="node")],
    )
    frac = [g for g in result.policy["node_groups"] if "frac" in g["name"]]
    assert [g["nodes"] for g in frac] == ["b1", "b2", "b3", "b4"]
    weights = [g["weight"] for g in frac]
    assert weights == sorted(set(weights))


def test_jobs_held_to_the_cpu_rich_model_keep_its_gpus_from_cpu_heavy_jobs():
    """GPUs that only some jobs may use (their gpu_spec names that model alone) are not spare room for the CPU-heavy
    single-GPU jobs: without the held jobs every 16-CPU job fits the CPU-rich pool, with them none is sent there."""
    from slurm_gpushare.planner.estimates import heavy_threshold, supply

    site = build_site(cluster(("big", "b[1-4]", "A100-SXM4-40GB", 8, 96), ("rich", "r[1-4]", "L40S", 2, 104)), "t")
    groups = supply(site)
    rich = {g.index for g in groups if g.name == "rich"}
    free = Demand("t", {RequestClass(1, 1000, 16, 4096): 6, RequestClass(1, 1000, 4, 4096): 20})
    held = Demand("t", {**free.counts, RequestClass(1, 1000, 4, 4096, "", "L40S"): 8})
    assert heavy_threshold(free, groups, rich) == 15  # the six 16-CPU jobs fit the 8 L40S GPUs
    assert held.held_demand({"l40s"}) == (8.0, 32)
    assert heavy_threshold(held, groups, rich) == 16  # the 8 held jobs take every L40S GPU: nobody is sent there
    assert RequestClass(1, 1000, 4, 4096, "", "L40S|A100").held_to({"l40s"}) is False
    assert RequestClass(1, 1000, 4, 4096).held_to({"l40s"}) is False  # no spec: any model


def test_heavy_bound_by_the_bulk_node_shape():
    """``heavy_per_gpu``: jobs asking more than that many times the CPUs per GPU of the shape holding most GPUs
    (here 8 GPUs, 96 CPUs: 12 per GPU) start in the CPU-rich pool."""
    base = cluster(("big", "b[1-4]", "L40S", 8, 96), ("rich", "r[1-4]", "L40S", 2, 104))
    d = demand((1, 1000, 16, 6), (1, 1000, 4, 20), (0, 0, 8, 4))
    for per_gpu, bound in ((1.0, 12), (1.5, 18)):
        routes = plan(base, d, candidates=[Knobs(heavy_per_gpu=per_gpu)]).policy["submission"]["routes"]
        assert {"gres": "gpu", "max_gpus": 1, "min_cpus": bound + 1} in [r["match"] for r in routes]


def test_evaluator_scores_many_side_by_side_as_one_by_one():
    from slurm_gpushare.planner.evaluate import evaluator

    d = s1_demand()
    raws = [s1_base(), *(plan(s1_base(), d, candidates=[k]).policy for k in (Knobs(), Knobs(frac_factor=2.0)))]
    alone, side_by_side = evaluator(d), evaluator(d, workers=3)
    assert side_by_side.many(raws) == [alone(raw) for raw in raws] == alone.many(raws)


def test_forked_map_keeps_order_and_runs_in_process_inside_a_worker():
    """Results come back in the items' order; a pool worker (daemonic, may not fork) maps in its own process."""
    from slurm_gpushare.planner.evaluate import forked_map

    def inner(n):
        return list(forked_map(lambda k: k * n, [1, 2, 3], 2))

    assert list(forked_map(inner, [1, 10], 2)) == [[1, 2, 3], [10, 20, 30]]
    assert list(forked_map(lambda k: -k, [3, 1, 2], 1)) == [-3, -1, -2]


def _key(raw: dict) -> str:
    return json.dumps(raw, sort_keys=True)


class _Scripted:
    """An Evaluator whose scores are a script: per policy name (its JSON names it) and arrival order, the score;
    every ``many`` call is recorded as (order, names scored)."""

    def __init__(self, names: dict, table: dict, check_seeds=(8, 9, 10, 11, 12)):
        from slurm_gpushare.planner.evaluate import Evaluator

        class Scripted(Evaluator):
            def __init__(inner):
                inner.seeds, inner.check_seeds, inner.workers, inner.calls = (7,), tuple(check_seeds), 1, []

            def many(inner, raws, seeds=None):
                (order,) = seeds or inner.seeds
                inner.calls.append((order, [names[_key(r)] for r in raws]))
                return [table[names[_key(r)]][order] for r in raws]

        self.evaluator = Scripted()


def _named(base: dict, d: Demand, knobs: list[Knobs]) -> dict:
    """{policy JSON: name}: 'given' for ``base``, k0, k1, ... for the candidates built from ``knobs``."""
    names = {_key(base): "given"}
    for n, k in enumerate(knobs):
        names.setdefault(_key(plan(base, d, candidates=[k]).policy), f"k{n}")
    return names


def _orders(first: float, *rest: float) -> dict:
    return dict(zip((7, 8, 9, 10, 11, 12), (first, *rest), strict=False))


def test_the_race_corrects_the_first_orders_lucky_winner():
    """k0 wins the first order by luck; on the race's orders k1 is better every time: k1 is chosen, the candidate
    far behind never races, and the report says by how much and how sure."""
    d, base = s1_demand(), s1_base()
    knobs = [Knobs(), Knobs(frac_factor=0.5), Knobs(frac_factor=2.0)]
    names = _named(base, d, knobs)
    assert sorted(names.values()) == ["given", "k0", "k1", "k2"]  # three distinct candidates
    table = {
        "given": _orders(50, 50.1, 49.9, 50, 50.2, 49.8),
        "k0": _orders(90.3, 89.0, 89.1, 88.9, 89.0, 89.05),
        "k1": _orders(90.0, 89.5, 89.55, 89.4, 89.5, 89.6),
        "k2": _orders(70, 71, 69, 70, 70, 70),
    }
    script = _Scripted(names, table)
    result = plan(base, d, evaluate=script.evaluator, candidates=knobs)
    assert result.knobs == Knobs(frac_factor=0.5)
    raced = {n for order, scored in script.evaluator.calls if order != 7 for n in scored}
    assert "k1" in raced and "k0" in raced
    assert dict(result.tried)[Knobs(frac_factor=2.0)] == 70  # each candidate's first-order score in the report
    line = next(x for x in result.report if x.startswith("race over sampled orders 7, 8"))
    assert "over the runner-up (defaults), outside the noise" in line
    assert result.score > result.given_score
    # no check seeds: no race, the first order decides (the lucky one)
    alone = _Scripted(names, table, check_seeds=())
    assert plan(base, d, evaluate=alone.evaluator, candidates=knobs).knobs == Knobs()
    assert {order for order, _ in alone.evaluator.calls} == {7}


def test_the_race_keeps_the_policy_as_given_when_it_wins_on_the_common_orders():
    d, base = s1_demand(), s1_base()
    names = _named(base, d, [Knobs()])
    table = {"given": _orders(90.0, 91.0, 91.2, 90.9, 91.1, 91.0), "k0": _orders(90.05, 89.0, 89.1, 88.8, 89.2, 89)}
    script = _Scripted(names, table)
    result = plan(base, d, evaluate=script.evaluator, candidates=[Knobs()])
    assert result.kept_given and result.policy == base
    assert result.score == result.given_score > 90.0
    assert any("over the runner-up (defaults)" in line for line in result.report)


def test_a_tie_on_every_order_keeps_the_policy_as_given():
    d, base = s1_demand(), s1_base()
    names = _named(base, d, [Knobs()])
    table = {"given": _orders(90, 91, 92, 93, 94, 95), "k0": _orders(90, 91, 92, 93, 94, 95)}
    result = plan(base, d, evaluate=_Scripted(names, table).evaluator, candidates=[Knobs()])
    assert result.kept_given


# ---- per-job MIG: a candidate beside the fixed layouts ----


def per_job_base(hooks: bool = True) -> dict:
    base = cluster(("a", "a[1-4]", "A100-SXM4-40GB", 4, 64), ("b", "b[1-2]", "A100-SXM4-40GB", 4, 64))
    if hooks:
        base["cluster"]["hooks"] = {
            "prolog": "/usr/bin/gpushare-prolog",
            "epilog": "/usr/bin/gpushare-epilog",
            "task_prolog": "/usr/bin/gpushare-task-prolog",
            "job_submit_lua": True,
        }
    return base


def per_job_demand() -> Demand:
    return demand((1, 470, 4, 12), (1, 230, 4, 10), (1, 100, 2, 14), (1, 600, 4, 4), (1, 1000, 8, 6))


def test_per_job_candidate_makes_the_mig_pool_per_job_and_says_so():
    from slurm_gpushare.planner.evaluate import evaluator

    d = per_job_demand()
    result = plan(
        per_job_base(),
        d,
        mig_fractions=True,
        evaluate=evaluator(d, check_seeds=()),
        candidates=[Knobs(mig_per_job=True)],
    )
    per_job = [s for g in result.site.groups for s in g.gpus if s.share.is_per_job_mig]
    assert per_job and {s.model.name for s in per_job} == {"A100-SXM4-40GB"}
    assert not any(s.share.is_mig for g in result.site.groups for s in g.gpus)  # no fixed layout left
    assert all(r.get("round_to") != "mig" for r in result.policy["submission"]["routes"])
    text = "\n".join(result.report)
    assert "MIG per job on the pool's nodes" in text and "--partition=mig --gres=gpu:<slice>:1" in text
    assert "mig per job (1g.5gb=4" in text and "(16 mig per job)" in text
    # the carrier weights tuned on the demand: written where they differ from the exact ones, with both figures
    assert "per-job MIG carrier weights tuned on the demand's slices" in text
    assert "exact weights (1g.5gb=4, 1g.10gb=7" in text and "written as carrier_weights" in text
    entries = [e for g in result.policy["node_groups"] for e in g.get("sharing", []) if e.get("per_job")]
    tuned = entries[0]["carrier_weights"]
    assert all(e["carrier_weights"] == tuned for e in entries)
    assert all(s.share.tuned and s.share.weights == tuple(tuned.values()) for s in per_job)
    assert tuned["1g.5gb"] > 4  # the small slices strand on this demand: raised
    render_all(result.site)  # the planned policy renders


def test_plan_chooses_per_job_mig_when_it_packs_more():
    from slurm_gpushare.planner.evaluate import evaluator

    d = per_job_demand()
    result = plan(per_job_base(), d, mig_fractions=True, evaluate=evaluator(d, check_seeds=()), search=False)
    fixed = max(s for k, s in result.tried if not k.mig_per_job)
    assert result.knobs.mig_per_job and result.score > fixed  # 88.92 against 81.04 on the sampled order


def test_per_job_mig_is_not_offered_without_its_hooks_or_beside_mps():
    from slurm_gpushare.planner.evaluate import evaluator

    d = per_job_demand()
    ev = evaluator(d, check_seeds=())
    no_hooks = plan(per_job_base(hooks=False), d, mig_fractions=True, evaluate=ev, search=False)
    ls = demand((1, 470, 4, 12, "LS"), (1, 230, 4, 10))
    isolated = plan(per_job_base(), ls, isolate_qos=["LS"], evaluate=evaluator(ls, check_seeds=()), search=False)
    assert not any(k.mig_per_job for k, _ in no_hooks.tried + isolated.tried)
