"""Reading the GRES part of Slurm's tres_per_* strings, as job_submit sees them.

Accepted entry forms (comma-separated): ``gres/gpu:a100:2`` (23.11+),
``gres:gpu:2`` (before), bare ``gpu:2``, and ``gres/gpu=2``. A count is
optional (default 1) and may carry k/m/g/t/p (x1024^n) as Slurm allows.
Non-GRES TRES such as 23.11's ``cpu=4`` in tres_per_task are kept verbatim.

Every problem is reported as one message naming the field; job_submit.lua
implements exactly this grammar (tests/lua run the same corpus).
"""

from __future__ import annotations

import re

from .entries import Gres, Other
from .tables import (
    GRES_NAMES,
    MAX_COUNT,
    MAX_LEN,
    MAX_TYPE_LEN,
    PASSTHROUGH_NAMES,
    PASSTHROUGH_PREFIXES,
    SUFFIXES,
    message,
)

_COUNT = re.compile(r"([0-9]+)([kKmMgGtTpP]?)")
_NEGATIVE = re.compile(r"-[0-9]+")
_HEAD = re.compile(r"([a-z]+)([=:/])")
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_GRES_NAMES_TEXT = ", ".join(GRES_NAMES)  # the same words as Tables.texts['gres_names']


class BadRequest(ValueError):
    """A tres_per_* string that is not a GRES request; the message names the field."""


def is_passthrough(raw: str) -> bool:
    """cpu=4, mem:2G, license/x:1 ...: a lower-case TRES name, then '=' or ':' (or '/' for a prefix)."""
    m = _HEAD.match(raw)
    if m is None:
        return False
    return m[1] + "/" in PASSTHROUGH_PREFIXES if m[2] == "/" else m[1] in PASSTHROUGH_NAMES


def parse_count(field: str, raw: str, text: str) -> int:
    if _NEGATIVE.fullmatch(text):
        raise BadRequest(message("negative", field=field, raw=raw))
    m = _COUNT.fullmatch(text)
    if m is None:
        raise BadRequest(message("not_count", field=field, raw=raw, text=text))
    digits, suffix = m[1], m[2].lower()
    if len(digits.lstrip("0")) > 10:
        raise BadRequest(message("too_many", field=field, raw=raw, max=MAX_COUNT))
    n = int(digits)
    if n == 0:
        raise BadRequest(message("zero", field=field, raw=raw))
    if n > MAX_COUNT // SUFFIXES[suffix]:
        raise BadRequest(message("too_many", field=field, raw=raw, max=MAX_COUNT))
    return n * SUFFIXES[suffix]


def _split_count(body: str) -> tuple[list[str], str | None, bool]:
    """(name/type parts, count text or None, whether a type slot was written)."""
    eq = body.rfind("=")
    if eq >= 0:
        parts = body[:eq].split(":")
        return parts, body[eq + 1 :], len(parts) >= 2
    parts = body.split(":")
    if len(parts) == 3:
        return parts[:2], parts[2], True
    if len(parts) == 2 and (_COUNT.fullmatch(parts[1]) or _NEGATIVE.fullmatch(parts[1])):
        return parts[:1], parts[1], False
    return parts, None, len(parts) >= 2


def parse_entry(field: str, raw: str) -> Gres | Other:
    if is_passthrough(raw):
        return Other(raw)
    body = raw[5:] if raw.startswith(("gres/", "gres:")) else raw
    parts, count_text, typed = _split_count(body)
    name = parts[0]
    if name not in GRES_NAMES:
        raise BadRequest(message("not_gres", field=field, raw=raw, name=name, known=_GRES_NAMES_TEXT))
    if len(parts) > 2:
        raise BadRequest(message("bad_form", field=field, raw=raw))
    gtype = parts[1] if typed else ""
    if typed and (len(gtype) > MAX_TYPE_LEN or not _TYPE.fullmatch(gtype)):
        raise BadRequest(message("bad_type", field=field, raw=raw, type=gtype, max=MAX_TYPE_LEN))
    count = 1 if count_text is None else parse_count(field, raw, count_text)
    return Gres(field, name, gtype, count, raw)


def parse_field(field: str, text: str) -> list[Gres | Other]:
    """All entries of one tres_per_* string; BadRequest on the first problem."""
    if not isinstance(text, str):
        raise BadRequest(message("not_string", field=field))
    size = len(text.encode("utf-8"))  # Slurm (and Lua) count bytes
    if size > MAX_LEN:
        raise BadRequest(message("too_long", field=field, size=size, max=MAX_LEN))
    if text == "":
        raise BadRequest(message("empty", field=field))
    entries = text.split(",")
    if "" in entries:
        raise BadRequest(message("empty_entry", field=field, text=text))
    return [parse_entry(field, raw) for raw in entries]
