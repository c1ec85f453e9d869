"""The association tree with shares and usage, as ``sshare -a -l --parsable2`` prints it.

What sshare prints (src/sshare/process.c, src/common/print_fields.c):
- the Account column is indented: one space per level below root; a user
  row shows its account's name one level deeper than the account row;
- RawShares is ``parent`` for FairShare=parent and empty for root;
- RawUsage is the decayed usage truncated to an integer (uint64);
- doubles are ``%f`` (6 decimals), ``inf`` for infinity, empty when unset
  (root's LevelFS, accounts' FairShare under Fair Tree, FairShare=parent
  rows' LevelFS).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from ..proc import Runner
from .parsable import SlurmParseError, parse_float, parse_int, rows

ARGV = ("sshare", "-a", "-l", "--parsable2")
JSON_ARGV = ("sshare", "-a", "--json")
# The -l column list under Fair Tree (the default when no -o is given).
LONG_FIELDS = (
    "Account",
    "User",
    "RawShares",
    "NormShares",
    "RawUsage",
    "NormUsage",
    "EffectvUsage",
    "FairShare",
    "LevelFS",
    "GrpTRESMins",
    "TRESRunMins",
)


@dataclass(frozen=True)
class ShareRow:
    """One association as sshare reported it. ``user`` is None for an account."""

    account: str
    user: str | None
    parent: str | None
    depth: int
    raw_shares: int | None
    shares_parent: bool
    norm_shares: float | None
    raw_usage: int | None
    effective_usage: float | None
    fairshare: float | None
    level_fs: float | None
    exact_usage: bool = False  # effective_usage is Slurm's double (JSON), not %f text

    @property
    def key(self) -> tuple[str, str]:
        return (self.account, self.user or "")


def parse(lines: Iterable[str], *, source: str = "sshare output") -> list[ShareRow]:
    """Rows in sshare's order, with each row's parent account recovered from the indentation.

    With a header line the columns are taken from it; without one the
    default ``-l`` Fair Tree columns are assumed.
    """
    it = iter(lines)
    first = next((ln for ln in it if ln.strip()), None)
    if first is None:
        return []
    fields, pending = _header(first)
    col = {name.lower(): i for i, name in enumerate(fields)}
    for need in ("account", "user", "rawshares", "rawusage"):
        if need not in col:
            raise SlurmParseError(f"{source}: sshare output has no {need} column")
    body = ([first] if pending else []) + list(it)
    stack: list[str] = []
    out = []
    for number, f in enumerate(rows(body, len(fields), source), 1):
        out.append(_row(f, col, stack, number, source))
    return out


def _header(line: str) -> tuple[tuple[str, ...], bool]:
    names = tuple(line.rstrip("\r\n").split("|"))
    if names and names[-1] == "":
        names = names[:-1]
    if names[:2] == ("Account", "User"):
        return names, False
    return LONG_FIELDS, True


def _row(f: list[str], col: dict[str, int], stack: list[str], number: int, source: str) -> ShareRow:
    text = f[col["account"]]
    name = text.lstrip(" ")
    depth = len(text) - len(name)
    user = f[col["user"]] or None
    if user is None:
        del stack[depth:]
        if len(stack) != depth:
            raise SlurmParseError(
                f"{source} row {number}: account {name!r} is indented {depth} but its parent is missing"
            )
        parent = stack[-1] if stack else None
        stack.append(name)
    else:
        if depth < 1 or len(stack) < depth or stack[depth - 1] != name:
            raise SlurmParseError(f"{source} row {number}: user {user!r} of {name!r} does not follow its account")
        parent = name
    raw = f[col["rawshares"]]

    def num(key: str) -> float | None:
        return parse_float(f[col[key]]) if key in col else None

    return ShareRow(
        account=name,
        user=user,
        parent=parent,
        depth=depth,
        raw_shares=None if raw in ("", "parent") else int(raw),
        shares_parent=raw == "parent",
        norm_shares=num("normshares"),
        raw_usage=parse_int(f[col["rawusage"]]),
        effective_usage=num("effectvusage"),
        fairshare=num("fairshare"),
        level_fs=num("levelfs"),
    )


_USE_PARENT = 0x7FFFFFFF  # SLURMDB_FS_USE_PARENT, what JSON prints as the shares of FairShare=parent


def parse_json(stream: IO, *, source: str = "sshare --json") -> list[ShareRow]:
    """Rows from ``sshare --json`` (data_parser v0.0.42: ``{"shares": {"shares": [...]}}``).

    JSON carries the effective usage and LevelFS as full doubles, so a
    recomputation from it can match slurmctld to rounding; RawUsage is
    still truncated to an integer there.
    """
    doc = json.load(stream)
    items = ((doc.get("shares") or {}).get("shares")) if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SlurmParseError(f"{source}: no shares.shares list")
    depth: dict[str, int] = {}
    out = []
    for item in items:
        out.append(_json_row(item, depth))
    return out


def _json_row(item: dict, depth: dict[str, int]) -> ShareRow:
    is_user = "USER" in (item.get("type") or [])
    name, parent = item.get("name") or "", item.get("parent") or None
    shares = _num(item.get("shares"))
    fs = item.get("fairshare") or {}
    level = depth.get(parent, -1) + 1 if parent else 0
    if not is_user:
        depth[name] = level
    return ShareRow(
        account=(parent or "") if is_user else name,  # a user's association always names its account
        user=name if is_user else None,
        parent=parent,
        depth=level,
        raw_shares=None if shares in (None, _USE_PARENT) else int(shares),
        shares_parent=shares == _USE_PARENT,
        norm_shares=_num(item.get("shares_normalized")),
        raw_usage=item.get("usage"),
        effective_usage=_num(item.get("effective_usage")),
        fairshare=_num(fs.get("factor")) if is_user else None,
        level_fs=_num(fs.get("level")),
        exact_usage=True,
    )


def _num(value):
    """data_parser's {"set", "infinite", "number"}: None when unset, inf when infinite."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return math.inf
        return value.get("number") if value.get("set") else None
    return value


def read(path) -> list[ShareRow]:
    """A recorded sshare file: ``--json`` if it starts with ``{``, ``-l --parsable2`` otherwise."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        return parse_json(io.StringIO(text), source=str(path))
    return parse(io.StringIO(text), source=str(path))


def query(runner: Runner, *, as_json: bool = False) -> list[ShareRow]:
    """The live association tree from slurmctld (needs an operator, or PrivateData without usage).

    ``as_json`` asks for ``sshare --json`` (Slurm 24.11+), whose doubles are
    exact; the default parsable2 text is what every supported release has.
    """
    if as_json:
        return parse_json(io.StringIO(runner(list(JSON_ARGV)).stdout), source="sshare --json")
    return parse(io.StringIO(runner(list(ARGV)).stdout), source="sshare")
