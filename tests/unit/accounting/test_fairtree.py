"""Fair Tree on hand-built trees; every expected number below was worked out by hand from the
rules in fair_tree.c (LF = S/U, sort, depth-first ranks, rank/N), not produced by the code."""

from __future__ import annotations

import math

import pytest

from slurm_gpushare.accounting.fairtree import NO_VAL, Assoc, add_usage, compute, what_if, with_usage


def tree(spec) -> Assoc:
    """Build from nested tuples: (account, shares, [children]) for accounts, (account, user, shares, usage) for users.
    Account usage is the sum of its users' (as slurmctld accrues it)."""
    root = Assoc("root", None, 1, 0.0)

    def build(parent: Assoc, items):
        for item in items:
            if len(item) == 4:
                acct, user, shares, usage = item
                parent.add(Assoc(acct, user, shares, usage))
            else:
                acct, shares, kids = item
                build(parent.add(Assoc(acct, None, shares, 0.0)), kids)

    build(root, spec)
    _sum(root)
    return root


def _sum(node: Assoc) -> float:
    if node.is_user:
        return node.usage
    node.usage = sum(_sum(c) for c in node.children)
    return node.usage


def factors(result):
    return {k[1]: round(v.fairshare, 12) for k, v in result.items() if k[1] and v.fairshare is not None}


def test_levels_and_sub_accounts():
    root = tree(
        [
            ("physics", 60, [("physics", "alice", 1, 300.0), ("physics", "bob", 1, 100.0)]),
            (
                "biology",
                40,
                [("biology", "carol", 1, 50.0), ("biology-imaging", 1, [("biology-imaging", "dave", 1, 150.0)])],
            ),
        ]
    )
    res = compute(root)
    assert res[("physics", "")].level_fs == pytest.approx(0.6 / (400 / 600))  # 0.9
    assert res[("biology", "")].level_fs == pytest.approx(0.4 / (200 / 600))  # 1.2
    assert res[("biology", "carol")].level_fs == pytest.approx(0.5 / 0.25)
    assert res[("biology-imaging", "")].level_fs == pytest.approx(0.5 / 0.75)
    assert res[("biology-imaging", "dave")].shares_norm == 1.0
    assert res[("physics", "alice")].usage_efctv == pytest.approx(0.75)
    # biology (1.2) before physics (0.9): carol 4/4, dave 3/4, then bob 2/4, alice 1/4
    assert factors(res) == {"carol": 1.0, "dave": 0.75, "bob": 0.5, "alice": 0.25}
    assert res[("physics", "")].fairshare is None and res[("physics", "")].rank is None


def test_equal_level_fs_users_share_a_rank():
    root = tree([("a", 1, [("a", "u1", 1, 10.0), ("a", "u2", 1, 10.0), ("a", "u3", 1, 40.0)])])
    res = compute(root)
    # u1 and u2 tie at LF 1/3 / (1/6) = 2; u3 gets rnt = 1 after two users were counted
    assert factors(res) == {"u1": 1.0, "u2": 1.0, "u3": round(1 / 3, 12)}
    assert res[("a", "u1")].rank == res[("a", "u2")].rank == 3 and res[("a", "u3")].rank == 1


def test_user_tied_with_account_shares_its_top_rank():
    root = tree([("p", 1, [("p", "x", 1, 50.0), ("q", 1, [("q", "q1", 1, 50.0), ("q", "q2", 1, 0.0)])])])
    res = compute(root)
    assert res[("p", "x")].level_fs == res[("q", "")].level_fs == pytest.approx(1.0)
    # x sorts first (users ahead of accounts), rank 3; q passes the tie to its first child q2 (LF inf)
    assert factors(res) == {"x": 1.0, "q2": 1.0, "q1": round(1 / 3, 12)}


def _two_tied_accounts():
    return tree(
        [("a", 1, [("a", "a1", 1, 10.0), ("a", "a2", 1, 0.0)]), ("b", 1, [("b", "b1", 1, 5.0), ("b", "b2", 1, 5.0)])]
    )


def test_tied_accounts_as_slurmctld_ranks_them():
    res = compute(_two_tied_accounts())
    assert res[("a", "")].level_fs == res[("b", "")].level_fs == 1.0
    # a first: a2 (inf) 4, a1 (0.5) 3; b is tied with a, so b1 keeps rank 3 and b2 ties with b1
    assert factors(res) == {"a2": 1.0, "a1": 0.75, "b1": 0.75, "b2": 0.75}


def test_tied_accounts_merged_as_documented():
    res = compute(_two_tied_accounts(), merge_tied_accounts=True)
    # children of a and b ranked together by their own LF: a2 inf, b1 = b2 = 1, a1 0.5
    assert factors(res) == {"a2": 1.0, "b1": 0.75, "b2": 0.75, "a1": 0.25}


def test_zero_usage_is_infinite_and_zero_shares_is_zero():
    root = tree([("a", 1, [("a", "idle", 1, 0.0), ("a", "busy", 1, 10.0), ("a", "none", 0, 0.0)])])
    res = compute(root)
    assert math.isinf(res[("a", "idle")].level_fs)
    assert res[("a", "none")].level_fs == 0.0  # S = 0 wins over U = 0
    assert res[("a", "none")].shares_norm == 0.0
    assert factors(res) == {"idle": 1.0, "busy": round(2 / 3, 12), "none": round(1 / 3, 12)}


def test_parent_usage_zero_means_u_zero_for_all():
    root = tree([("a", 1, [("a", "u1", 1, 0.0), ("a", "u2", 1, 0.0)]), ("b", 1, [("b", "u3", 1, 0.0)])])
    res = compute(root)
    assert all(math.isinf(v.level_fs) for k, v in res.items() if k != ("root", ""))
    assert set(factors(res).values()) == {1.0}


def test_fairshare_parent_users_rank_first():
    root = tree([("a", 1, [("a", "p1", None, 50.0), ("a", "p2", None, 0.0), ("a", "u", 1, 100.0)])])
    res = compute(root)
    assert math.isinf(res[("a", "p1")].level_fs)
    assert res[("a", "u")].shares_norm == 1.0  # level shares count only non-parent siblings
    assert res[("a", "u")].level_fs == pytest.approx(1 / (100 / 150))
    assert res[("a", "p1")].shares_norm == 1.0  # a FairShare=parent row shows its parent's S
    assert factors(res) == {"p1": 1.0, "p2": 1.0, "u": round(1 / 3, 12)}


def test_fairshare_parent_account_lifts_its_children():
    root = tree([("a", 1, [("a", "a1", 1, 100.0)]), ("b", None, [("b", "b1", 1, 200.0), ("b", "b2", 1, 0.0)])])
    res = compute(root)
    # b1, b2 rank at root level: S = 1/3 each (a, b1, b2 count; b does not), U against root's 300
    assert res[("b", "b1")].shares_norm == pytest.approx(1 / 3)
    assert res[("b", "b1")].usage_efctv == pytest.approx(200 / 300)
    assert res[("b", "b1")].level_fs == pytest.approx(0.5)
    assert res[("a", "")].level_fs == pytest.approx(1.0)
    assert res[("b", "")].level_fs == NO_VAL
    # b2 (inf) 3; b (NO_VAL) holds nobody; a (1) -> a1 rank 2; b1 (0.5) rank 1
    assert factors(res) == {"b2": 1.0, "a1": round(2 / 3, 12), "b1": round(1 / 3, 12)}


def test_exact_effective_usage_overrides_the_ratio():
    root = tree([("a", 1, [("a", "u1", 1, 0.0), ("a", "u2", 1, 10.0)])])
    root.children[0].children[0].efctv = 0.01  # usage below 1 that sshare -l prints as 0
    res = compute(root)
    assert res[("a", "u1")].level_fs == pytest.approx(0.5 / 0.01)
    assert res[("a", "u1")].rank == 2


def test_with_usage_replaces_users_and_sums_accounts():
    root = tree([("a", 1, [("a", "u1", 1, 10.0)]), ("b", 1, [("b", "u2", 1, 30.0)])])
    swapped = with_usage(root, {("a", "u1"): 30.0, ("b", "u2"): 10.0})
    assert [c.usage for c in swapped.children] == [30.0, 10.0] and swapped.usage == 40.0
    assert factors(compute(root)) == {"u1": 1.0, "u2": 0.5}
    assert factors(compute(swapped)) == {"u2": 1.0, "u1": 0.5}


def test_add_usage_spreads_in_proportion_and_charges_ancestors():
    root = tree([("a", 1, [("a", "u1", 1, 10.0), ("a", "u2", 1, 30.0)]), ("b", 1, [("b", "u3", 1, 40.0)])])
    more = add_usage(root, "a", 40.0)
    a = more.children[0]
    assert [u.usage for u in a.children] == [20.0, 60.0] and a.usage == 80.0 and more.usage == 120.0
    assert root.children[0].usage == 40.0  # the original is untouched
    one = add_usage(root, "b", 5.0, user="u3")
    assert one.children[1].children[0].usage == 45.0
    with pytest.raises(KeyError):
        add_usage(root, "nope", 1.0)


def test_what_if_gpu_hours_moves_an_account_down():
    root = tree([("a", 1, [("a", "u1", 1, 10.0)]), ("b", 1, [("b", "u2", 1, 20.0)])])
    assert factors(what_if(root)) == {"u1": 1.0, "u2": 0.5}
    assert factors(what_if(root, extra=[("a", None, 3600.0)])) == {"u2": 1.0, "u1": 0.5}
