"""Per-job MIG placement (hardware/migplace.py) against a brute-force reading of the catalogue's placement tables.

For every model named in issue 35 (and the catalogue's other MIG models), every
set of instances reachable from an empty GPU is enumerated, and at each one the
legal starts of every profile are compared with the table read directly:
memory-slice sets (not bit masks) that do not meet, per-profile instance limits,
compute slices.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from slurm_gpushare.hardware import get_model, models, place_layout
from slurm_gpushare.hardware.migplace import (
    DEFAULT_RULE,
    FIRST,
    LARGEST_FIRST,
    LEAST_BLOCKING,
    MOST_COMPLETIONS,
    MOST_PLACEMENTS,
    RULES,
    Choice,
    choose,
    completions,
    largest_free_run,
    legal_starts,
    occupancy,
    pick_gpu,
    placeable,
    reachable_layouts,
    surviving_placements,
)

ISSUE_MODELS = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H200-141GB", "A30-24GB")
OTHER_MIG = tuple(m.name for m in models() if m.mig_capable and m.name not in ISSUE_MODELS)
A100 = get_model("A100-SXM4-40GB")
PLAIN = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


def _slices(model, name, start):
    return set(range(start, start + model.profile(name).memory_slices))


def _brute_legal(model, profile, layout):
    """The placement table read directly: starts whose slices no instance holds, within the catalogue's limits."""
    held = set().union(*(_slices(model, n, s) for n, s in layout))
    names = Counter(model.profile(n).name for n, _ in layout)
    compute = sum(model.profile(n).compute_slices for n, _ in layout)
    if names[profile.name] >= profile.max_instances or compute + profile.compute_slices > model.compute_slices:
        return ()
    return tuple(s for s in profile.placements if not held & _slices(model, profile.name, s))


@cache
def _brute_layouts(model_name):
    """Every set of pairwise disjoint (profile, start) pairs of the table within the limits, by include/exclude."""
    model = get_model(model_name)
    pairs = [(p.name, s) for p in model.mig_profiles for s in p.placements]
    out = set()

    def walk(i, chosen):
        if i == len(pairs):
            out.add(tuple(sorted(chosen)))
            return
        walk(i + 1, chosen)
        if pairs[i][1] in _brute_legal(model, model.profile(pairs[i][0]), chosen):
            walk(i + 1, [*chosen, pairs[i]])

    walk(0, [])
    return frozenset(out)


@pytest.mark.parametrize("name", ISSUE_MODELS + OTHER_MIG)
def test_reachable_layouts_are_exactly_the_tables_disjoint_sets(name):
    assert reachable_layouts(get_model(name)) == _brute_layouts(name)


@pytest.mark.parametrize("name", ISSUE_MODELS)
def test_legal_starts_equal_the_table_read_directly_at_every_reachable_layout(name):
    model = get_model(name)
    for layout in reachable_layouts(model):
        for profile in model.mig_profiles:
            starts = legal_starts(model, profile.name, layout)
            assert starts == _brute_legal(model, profile, layout), (layout, profile.name)
            assert placeable(model, profile.name, layout) == bool(starts)
            if starts:  # a legal placement is one the static layout solver also accepts
                assert place_layout(model, [n for n, _ in layout] + [profile.name]) is not None


@pytest.mark.parametrize("name", ISSUE_MODELS)
def test_the_multisets_reached_are_those_the_layout_solver_places(name):
    model = get_model(name)
    reached = {tuple(sorted(n for n, _ in layout)) for layout in reachable_layouts(model)}
    for layout in reached:
        assert place_layout(model, layout) is not None
        for profile in model.mig_profiles:
            grown = tuple(sorted((*layout, profile.name)))
            assert (grown in reached) == (place_layout(model, grown) is not None), grown


def test_the_sheets_table_of_starts_and_sizes():
    table = {p.name: (p.placements, p.memory_slices) for p in A100.mig_profiles}
    assert table["1g.5gb"] == ((0, 1, 2, 3, 4, 5, 6), 1)
    assert table["1g.10gb"] == ((0, 2, 4, 6), 2)
    assert table["2g.10gb"] == ((0, 2, 4), 2)
    assert table["3g.20gb"] == ((0, 4), 4)
    assert table["4g.20gb"] == ((0,), 4)
    assert table["7g.40gb"] == ((0,), 8)
    a30 = {p.name: (p.placements, p.memory_slices) for p in get_model("A30-24GB").mig_profiles}
    assert a30["1g.6gb"] == ((0, 1, 2, 3), 1) and a30["2g.12gb"] == ((0, 2), 2) and a30["4g.24gb"] == ((0,), 4)


def test_one_gs_at_2_and_6_leave_no_3g_slot():
    layout = [("1g.5gb", 2), ("1g.5gb", 6)]
    assert legal_starts(A100, "3g.20gb", layout) == ()
    assert largest_free_run(A100, layout) == 3


def test_impossible_instances_are_refused():
    with pytest.raises(ValueError, match="cannot start"):
        occupancy(A100, [("1g.5gb", 7)])
    with pytest.raises(ValueError, match="overlaps"):
        occupancy(A100, [("3g.20gb", 0), ("2g.10gb", 2)])
    with pytest.raises(ValueError, match="not among"):
        choose(A100, "1g.5gb", [], idle=[("1g.5gb", 0)])
    with pytest.raises(ValueError, match="unknown placement rule"):
        choose(A100, "1g.5gb", [], rule="best")


def test_the_rules_on_an_empty_a100():
    assert choose(A100, "1g.5gb", [], allowed=PLAIN, rule=FIRST) == Choice(0)
    # slice 0 leaves a free run of 7 (1..7); slice 6 keeps 4g and 3g at 0 and all three 2g starts
    assert choose(A100, "1g.5gb", [], allowed=PLAIN, rule=LEAST_BLOCKING) == Choice(0)
    assert choose(A100, "1g.5gb", [], allowed=PLAIN, rule=MOST_PLACEMENTS) == Choice(6)
    assert choose(A100, "3g.20gb", [("1g.5gb", 6)], rule=LEAST_BLOCKING) == Choice(0)
    assert choose(A100, "7g.40gb", [("1g.5gb", 6)]) is None
    # the default keeps 4g.20gb's and 7g.40gb's only start free: a lone 1g.5gb at 6, a 3g.20gb or 2g.10gb at 4
    assert DEFAULT_RULE == LARGEST_FIRST
    assert [choose(A100, p, [], allowed=PLAIN).start for p in PLAIN] == [6, 4, 4, 0, 0]
    assert choose(A100, "1g.5gb", [], allowed=PLAIN, rule=MOST_COMPLETIONS) == Choice(6)
    assert choose(A100, "1g.5gb", [], rule=MOST_COMPLETIONS) == Choice(5)  # with 1g.10gb: 6 would block its start


@pytest.mark.parametrize("name", ("A100-SXM4-40GB", "A30-24GB"))
@pytest.mark.parametrize("rule", RULES)
def test_every_choice_is_legal_and_the_best_by_its_rule(name, rule):
    model = get_model(name)
    names = tuple(p.name for p in model.mig_profiles)
    for layout in reachable_layouts(model):
        for profile in names:
            choice = choose(model, profile, layout, rule=rule)
            starts = legal_starts(model, profile, layout)
            assert (choice is None) == (not starts)
            if choice is None:
                continue
            assert choice.start in starts and not choice.reuse and not choice.destroy
            score = _scores(model, profile, layout, names, rule)
            assert score[choice.start] == max(score.values())


def _scores(model, profile, layout, names, rule):
    out = {}
    for s in legal_starts(model, profile, layout):
        after = [*layout, (profile, s)]
        run, left = largest_free_run(model, after), surviving_placements(model, after, names)
        sizes = sorted({model.profile(n).memory_slices for n in names}, reverse=True)
        by_size = tuple(
            sum(len(_brute_legal(model, model.profile(n), after)) for n in names if model.profile(n).memory_slices == z)
            for z in sizes
        )
        out[s] = {
            FIRST: (-s,),
            LEAST_BLOCKING: (run, left, -s),
            MOST_PLACEMENTS: (left, run, -s),
            MOST_COMPLETIONS: (completions(model, after, names), run, left, -s),
            LARGEST_FIRST: (*by_size, -s),
        }[rule]
    return out


@pytest.mark.parametrize("name", ("A100-SXM4-40GB", "A30-24GB", "H100-SXM5-80GB"))
def test_completions_count_the_multisets_the_table_still_adds(name):
    """Against the table read directly: the distinct multisets of every disjoint set that holds the instances,
    less the instances; at every layout of at most two instances."""
    model = get_model(name)
    everything = _brute_layouts(name)
    for layout in (lay for lay in everything if len(lay) <= 2):
        added = {
            tuple(sorted(n for n, s in big if (n, s) not in layout)) for big in everything if set(layout) <= set(big)
        }
        assert completions(model, layout) == len(added), layout
    assert completions(A100, [("7g.40gb", 0)]) == 1  # only the empty multiset


def test_largest_first_keeps_the_large_starts_and_gathers_the_small_instances():
    names = tuple(p.name for p in A100.mig_profiles)
    # a second 1g.10gb joins the first in its half: 3g.20gb keeps its start at 4
    assert choose(A100, "1g.10gb", [("1g.10gb", 0)]) == Choice(2)
    assert legal_starts(A100, "3g.20gb", [("1g.10gb", 0), ("1g.10gb", 2)]) == (4,)
    # least-blocking sends it to the other half (same free run, more placements) and strands 3g.20gb
    assert choose(A100, "1g.10gb", [("1g.10gb", 0)], rule=LEAST_BLOCKING) == Choice(6)
    # the diagnosis of least-blocking under exact weights: a lone 1g.5gb at 0 left no start for 4g.20gb
    assert choose(A100, "1g.5gb", [], rule=LEAST_BLOCKING) == Choice(0)
    assert legal_starts(A100, "4g.20gb", [("1g.5gb", choose(A100, "1g.5gb", []).start)]) == (0,)
    # at every reachable layout, no legal start keeps more placements of the largest size that can still be had
    for layout in reachable_layouts(A100):
        for profile in names:
            choice = choose(A100, profile, layout)
            if choice is None:
                continue
            kept = {s: _largest_kept(layout, profile, s, names) for s in legal_starts(A100, profile, layout)}
            assert kept[choice.start] == max(kept.values()), (layout, profile)


def _largest_kept(layout, profile, start, names):
    after = [*layout, (profile, start)]
    size = max(A100.profile(n).memory_slices for n in names)
    return sum(len(legal_starts(A100, n, after)) for n in names if A100.profile(n).memory_slices == size)


def test_an_idle_instance_of_the_same_profile_is_reused_first():
    layout = [("2g.10gb", 0), ("2g.10gb", 4), ("1g.5gb", 2)]
    assert choose(A100, "2g.10gb", layout, idle=[("2g.10gb", 4)]) == Choice(4, reuse=True)
    # another profile does not reuse it, and goes where it is free
    assert choose(A100, "1g.5gb", layout, idle=[("2g.10gb", 4)]).start == 3


def test_idle_instances_in_the_way_are_destroyed_fewest_first():
    layout = [("1g.5gb", 2), ("1g.5gb", 6), ("1g.5gb", 5)]
    got = choose(A100, "3g.20gb", layout, idle=[("1g.5gb", 2), ("1g.5gb", 6)])
    assert got == Choice(0, destroy=(("1g.5gb", 2),))
    # both halves busy: nothing to destroy helps
    assert choose(A100, "3g.20gb", layout, idle=[("1g.5gb", 6)]) is None
    two = choose(A100, "4g.20gb", [("1g.5gb", 0), ("1g.5gb", 1)], idle=[("1g.5gb", 0), ("1g.5gb", 1)])
    assert two == Choice(0, destroy=(("1g.5gb", 0), ("1g.5gb", 1)))


def test_pick_gpu_reuses_then_fits_best_then_none():
    empty: tuple = ((), ())
    half = ([("3g.20gb", 4)], [])
    idle = ([("1g.5gb", 3)], [("1g.5gb", 3)])
    assert pick_gpu(A100, "1g.5gb", [empty, half, idle], allowed=PLAIN) == 2
    assert pick_gpu(A100, "1g.5gb", [empty, half], allowed=PLAIN) == 1  # beside the 3g, not on the empty GPU
    assert pick_gpu(A100, "1g.5gb", [empty, half], allowed=PLAIN, rule=LEAST_BLOCKING) == 1
    assert pick_gpu(A100, "7g.40gb", [half, half]) is None
    assert pick_gpu(A100, "7g.40gb", [half, empty]) == 1
    assert pick_gpu(A100, "1g.5gb", []) is None
