"""The merged job_container.conf: the site's own file, with gpushare-ns-caps as the clone script of the
policy's nodes (pure).

Per-job MIG isolation needs the job container plugin (job_container/tmpfs; namespace/tmpfs from 25.11, which
reads the same job_container.conf, in 26.05 too) to run ``gpushare-ns-caps`` as ``CloneNSScript`` on the
policy's nodes. How slurmd reads the file (read_jcconf.c, the same in 24.11 and 26.05): a ``BasePath=`` line
applies to every node, a ``NodeName=<nodes> BasePath=...`` line to its nodes; every line that applies is
read in order, each option it sets replacing the one before (an option it does not set is kept);
``CloneNSScript``, ``CloneNSEpilog`` and ``InitScript`` count only on such a line; ``Dirs``,
``AutoBasePath``, ``Shared``, ``EntireStepInNS`` and the waits on a line of their own apply where no line
sets them. Slurm runs one clone script per node.

So the site's lines stay as written, for every node, and a block at the end (``merge.BEGIN``/``END``,
taken out again by ``merge.unmerge``) gives the policy's nodes one line each kind of them: the site's
options for those nodes as they stand (its BasePath, AutoBasePath, Dirs, its own InitScript or
CloneNSEpilog) with our CloneNSScript and a CloneNSScript_Wait of at least ours. Nodes the site's file
gives no BasePath get the product's line. A site clone script on the policy's nodes is refused unless
``--take-over CloneNSScript`` (gpushare-ns-caps does not run another script); ``BasePath=none`` there (the
container turned off) is refused. Nodes outside the policy keep the site's file as it was.
"""

from __future__ import annotations

from hostlist import collect_hostlist, expand_hostlist

from ..render.header import header_ok
from . import conf
from .conf import Line, Pair
from .merge import BEGIN, CHAIN, END, OWNED, Change, Options, unmerge

NAME = "job_container.conf"
# the options slurmd reads on a BasePath= or NodeName= line (read_jcconf.c _create_ns_hashtbl)
LINE_KEYS = frozenset(
    {
        "basepath",
        "autobasepath",
        "dirs",
        "entirestepinns",
        "initscript",
        "shared",
        "clonensscript",
        "clonensepilog",
        "clonensscript_wait",
        "clonensepilog_wait",
    }
)
Seen = tuple[tuple[Pair, ...], Line | None]  # the options a node's lines give it, and the last of those lines


def plan_job_container(current: str | None, ours: str, opts: Options) -> tuple[str, list[Change], list[str]]:
    """The file to write, its changes and refusals. ``current``: the file today (None: none); ``ours``: the
    rendered job_container.conf (one BasePath line)."""
    ours_line = next(line for line in conf.parse(ours) if line.first is not None and line.first.name == "basepath")
    site_text = "" if current is None or header_ok(current) else unmerge(current)
    site = conf.parse(site_text, NAME)
    site_globals = {p.name for line in site if _applies_to(line) is None for p in line.pairs}
    block: list[str] = []
    changes: list[Change] = []
    refusals: list[str] = []
    for (fields, last), nodes in _effective(site, sorted(opts.policy_nodes)).items():
        names = collect_hostlist(nodes)
        if not any(p.name == "basepath" for p in fields):
            pairs = [p for p in ours_line.pairs if p.name not in site_globals]
            block.append(conf.render_pairs([Pair("NodeName", names), *pairs]))
            why = "per-job MIG isolation: gpushare-ns-caps in each job's mount namespace"
            if site_text:
                why += " (the site's file gives these nodes no BasePath)"
            changes.append(Change(OWNED, f"{NAME} NodeName={names}", None, block[-1], why))
            continue
        line, change, refusal = _merged_line(names, fields, last, ours_line, opts)
        block += [line] if line else []
        changes += [change] if change else []
        refusals += [refusal] if refusal else []
    if not block:
        return site_text, changes, refusals
    head = site_text if not site_text or site_text.endswith("\n") else site_text + "\n"
    return head + "\n".join([BEGIN, *block, END]) + "\n", changes, refusals


def _applies_to(line: Line) -> str | None:
    """'*' for a BasePath= line, the node list of a NodeName= line, None for any other."""
    first = line.first
    if first is None:
        return None
    if first.name == "basepath":
        return "*"
    return first.value if first.name == "nodename" else None


def _effective(site: list[Line], nodes: list[str]) -> dict[Seen, list[str]]:
    """The policy's nodes by the options the site's lines give them (each node's lines read in order)."""
    expanded = {line.number: set(expand_hostlist(n)) for line in site if (n := _applies_to(line)) not in (None, "*")}
    out: dict[Seen, list[str]] = {}
    for node in nodes:
        fields: dict[str, Pair] = {}
        last = None
        for line in site:
            scope = _applies_to(line)
            if scope == "*" or (scope is not None and node in expanded[line.number]):
                fields.update((p.name, p) for p in line.pairs if p.name in LINE_KEYS)
                last = line
        out.setdefault((tuple(fields.values()), last), []).append(node)
    return out


def _merged_line(
    names: str, fields: tuple[Pair, ...], last: Line | None, ours: Line, opts: Options
) -> tuple[str | None, Change | None, str | None]:
    """The block's line for nodes the site's lines give a BasePath: theirs, with our clone script."""
    have = {p.name: p for p in fields}
    script, wait = ours.get("CloneNSScript") or "", ours.get("CloneNSScript_Wait") or "0"
    where = last.where if last is not None else NAME
    refusal = _refusal(have, where, names, script, opts)
    if refusal:
        return None, None, refusal
    new = {k: p for k, p in have.items() if k not in ("clonensscript", "clonensscript_wait")}
    new["clonensscript"] = Pair("CloneNSScript", script)
    longest = max(_seconds(have.get("clonensscript_wait")), int(wait))
    new["clonensscript_wait"] = Pair("CloneNSScript_Wait", str(longest))
    if new == have:
        return None, None, None
    text = conf.render_pairs([Pair("NodeName", names), *new.values()])
    kept = ", ".join(f"{p.key}={p.value}" for p in fields if p.name not in ("clonensscript", "clonensscript_wait"))
    why = f"the site's {kept} kept ({where}); CloneNSScript={script} for per-job MIG isolation"
    taken = "clonensscript" in have and have["clonensscript"].value != script
    if taken:
        why += " (taken over: the site's clone script no longer runs on these nodes)"
    old = last.raw.strip() if last else None
    return text, Change(OWNED if taken else CHAIN, f"{NAME} NodeName={names}", old, text, why), None


def _refusal(have: dict[str, Pair], where: str, names: str, script: str, opts: Options) -> str | None:
    """The container turned off on the policy's nodes, or a clone script of the site's there not taken over."""
    base = have["basepath"].value
    if base.lower().startswith("none"):
        return (
            f"{NAME}: BasePath={base} ({where}) turns the job container off on {names}, where per-job MIG "
            "isolation needs it: give those nodes a BasePath, or set isolation: none in the policy"
        )
    theirs = have.get("clonensscript")
    if theirs is None or theirs.value == script or opts.may_take("CloneNSScript"):
        return None
    return (
        f"{NAME}: CloneNSScript={theirs.value} is the site's ({where}) on {names}; Slurm runs one clone script "
        f"and per-job MIG isolation needs {script}, which runs no other. Pass --take-over CloneNSScript to run "
        "ours on the policy's nodes (the site's keeps running on every other node), or set isolation: none in "
        "the policy"
    )


def _seconds(pair: Pair | None) -> int:
    try:
        return int(pair.value) if pair is not None else 0
    except ValueError:
        return 0
