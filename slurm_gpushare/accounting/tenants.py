"""Plan the sacctmgr commands that make slurmdbd match the policy's tenants and tiers. Pure.

(The plan is argv lists; running them and reading the current state is the
Slurm client's job, ``slurm.client``: nothing here runs a command.)

Tenants become accounts (FairShare from ``shares``, GrpTRES from ``quota``)
with their users; tiers become QOS of the same name (priority, preempt mode,
usage factor, and the lower tiers they may preempt). The plan only adds and
changes what differs from the current state, so running it against the
state it produces plans nothing. It never deletes: accounts, users and QOS
the policy does not name are reported by ``unmanaged`` and left alone.

Every association the policy manages (its accounts and their users) gets
access to every tier QOS, because job_submit.lua sets a job's QOS to its
tier: ``set qos+=<tiers>`` adds them and keeps whatever other QOS an
association has. What an association may use comes from
``sacctmgr show assoc format=account,user,qos`` (``read_current``), where
slurmdbd prints each association's effective list, inherited ones included,
as comma-separated names (``batch,normal,scavenger``). A Current read
without that column (``access`` None) plans no QOS access.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..policy import Site
from ..policy.billing import fmt
from ..slurm.interface import SlurmClient
from ..slurm.sacctmgr import ACCESS_FORMAT, SACCTMGR, AssocRow, QosRow, access_argv, parse_access  # noqa: F401

MANAGED_TRES = ("gres/gpu", "gres/mps", "gres/shard")
_QUOTA_TRES = {"gpu": "gres/gpu", "shard": "gres/shard", "mps": "gres/mps"}
_NEW_QOS = QosRow("", 0, "cluster", 1.0, frozenset())
Access = Mapping[tuple[str, str | None], frozenset[str]]


@dataclass(frozen=True)
class Current:
    """What slurmdbd holds now, from ``sacctmgr show assoc`` and ``show qos``."""

    accounts: Mapping[str, AssocRow]
    users: frozenset[tuple[str, str]]
    qos: Mapping[str, QosRow]
    access: Access | None = None  # (account, user or None) -> the QOS it may use; None: not read

    @classmethod
    def from_rows(cls, assocs: Iterable[AssocRow], qos: Iterable[QosRow], access: Access | None = None) -> Current:
        assocs = list(assocs)
        accounts = {a.account: a for a in assocs if a.user is None}
        users = frozenset((a.account, a.user) for a in assocs if a.user is not None)
        return cls(accounts, users, {q.name: q for q in qos}, access)


def read_current(client: SlurmClient, cluster: str) -> Current:
    """The current state from slurmdbd, QOS access included, through the Slurm client."""
    return Current.from_rows(client.associations(cluster), client.qos(), client.qos_access(cluster))


@dataclass(frozen=True)
class AccountSpec:
    name: str
    parent: str
    fairshare: int | str
    description: str
    users: tuple[str, ...]
    grp_tres: Mapping[str, int]


@dataclass(frozen=True)
class QosSpec:
    name: str
    priority: int
    preempt_mode: str
    usage_factor: float
    preempt: frozenset[str]


def desired_accounts(site: Site) -> list[AccountSpec]:
    """One spec per tenant, parents before children (sacctmgr needs the parent to exist)."""
    tenants = site.policy.tenants
    parent = {t.name: t.parent for t in tenants}
    specs = [
        AccountSpec(
            t.name,
            t.parent or "root",
            t.shares,
            t.description or t.name,
            tuple(t.users),
            {_QUOTA_TRES[k]: v for k, v in t.quota.model_dump().items() if v is not None},
        )
        for t in tenants
    ]
    return sorted(specs, key=lambda s: _depth(s.name, parent))


def _depth(name: str, parent: Mapping[str, str | None]) -> int:
    depth = 0
    while up := parent.get(name):
        name, depth = up, depth + 1
    return depth


def desired_qos(site: Site) -> list[QosSpec]:
    """One QOS per tier; a tier may preempt every lower-priority tier whose jobs can be preempted."""
    tiers = [t.spec for t in site.tiers]
    return [
        QosSpec(
            t.name,
            t.priority,
            t.preempt_mode.lower(),
            t.usage_factor,
            frozenset(o.name for o in tiers if o.priority < t.priority and o.preempt_mode.lower() != "off"),
        )
        for t in tiers
    ]


def plan(site: Site, current: Current, *, cluster: str | None = None) -> list[list[str]]:
    """The sacctmgr argv lists, in order, that bring ``current`` to the policy's accounts and QOS."""
    cluster = cluster or site.cluster.name
    tiers = frozenset(t.name for t in site.tiers)
    # What each account may use once the commands before have run: a new account inherits its parent's.
    planned: dict[str, frozenset[str]] = {}
    qos = desired_qos(site)
    # QOS first: sacctmgr refuses access to a QOS that does not exist yet.
    out = [[*SACCTMGR, "add", "qos", q.name] for q in qos if q.name not in current.qos]
    for q in qos:
        out += _qos(q, current.qos.get(q.name, _NEW_QOS))
    for spec in desired_accounts(site):
        account_cmds = _account(spec, current, cluster)
        users = [c for c in account_cmds if c[len(SACCTMGR) : len(SACCTMGR) + 2] == ["add", "user"]]
        out += [c for c in account_cmds if c not in users]
        if current.access is not None:
            out += _access(spec, current, cluster, tiers, planned)
        # Users last: a user association copies its account's QOS when it is created. Seen on 24.11:
        # granting the account QOS after its users exist shows in `sacctmgr show assoc` but
        # slurmctld keeps the users without it ("does not have access to qos batch").
        out += users
    return out


def _account(spec: AccountSpec, current: Current, cluster: str) -> list[list[str]]:
    have = current.accounts.get(spec.name)
    out = []
    if have is None:
        out.append(
            [
                *SACCTMGR,
                "add",
                "account",
                spec.name,
                f"cluster={cluster}",
                f"parent={spec.parent}",
                f"fairshare={spec.fairshare}",
                f"description={spec.description}",
            ]
        )
        have = AssocRow(spec.name, None, spec.parent, spec.fairshare, {})
    where = [*SACCTMGR, "modify", "account", "where", f"name={spec.name}", f"cluster={cluster}", "set"]
    if (have.parent or "root") != spec.parent:
        out.append([*where, f"parent={spec.parent}"])
    changes = []
    if have.fairshare != spec.fairshare:
        changes.append(f"fairshare={spec.fairshare}")
    tres = tres_changes(spec.grp_tres, have.grp_tres)
    if tres:
        changes.append(f"GrpTRES={tres}")
    if changes:
        out.append([*where, *changes])
    out += [
        [*SACCTMGR, "add", "user", u, f"account={spec.name}", f"cluster={cluster}"]
        for u in spec.users
        if (spec.name, u) not in current.users
    ]
    return out


def _access(
    spec: AccountSpec, current: Current, cluster: str, tiers: frozenset[str], planned: dict[str, frozenset[str]]
) -> list[list[str]]:
    """``qos+=`` for the account and its existing users that lack a tier QOS (new users inherit the account's).

    An existing user is given the tiers itself even when it may only be
    inheriting the account's list (``show assoc`` cannot tell), so that one
    apply is enough when the user has a list of its own.
    """
    access = current.access or {}
    if spec.name in current.accounts:
        have = access.get((spec.name, None), frozenset())
    else:
        have = planned.get(spec.parent, access.get((spec.parent, None), frozenset()))
    out = []
    if not tiers <= have:
        out.append(
            [
                *SACCTMGR,
                "modify",
                "account",
                "where",
                f"name={spec.name}",
                f"cluster={cluster}",
                "set",
                f"qos+={','.join(sorted(tiers - have))}",
            ]
        )
    planned[spec.name] = have | tiers
    for u in spec.users:
        if (spec.name, u) not in current.users:
            continue
        mine = access.get((spec.name, u), frozenset())
        if not tiers <= mine:
            out.append(
                [
                    *SACCTMGR,
                    "modify",
                    "user",
                    "where",
                    f"name={u}",
                    f"account={spec.name}",
                    f"cluster={cluster}",
                    "set",
                    f"qos+={','.join(sorted(tiers - mine))}",
                ]
            )
    return out


def tres_changes(want: Mapping[str, int], have: Mapping[str, int]) -> str:
    """GrpTRES items for the managed GPU TRES that differ; ``-1`` clears a limit the policy dropped."""
    items = []
    for key in MANAGED_TRES:
        w, h = want.get(key), have.get(key)
        if w is None and h is not None:
            items.append(f"{key}=-1")
        elif w is not None and w != h:
            items.append(f"{key}={w}")
    return ",".join(items)


def _qos(spec: QosSpec, have: QosRow) -> list[list[str]]:
    changes = []
    if have.priority != spec.priority:
        changes.append(f"priority={spec.priority}")
    if _mode(have.preempt_mode) != _mode(spec.preempt_mode):
        changes.append(f"preemptmode={spec.preempt_mode}")
    if abs(have.usage_factor - spec.usage_factor) > 1e-6:
        changes.append(f"usagefactor={fmt(spec.usage_factor)}")
    if have.preempt != spec.preempt:
        changes.append(f"preempt={','.join(sorted(spec.preempt))}")
    if not changes:
        return []
    return [[*SACCTMGR, "modify", "qos", "where", f"name={spec.name}", "set", *changes]]


def _mode(mode: str) -> str:
    # An unset QOS PreemptMode reads back as "cluster"; setting "off" unsets it.
    return "off" if mode in ("cluster", "off", "") else mode


def unmanaged(site: Site, current: Current) -> list[str]:
    """What exists in slurmdbd but not in the policy; never changed by the plan, listed so a person can decide."""
    accounts = {t.name: set(t.users) for t in site.policy.tenants}
    tiers = {t.name for t in site.tiers}
    out = [f"account {a}" for a in sorted(current.accounts) if a not in accounts and a != "root"]
    out += [f"user {u} in account {a}" for a, u in sorted(current.users) if a in accounts and u not in accounts[a]]
    out += [f"qos {q}" for q in sorted(current.qos) if q not in tiers and q != "normal"]
    return out
