"""job_submit.lua: a generated prelude (the policy as Lua tables) followed by the static program.

The program is ``slurm_gpushare/submit/job_submit.lua``, beside its Python
twin (``submit/parse.py`` and ``submit/decide.py``), a plain Lua file that Lua
tools and editors read; it is shipped unchanged. Only the prelude is rendered
(``templates/job_submit.prelude.lua.j2``): the tables as literals (built once
when slurmctld loads the script, never per job), and the messages and codes of
``submit/tables.py`` as Lua functions of their values, so the program holds
the rules' logic and no text. tests/cases/submit.yaml runs through both
twins and requires the same decision, codes, messages and rewrites;
tests/unit/submit/test_messages.py requires that each message is used on
both sides.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

from ..policy import Site
from ..policy.share import Mode
from ..submit import tables as tb
from ..submit.tables import Tables, build_tables
from .env import environment
from .header import with_header

NAME = "job_submit.lua"
PROGRAM = "job_submit.lua"  # the static program, a file of the slurm_gpushare.submit package
PRELUDE = "job_submit.prelude.lua.j2"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = frozenset(
    "and break do else elseif end false for function goto if in local nil not or repeat return then true until "
    "while".split()
)


def lua_data(t: Tables) -> dict:
    """Everything job_submit.lua reads, as plain data; sets are emitted as {key = true} so no Lua builds them.
    Per-job MIG's tables only where a tier has per-job GPUs (the program reads their absence as none)."""
    return _per_job_data(t) | {
        "prefix": t.prefix,
        "reject_multi_slice": t.reject_multi_slice,
        "fail_open": t.fail_open,
        "route_by_gres": t.route_by_gres,
        "set_gpu_type": t.set_gpu_type,
        "max_len": tb.MAX_LEN,
        "max_count": tb.MAX_COUNT,
        "max_type_len": tb.MAX_TYPE_LEN,
        "suffixes": dict(tb.SUFFIXES),
        "passthrough_names": {n: True for n in tb.PASSTHROUGH_NAMES},
        "passthrough_prefixes": {p.rstrip("/"): True for p in tb.PASSTHROUGH_PREFIXES},
        "fields": list(tb.FIELDS),
        "per": dict(tb.PER),
        "kinds": list(tb.KINDS),
        "join": dict(tb.JOIN),
        "gres_names": {n: True for n in tb.GRES_NAMES},
        "gpu_types": list(t.gpu_types),
        "gpu_type_set": {x: True for x in t.gpu_types},
        "shared": t.shared,
        "aliases": {k: {"name": a.name, "type": a.type, "per": a.per} for k, a in t.aliases.items()},
        "texts": dict(t.texts),
        "tiers": _lua_tiers(t),
        "feature_set": {f: True for f in t.features},
        "model_features": list(t.model_features),
        "tier_index": {x.name: i + 1 for i, x in enumerate(t.tiers)},
        "default_tier": next(i + 1 for i, x in enumerate(t.tiers) if x.is_default),
        "routes": [
            {
                "gres": r.gres,
                "qos": {q: True for q in r.qos},
                "min_gpus": r.min_gpus,
                "max_gpus": r.max_gpus,
                "min_cpus": r.min_cpus,
                "partition": ",".join(r.tiers),
                "round_mig": r.round_to == Mode.MIG,
                "cover": [{"pct": pct, "type": gtype} for pct, gtype in r.mig_cover],
            }
            for r in t.routes
        ],
    }


def _lua_tiers(t: Tables) -> list[dict]:
    return [
        {
            "name": x.name,
            "is_default": x.is_default,
            "gpu": list(x.gpu),
            "gpu_set": {g: True for g in x.gpu},
            "shared": x.shared,
            "whole": list(x.whole),
            "whole_set": {g: True for g in x.whole},
            "untyped": x.untyped,
            "set_qos": x.set_qos,
            **_lua_slices(x.slices, next(iter(x.slices), "")),
            "groups": [
                {
                    "name": g.name,
                    "model": g.model,
                    "feature_set": {f: True for f in g.features},
                    "gpu": list(g.gpu),
                    "shared": g.shared,
                    "whole": list(g.whole),
                    **_lua_slices(g.slices),
                }
                for g in x.groups
            ],
        }
        for x in t.tiers
    ]


def per_job(t: Tables) -> bool:
    """Whether any tier has per-job MIG GPUs: only then does the prelude hold per-job MIG's tables and texts."""
    return any(x.slices for x in t.tiers)


def _per_job_data(t: Tables) -> dict:
    return {"record_field": tb.RECORD_FIELD, "record_prefix": tb.RECORD_PREFIX} if per_job(t) else {}


def _lua_slices(slices: dict[str, tuple[int, str]], example: str | None = None) -> dict:
    """Per-job MIG slice types (tables.TierCaps.slices) as ``slices``: type -> {weight, profile}, and a tier's
    ``slice_example``; nothing where there are none."""
    if not slices:
        return {}
    out: dict = {"slices": {k: {"weight": w, "profile": p} for k, (w, p) in slices.items()}}
    return out | ({"slice_example": example} if example is not None else {})


def _texts(texts: dict[str, str], t: Tables) -> dict[str, str]:
    """The messages or codes the prelude holds: per-job MIG's only where the site has per-job GPUs."""
    return texts if per_job(t) else {k: v for k, v in texts.items() if not k.startswith("per_job_")}


def lua_function(template: str) -> str:
    """A message of submit/tables.py as a Lua function of its values: one concatenation, no loop.

    ``v.name .. "text"``: Lua writes an integer value as its digits on 5.1 and
    5.4 alike (every number a message shows is a count below 2^32), and a
    missing value is an error, which fails the job closed.
    """
    parts = []
    for i, piece in enumerate(tb.pieces(template)):
        if i % 2:
            parts.append(f"v.{piece}" if piece not in _KEYWORDS else f"v[{lua_string(piece)}]")
        elif piece:
            parts.append(lua_string(piece))
    return "function(v) return " + (" .. ".join(parts) or '""') + " end"


def lua_texts(texts: dict[str, str]) -> str:
    """Named messages as a Lua table of functions (sorted by name), one a line."""
    items = "".join(f"  {_key(name)} = {lua_function(text)},\n" for name, text in sorted(texts.items()))
    return "{\n" + items + "}"


def lua_string(text: str) -> str:
    """A double-quoted Lua 5.1/5.4 string literal; control bytes as \\ddd (both versions read it)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _IDENT.fullmatch(key) and key not in _KEYWORDS else f"[{lua_string(key)}]"


def to_lua(value, indent: int = 0) -> str:
    """Python data as a Lua table constructor: dict keys sorted, lists in order; short tables on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, dict):
        items = [f"{_key(str(k))} = {to_lua(v, indent + 1)}" for k, v in sorted(value.items())]
    elif isinstance(value, (list, tuple)):
        items = [to_lua(v, indent + 1) for v in value]
    else:
        raise TypeError(f"cannot write {type(value).__name__} as Lua")
    flat = "{ " + ", ".join(items) + " }" if items else "{}"
    if len(flat) + 2 * indent <= 100 and "\n" not in flat:
        return flat
    pad = "  " * (indent + 1)
    return "{\n" + "".join(f"{pad}{item},\n" for item in items) + "  " * indent + "}"


@lru_cache(maxsize=1)
def program() -> str:
    """The static program text (submit/job_submit.lua), read from the installed package."""
    return resources.files("slurm_gpushare.submit").joinpath(PROGRAM).read_text(encoding="utf-8")


def prelude(site: Site, data: dict | None = None) -> str:
    """The generated part: P (policy tables), M (messages) and C (codes) as Lua locals.

    ``data`` replaces the policy tables (tests inject broken ones).
    """
    tables = build_tables(site)
    data = lua_data(tables) | site_lua_data(site) if data is None else data
    messages = lua_texts(_texts({**tb.MESSAGES, **tb.SCRIPT_MESSAGES}, tables))
    codes = lua_texts(_texts(tb.CODES, tables))
    return (
        environment()
        .get_template(PRELUDE)
        .render(version=site.version, tables=to_lua(data), messages=messages, codes=codes)
    )


def site_lua_data(site: Site) -> dict:
    """The site's own job_submit.lua the program chains (policy submission.site_lua), when there is one."""
    chained = site.policy.submission.site_lua
    return {} if chained is None else {"site_lua": {"path": chained.path, "order": chained.order}}


def render_body(site: Site, data: dict | None = None) -> str:
    """The script without its header: the prelude, a blank line, the program."""
    return prelude(site, data) + "\n" + program()


def job_submit_lua(site: Site) -> str:
    """The whole job_submit.lua, with the generated-by header in Lua comments."""
    return with_header(site, NAME, render_body(site), comment="--")
