"""Slurm's Fair Tree fair-share, recomputed from an association tree and its raw usage. Pure.

Follows src/plugins/priority/multifactor/fair_tree.c and the association
set-up in src/common/assoc_mgr.c (read, not copied):

- Each association's fair-share parent is its nearest ancestor that is not
  FairShare=parent; so the children of a FairShare=parent account rank
  among that account's siblings (the account stays in the list, holding
  nothing).
- S = shares / (sum of the shares of the siblings that are not
  FairShare=parent); U = usage / fair-share parent's usage (0 when that is
  0); LevelFS = S/U, 0 when S is 0, infinite when U is 0. FairShare=parent
  users get LevelFS infinite; FairShare=parent accounts get NO_VAL.
- Siblings sort by LevelFS, highest first, users ahead of accounts on a
  tie; the walk is depth first. Ranks start at N, the number of user
  associations; a user's factor is rank/N. A user tied with the previous
  sibling keeps the previous rank; an account tied with the previous
  sibling passes the tie to its first child.
- Tied accounts: the documentation says their children are merged before
  sorting. The code's _count_tied_accounts stops at the first following
  account (``if (!next_assoc->user) break;``), and users sort ahead of
  tied accounts, so it never merges anything; the tie is only passed down
  as above. ``merge_tied_accounts=False`` (the default) does what slurmctld
  does; True does what the documentation describes.

Arithmetic is in doubles; slurmctld uses long double for U and LevelFS, so
results agree to about 1e-15 relative, and ranks agree unless two LevelFS
differ only below that. Siblings with exactly equal LevelFS keep their input
order (a stable sort); slurmctld's order is its association list's, which
sshare's alphabetical print order need not match, so only the relative
ranks of exactly tied sibling accounts can differ.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..slurm.parsable import SlurmParseError
from ..slurm.sshare import ShareRow

NO_VAL = 4294967294.0  # (long double) NO_VAL: LevelFS of FairShare=parent accounts and of root
Key = tuple[str, str]


@dataclass(eq=False)
class Assoc:
    """One association: an account (``user`` None) or a user in an account. ``shares`` None is FairShare=parent."""

    account: str
    user: str | None = None
    shares: int | None = 1
    usage: float = 0.0
    children: list[Assoc] = field(default_factory=list)
    efctv: float | None = None  # U as slurmctld computed it, when a source has it exactly (sshare --json)

    @property
    def key(self) -> Key:
        return (self.account, self.user or "")

    @property
    def is_user(self) -> bool:
        return self.user is not None

    def add(self, child: Assoc) -> Assoc:
        self.children.append(child)
        return child

    def walk(self) -> Iterator[Assoc]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class Level:
    """Fair Tree's figures for one association; ``fairshare`` and ``rank`` only for users."""

    shares_norm: float
    usage_efctv: float
    level_fs: float
    fairshare: float | None = None
    rank: int | None = None


def compute(root: Assoc, *, merge_tied_accounts: bool = False) -> dict[Key, Level]:
    """LevelFS for every association under ``root`` and the fair-share factor of every user."""
    fs_children, fs_parent = _fs_tree(root)
    norm = _shares_norm(root, fs_children, fs_parent)
    lf, efctv = {}, {}
    for node, parent in fs_parent.items():
        efctv[node] = _efctv(node, parent)
        lf[node] = _level_fs(node, norm[node], efctv[node])
    users = sum(1 for a in root.walk() if a.is_user)
    ranks: dict[Assoc, int] = {}
    state = _Ranking(users, users, ranks)
    _rank(fs_children.get(root, []), fs_children, lf, state, False, merge_tied_accounts)
    out = {root.key: Level(0.0, 1.0, NO_VAL)}
    for node in fs_parent:
        rank = ranks.get(node)
        factor = rank / users if rank is not None and users else (0.0 if node.is_user else None)
        out[node.key] = Level(norm[node], efctv[node], lf[node], factor, rank)
    return out


def _fs_tree(root: Assoc) -> tuple[dict[Assoc, list[Assoc]], dict[Assoc, Assoc]]:
    """Children lists as slurmctld builds them: each under its nearest non-FairShare=parent ancestor."""
    children: dict[Assoc, list[Assoc]] = {}
    parent: dict[Assoc, Assoc] = {}

    def visit(node: Assoc, anchor: Assoc) -> None:
        for child in node.children:
            children.setdefault(anchor, []).append(child)
            parent[child] = anchor
            visit(child, child if child.shares is not None else anchor)

    visit(root, root)
    return children, parent


def _shares_norm(
    root: Assoc, children: Mapping[Assoc, list[Assoc]], parent: Mapping[Assoc, Assoc]
) -> dict[Assoc, float]:
    """S: shares over the level's shares; FairShare=parent takes its fair-share parent's S (root's is 0)."""
    level = {p: sum(c.shares for c in kids if c.shares is not None) for p, kids in children.items()}
    own: dict[Assoc, float] = {root: 0.0}
    for node, p in parent.items():
        if node.shares is not None:
            own[node] = node.shares / level[p] if level[p] else 0.0
    return {node: own[node] if node.shares is not None else own[parent[node]] for node in parent}


def _efctv(node: Assoc, parent: Assoc) -> float:
    if node.efctv is not None:
        return node.efctv
    return node.usage / parent.usage if parent.usage else 0.0


def _level_fs(node: Assoc, s: float, u: float) -> float:
    if node.shares is None:
        return math.inf if node.is_user else NO_VAL
    if s == 0:
        return 0.0
    return s / u if u else math.inf


@dataclass
class _Ranking:
    rank: int
    rnt: int  # the rank the next user would get without ties
    ranks: dict


def _rank(
    siblings: Sequence[Assoc],
    children: Mapping[Assoc, list[Assoc]],
    lf: Mapping[Assoc, float],
    state: _Ranking,
    tied_in: bool,
    merge: bool,
) -> None:
    order = sorted(siblings, key=lambda a: (-lf[a], not a.is_user))
    prev = NO_VAL
    i = 0
    while i < len(order):
        node = order[i]
        tied = True if (i == 0 and tied_in) else prev == lf[node]
        if node.is_user:
            if not tied:
                state.rank = state.rnt
            state.ranks[node] = state.rank
            state.rnt -= 1
        else:
            extra = _tied_accounts(order, i, lf) if merge else _slurm_tied_accounts(order, i, lf)
            merged = [c for acct in order[i : i + extra + 1] for c in children.get(acct, [])]
            _rank(merged, children, lf, state, tied, merge)
            i += extra
        prev = lf[node]
        i += 1


def _slurm_tied_accounts(order: Sequence[Assoc], i: int, lf: Mapping[Assoc, float]) -> int:
    """fair_tree.c's count, as written: it stops at the first account, so it counts only users (none tie)."""
    n = 0
    for nxt in order[i + 1 :]:
        if not nxt.is_user or lf[nxt] != lf[order[i]]:
            break
        n += 1
    return n


def _tied_accounts(order: Sequence[Assoc], i: int, lf: Mapping[Assoc, float]) -> int:
    """The documented rule: following sibling accounts with the same LevelFS."""
    n = 0
    for nxt in order[i + 1 :]:
        if nxt.is_user or lf[nxt] != lf[order[i]]:
            break
        n += 1
    return n


# ---- trees from reports, usage replaced, what-if ----------------------------------------------


def tree_from_sshare(rows: Sequence[ShareRow]) -> Assoc:
    """The tree sshare printed, with its shares and raw usage (and exact U when the rows carry it)."""
    accounts: dict[str, Assoc] = {}
    root = None
    for row in rows:
        shares = None if row.shares_parent else (1 if row.raw_shares is None else row.raw_shares)
        node = Assoc(
            row.account,
            row.user,
            shares,
            float(row.raw_usage or 0),
            efctv=row.effective_usage if row.exact_usage and row.parent else None,
        )
        if row.user is None:
            if row.parent is None:
                if root is not None:
                    raise SlurmParseError(f"sshare output has two roots: {root.account!r} and {row.account!r}")
                root = node
            accounts[row.account] = node
        parent = row.account if row.user is not None else row.parent
        if parent is not None:
            if parent not in accounts:
                raise SlurmParseError(f"association {node.key} comes before its parent account {parent!r}")
            accounts[parent].add(node)
    if root is None:
        raise SlurmParseError("sshare output has no root account")
    return root


def with_usage(root: Assoc, usage: Mapping[Key, float]) -> Assoc:
    """A copy of the tree where each user's usage is ``usage[(account, user)]`` (0 if absent)
    and each account's is the sum below it, as Fair Tree would see usage counted that way."""

    def copy(node: Assoc) -> Assoc:
        kids = [copy(c) for c in node.children]
        own = usage.get(node.key, 0.0) if node.is_user else sum(k.usage for k in kids)
        return Assoc(node.account, node.user, node.shares, own, kids)

    return copy(root)


def add_usage(root: Assoc, account: str, amount: float, user: str | None = None) -> Assoc:
    """A copy with ``amount`` more usage charged to ``account``: to one user, or spread over the
    account's users in proportion to their usage (equally if none has any). Every account on the
    way up to root gets the same amount, as slurmctld charges a job to all of a user's ancestors."""
    tree = _copy(root)
    up = {c: p for p in tree.walk() for c in p.children}
    target = next((a for a in tree.walk() if a.account == account and not a.is_user), None)
    if target is None:
        raise KeyError(f"account {account!r} is not in the tree")
    users = [a for a in target.walk() if a.is_user and (user is None or a.user == user)]
    if not users:
        raise KeyError(f"no user {user!r} in account {account!r}" if user else f"account {account!r} has no users")
    total = sum(u.usage for u in users)
    for u in users:
        part = amount * (u.usage / total if total else 1 / len(users))
        node: Assoc | None = u
        while node is not None:
            node.usage += part
            node = up.get(node)
    return tree


def _copy(node: Assoc) -> Assoc:
    """The same tree with usage kept and exact U dropped (it no longer matches the usage)."""
    return Assoc(node.account, node.user, node.shares, node.usage, [_copy(c) for c in node.children])


def what_if(
    root: Assoc,
    *,
    usage: Mapping[Key, float] | None = None,
    extra: Sequence[tuple[str, str | None, float]] = (),
    merge_tied_accounts: bool = False,
) -> dict[Key, Level]:
    """Fair Tree if usage were ``usage`` (e.g. GPU-equivalent seconds per association) and after
    ``extra`` (account, user or None, amount) more usage; the tree's own usage otherwise."""
    tree = with_usage(root, usage) if usage is not None else root
    for account, user, amount in extra:
        tree = add_usage(tree, account, amount, user)
    return compute(tree, merge_tied_accounts=merge_tied_accounts)


# ---- checking against sshare ------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One value of ours against sshare's. ``allowed`` is the tolerance plus what sshare's own
    rounding of its inputs (RawUsage printed as an integer) can explain."""

    key: Key
    field: str
    ours: float | None
    theirs: float | None
    allowed: float

    @property
    def diff(self) -> float:
        if self.ours is None or self.theirs is None:
            return math.inf if (self.ours is None) != (self.theirs is None) else 0.0
        if math.isinf(self.ours) or math.isinf(self.theirs):
            return 0.0 if self.ours == self.theirs else math.inf
        return abs(self.ours - self.theirs)

    @property
    def ok(self) -> bool:
        return self.diff <= self.allowed


def check_against(
    rows: Sequence[ShareRow],
    root: Assoc,
    result: Mapping[Key, Level],
    *,
    tolerance: float = 1e-6,
    usage_abs: float = 0.0,
) -> list[Check]:
    """Compare our NormShares, EffectvUsage, LevelFS and FairShare with sshare's, row by row.

    LevelFS is compared relatively (it is unbounded); the others absolutely.
    When the rows' usage is sshare -l's integer RawUsage, a usage of R under a
    parent of P is only known to within 1/R + 1/P relative, which widens what
    is allowed for U and LevelFS; --json rows carry Slurm's own U. Siblings
    whose LevelFS are that close may rank either way round in slurmctld, so
    a user's FairShare may then be off by the users ranked with the other.
    ``usage_abs``: the rows' own U is known only to within this (sshare -l's
    EffectvUsage, printed %f, taken as U by ``snapshot_rows``).
    """
    fs_children, fs_parent = _fs_tree(root)
    nodes = {a.key: a for a in root.walk()}
    exact = {r.key for r in rows if r.exact_usage}

    def rel_to(a: Assoc, p: Assoc) -> float:
        if a.key not in exact:
            return _usage_precision(a, p)
        return usage_abs / a.efctv if usage_abs and a.efctv else 0.0

    rel_of = {a: rel_to(a, p) for a, p in fs_parent.items()}
    slack = _rank_slack(root, fs_children, {a: result[a.key].level_fs for a in fs_parent}, rel_of)
    users = sum(1 for a in root.walk() if a.is_user)
    out = []
    for row in rows:
        node = nodes.get(row.key)
        if node is None or node is root:
            continue
        ours = result[row.key]
        rel = rel_of[node]
        # FairShare=parent: sshare -l prints no LevelFS; --json (24.11) gives a user's inf, an account's unset.
        lf = ours.level_fs if node.shares is not None or (node.is_user and row.level_fs is not None) else None
        out.append(Check(row.key, "norm_shares", ours.shares_norm, row.norm_shares, tolerance))
        out.append(
            Check(row.key, "effective_usage", ours.usage_efctv, row.effective_usage, tolerance + ours.usage_efctv * rel)
        )
        if row.level_fs is not None or lf is not None:
            scale = max(1.0, abs(row.level_fs)) if row.level_fs not in (None, math.inf) else 1.0
            bound = abs(lf) * rel if lf is not None and not math.isinf(lf) else 0.0
            out.append(Check(row.key, "level_fs", lf, row.level_fs, tolerance * scale + bound))
        if node.is_user and row.fairshare is not None:
            out.append(
                Check(row.key, "fairshare", ours.fairshare, row.fairshare, tolerance + slack.get(node, 0) / users)
            )
    return out


def _rank_slack(
    root: Assoc, children: Mapping[Assoc, list[Assoc]], lf: Mapping[Assoc, float], rel: Mapping[Assoc, float]
) -> dict[Assoc, int]:
    """Per user: how many ranks it could move if siblings (of it or of an ancestor) whose LevelFS
    lie within the rounding of their inputs sorted the other way round in slurmctld."""
    below: dict[Assoc, int] = {}

    def count(node: Assoc) -> int:
        below[node] = (1 if node.is_user else 0) + sum(count(c) for c in children.get(node, []))
        return below[node]

    def close(a: Assoc, b: Assoc) -> bool:
        if not (rel[a] or rel[b]) or not all(math.isfinite(lf[x]) and lf[x] != NO_VAL for x in (a, b)):
            return False
        return abs(lf[a] - lf[b]) <= abs(lf[a]) * rel[a] + abs(lf[b]) * rel[b]

    slack: dict[Assoc, int] = {}

    def walk(node: Assoc, inherited: int) -> None:
        kids = children.get(node, [])
        for x in kids:
            mine = inherited + sum(below[y] for y in kids if y is not x and close(x, y))
            if x.is_user:
                slack[x] = mine
            walk(x, mine)

    count(root)
    walk(root, 0)
    return slack


# sshare -l prints doubles as %f: a printed EffectvUsage is within this of slurmctld's.
PRINTED_ABS = 5e-7


def snapshot_rows(rows: Sequence[ShareRow]) -> list[ShareRow]:
    """The rows with sshare's printed EffectvUsage as U, instead of U recomputed from RawUsage.

    sshare's EffectvUsage, LevelFS and FairShare are what slurmctld computed
    at its last PriorityCalcPeriod; RawUsage moves whenever a job ends. Taking
    the printed EffectvUsage compares LevelFS and FairShare with values of the
    same moment (check_against with ``usage_abs=PRINTED_ABS``).
    """
    return [dataclasses.replace(r, exact_usage=True) if r.effective_usage is not None else r for r in rows]


def _usage_precision(node: Assoc, parent: Assoc) -> float:
    """Relative uncertainty of usage/parent_usage when both were truncated to integers."""
    if node.usage <= 0 or parent.usage <= 0:
        return 0.0
    return 1.0 / node.usage + 1.0 / parent.usage
