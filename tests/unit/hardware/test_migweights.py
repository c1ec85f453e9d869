"""Carrier weights for per-job MIG (hardware/migweights.py), proved per model in both directions.

The proof enumerates every multiset of the profiles up to capacity (each count
up to one more than fits in the capacity by weight alone) and checks that
Slurm's count admits it exactly when the static layout solver
(hardware/layout.py, independent of the search) places it on one GPU.
"""

from __future__ import annotations

from itertools import combinations

import pytest

from slurm_gpushare.hardware import get_model, place_layout
from slurm_gpushare.hardware.migweights import (
    Weights,
    boundary_multisets,
    exact_weights,
    largest_exact_subsets,
    multisets_within,
    obstruction,
    placeable_multisets,
    safe_weights,
    unsafe_sequence,
)

EIGHT_SLICE = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H200-141GB")


def _plain(model):
    """1g, 2g, 3g, 4g, 7g: the profiles without '+me' and without the double-memory 1g."""
    return tuple(p.name for p in model.mig_profiles if not p.media_extensions and p.name != _double_1g(model))


def _double_1g(model):
    return next(p.name for p in model.mig_profiles if p.compute_slices == 1 and p.memory_slices == 2)


def assert_exact(model, weights: Weights):
    """Every multiset up to capacity: admitted by the count exactly when it fits on one GPU."""
    bounds = tuple(weights.capacity // w + 1 for w in weights.weights)
    checked = 0
    for counts in multisets_within(bounds):
        names = [p for p, n in zip(weights.profiles, counts, strict=True) for _ in range(n)]
        fits = place_layout(model, names) is not None
        assert weights.admits(counts) == fits, (counts, fits)
        checked += 1
    return checked


def _least(model, profiles):
    found = exact_weights(model, profiles)
    assert found is not None
    assert_exact(model, found)
    assert exact_weights(model, profiles, found.capacity - 1) is None
    return found


@pytest.mark.parametrize("name", EIGHT_SLICE)
def test_seven_slice_gpus_plain_profiles_count_15(name):
    model = get_model(name)
    plain = _plain(model)
    assert [model.profile(p).compute_slices for p in plain] == [1, 2, 3, 4, 7]
    assert len(placeable_multisets(model, plain)) - 1 == 37  # the sheet's 37 leave out the empty multiset
    found = _least(model, plain)
    assert found.capacity == 15 and found.weights == (2, 4, 7, 8, 14)
    # the sheet's vector (7g at 15) is exact too: 7g alone fits in 15, 7g with anything does not
    assert_exact(model, Weights(model.name, plain, (2, 4, 7, 8, 15), 15))


@pytest.mark.parametrize("name", EIGHT_SLICE)
def test_with_the_double_memory_1g_count_31(name):
    model = get_model(name)
    profiles = (*_plain(model), _double_1g(model))
    assert len(placeable_multisets(model, profiles)) - 1 == 77
    found = _least(model, profiles)
    assert found.capacity == 31 and found.as_dict()[_double_1g(model)] == 7
    sheet = Weights(model.name, profiles, (4, 8, 14, 16, 31, 7), 31)
    assert_exact(model, sheet)


def test_a30_1_2_4_count_4():
    model = get_model("A30-24GB")
    found = _least(model, ("1g.6gb", "2g.12gb", "4g.24gb"))
    assert found.weights == (1, 2, 4) and found.capacity == 4


def test_plain_slices_as_weights_admit_what_does_not_fit():
    model = get_model("A100-SXM4-40GB")
    slices = Weights(model.name, _plain(model), (1, 2, 3, 4, 7), 7)
    assert slices.admits((1, 0, 2, 0, 0)) and place_layout(model, ["3g.20gb", "3g.20gb", "1g.5gb"]) is None


@pytest.mark.parametrize("name", (*EIGHT_SLICE, "A30-24GB"))
def test_no_weights_for_every_profile_and_the_largest_subsets_that_have_some(name):
    model = get_model(name)
    every = tuple(p.name for p in model.mig_profiles)
    proof = obstruction(model, every)
    assert proof is not None and exact_weights(model, every, 31) is None
    fit = placeable_multisets(model, every)
    (a, b), (c, d) = proof.fit, proof.unfit
    assert a in fit and b in fit and c not in fit and d not in fit
    assert [x + y for x, y in zip(a, b, strict=True)] == [x + y for x, y in zip(c, d, strict=True)]
    subsets = largest_exact_subsets(model, every, 31)
    for found in subsets:
        assert_exact(model, found)
    if name == "A30-24GB":
        assert [w.as_dict() for w in subsets] == [{"1g.6gb": 2, "2g.12gb": 4, "2g.12gb+me": 5, "4g.24gb": 8}]
        assert subsets[0].capacity == 9
    else:
        assert [w.profiles for w in subsets] == [(_plain(model)[0], _double_1g(model), *_plain(model)[1:])]
    # every subset one larger has a proof that no weights exist at any capacity
    size = len(subsets[0].profiles)
    for bigger in combinations(every, size + 1):
        assert obstruction(model, bigger) is not None, bigger


def test_boundary_multisets_are_one_over_placeable_ones():
    fit = frozenset({(0, 0), (1, 0), (2, 0), (0, 1)})
    assert boundary_multisets(fit) == {(3, 0), (2, 1), (1, 1), (0, 2)}
    assert list(multisets_within((1, 2))) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_profiles_named_twice_are_refused():
    with pytest.raises(ValueError, match="twice"):
        exact_weights(get_model("A30-24GB"), ("1g.6gb", "1G.6GB"))


# ---- safe weights: no admitted order of arrivals and departures leaves a slice without a start ----


def _replay(model, weights: Weights, sequence, rule):
    """Play a sequence ('+p' / '-p') on one GPU under the count and the rule; the last arrival's start."""
    from slurm_gpushare.hardware.migplace import choose

    held: list = []
    got = None
    for step in sequence:
        name = step[1:]
        if step[0] == "-":
            held.remove(next(i for i in held if i[0] == name))
            continue
        assert sum(weights.as_dict()[p] for p, _ in held) + weights.as_dict()[name] <= weights.capacity
        got = choose(model, name, held, allowed=weights.profiles, rule=rule)
        if got is not None:
            held.append((name, got.start))
    return got


@pytest.mark.parametrize("rule", ["first", "least-blocking"])
def test_exact_weights_admit_a_sequence_whose_last_slice_has_no_start(rule):
    model = get_model("A100-SXM4-40GB")
    exact = exact_weights(model, ("1g.5gb", "2g.10gb", "3g.20gb"))
    bad = unsafe_sequence(model, exact, rule)
    assert bad is not None and _replay(model, exact, bad, rule) is None  # admitted by the count, no start
    assert unsafe_sequence(model, exact, rule) == bad  # shortest first, deterministic


@pytest.mark.parametrize(
    "model_name, profiles",
    [("A100-SXM4-40GB", ("1g.5gb", "2g.10gb", "3g.20gb")), ("A30-24GB", ("1g.6gb", "2g.12gb", "4g.24gb"))],
)
def test_safe_weights_are_safe_and_admit_fewer_placeable_sets(model_name, profiles):
    model = get_model(model_name)
    safe, admitted = safe_weights(model, profiles, "first", extra_capacity=2)
    assert unsafe_sequence(model, safe, "first") is None
    fit = placeable_multisets(model, safe.profiles)
    assert 0 < admitted < len(fit)
    assert all(
        place_layout(model, [p for p, n in zip(safe.profiles, c, strict=True) for _ in range(n)]) is not None
        for c in fit
        if safe.admits(c)
    )
    assert unsafe_sequence(model, exact_weights(model, profiles), "first") is not None
