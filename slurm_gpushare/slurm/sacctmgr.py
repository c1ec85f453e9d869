"""Accounts, users and QOS in slurmdbd: read them with ``sacctmgr show``, change them with planned argv lists.

What sacctmgr prints (src/sacctmgr/*_functions.c):
- ``Fairshare`` is ``parent`` for FairShare=parent, else the integer;
- ``ParentName`` is set on account associations only (empty for users and root);
- ``GrpTRES`` is ``gres/gpu=24,gres/shard=8`` (empty when unlimited);
- a QOS's ``PreemptMode`` is lower case, ``cluster`` when unset (``off``
  also reads back as ``cluster``); ``UsageFactor`` is ``%f``; ``Preempt`` is
  the comma-separated QOS names it may preempt.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import GpushareError
from ..proc import Result, Runner
from .parsable import parse_tres, rows

ASSOC_FORMAT = ("account", "user", "parentname", "fairshare", "grptres")
QOS_FORMAT = ("name", "priority", "preemptmode", "usagefactor", "preempt")
ACCESS_FORMAT = ("account", "user", "qos")
SACCTMGR = ("sacctmgr", "-i")  # the head of every planned change: non-interactive


@dataclass(frozen=True)
class AssocRow:
    account: str
    user: str | None
    parent: str | None
    fairshare: int | str | None
    grp_tres: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QosRow:
    name: str
    priority: int
    preempt_mode: str
    usage_factor: float
    preempt: frozenset[str] = frozenset()


def assoc_argv(cluster: str | None = None) -> list[str]:
    where = ["where", f"cluster={cluster}"] if cluster else []
    return ["sacctmgr", "--noheader", "--parsable2", "show", "assoc", *where, f"format={','.join(ASSOC_FORMAT)}"]


def qos_argv() -> list[str]:
    return ["sacctmgr", "--noheader", "--parsable2", "show", "qos", f"format={','.join(QOS_FORMAT)}"]


def access_argv(cluster: str) -> list[str]:
    return [
        "sacctmgr",
        "--noheader",
        "--parsable2",
        "show",
        "assoc",
        "where",
        f"cluster={cluster}",
        f"format={','.join(ACCESS_FORMAT)}",
    ]


def parse_access(
    lines: Iterable[str], *, source: str = "sacctmgr show assoc"
) -> dict[tuple[str, str | None], frozenset[str]]:
    """Each association's QOS list, as ``show assoc format=account,user,qos`` prints it (comma-separated)."""
    return {
        (account, user or None): frozenset(q for q in qos.split(",") if q)
        for account, user, qos in rows(lines, len(ACCESS_FORMAT), source)
    }


def parse_assocs(lines: Iterable[str], *, source: str = "sacctmgr show assoc") -> list[AssocRow]:
    out = []
    for account, user, parent, fairshare, grp in rows(lines, len(ASSOC_FORMAT), source):
        share: int | str | None = None
        if fairshare == "parent":
            share = "parent"
        elif fairshare:
            share = int(fairshare)
        tres = {k: int(v) for k, v in parse_tres(grp).items()}
        out.append(AssocRow(account, user or None, parent or None, share, tres))
    return out


def parse_qos(lines: Iterable[str], *, source: str = "sacctmgr show qos") -> list[QosRow]:
    out = []
    for name, prio, mode, factor, preempt in rows(lines, len(QOS_FORMAT), source):
        out.append(
            QosRow(
                name,
                int(prio or 0),
                (mode or "cluster").lower(),
                float(factor or 1.0),
                frozenset(p for p in preempt.split(",") if p),
            )
        )
    return out


def show_assocs(runner: Runner, cluster: str | None = None) -> list[AssocRow]:
    return parse_assocs(io.StringIO(runner(assoc_argv(cluster)).stdout))


def show_qos(runner: Runner) -> list[QosRow]:
    return parse_qos(io.StringIO(runner(qos_argv()).stdout))


def apply(runner: Runner, commands: Sequence[Sequence[str]]) -> list[Result]:
    """Run planned sacctmgr commands in order; the first failure stops the run (CommandError).

    Refuses anything that is not a non-interactive sacctmgr command, so a
    plan can never become a different program or wait for a y/N prompt.
    """
    for argv in commands:
        if list(argv[:2]) != ["sacctmgr", "-i"]:
            raise GpushareError(f"refusing to run {list(argv)!r}: only 'sacctmgr -i ...' commands are applied")
    return [runner(list(argv)) for argv in commands]
