"""The merged slurm.conf: the site's own file with the product's include, planned as text (pure).

Slurm reads an ``Include`` where it stands, and a key set twice logs an error and keeps the last
value (src/common/parse_config.c), so the site's slurm.conf keeps every line the product does not
need and ends with a block that includes slurm-gpushare.conf. Each key of the include is one of:

- owned: the product's value; a site line with another value is refused unless ``--take-over KEY``;
- union: the site's items kept, the product's added (a value the two give the same item differently
  is refused unless taken over);
- chain: Prolog/Epilog lines are all run (slurmd runs every ``Prolog=`` line in the order it reads
  them, a glob's matches in reverse alphabetical order, and stops at the first that fails:
  src/plugins/prep/script/prep_script_slurmd.c in 24.11 and 26.05), so the site's prologs run before
  ours and its epilogs after ours; HealthCheckProgram is one program, so ours runs the site's
  (``cluster.health.site_program``);
- site: every key and line the include does not set, left as written.

A site line the include replaces is commented out with ``#gpushare# `` in front; the block at the
end holds what the merge adds. ``unmerge`` gives back the site's file, so a second install starts
from it and gives the same result.

The files slurm.conf includes (``includes.resolve``) are the site's too, and are never edited: the block
is read after them, so the include's keys win there as well (a key also set in such a file is noted:
Slurm logs it as set twice). What Slurm would refuse to read twice (a tier's partition, a policy node,
the product's own prolog or epilog defined in such a file) is refused, naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostlist import collect_hostlist, expand_hostlist

from . import conf, includes
from .conf import Line, Pair
from .includes import Reader, no_files

OWNED, UNION, CHAIN, SITE = "owned", "union", "chain", "site"
COMMENTED = "#gpushare# "
BEGIN = "# ---- slurm-gpushare: added by `gpushare install` (`gpushare install --rollback` takes it out) ----"
END = "# ---- end of slurm-gpushare ----"

# key (as slurm.conf(5) spells it) -> how the merge treats it, and why. Keys of the include not listed are owned.
KEYS: dict[str, tuple[str, str]] = {
    "GresTypes": (UNION, "the site's GRES stay declared; the product adds gpu, shard, mps"),
    "PrologFlags": (UNION, "flags combine; Alloc/Contain are what the product's prolog needs"),
    "AccountingStorageTRES": (UNION, "the site's TRES (licences, billing) stay accounted"),
    "JobSubmitPlugins": (UNION, "the site's plugins stay; lua is added (a site job_submit.lua is chained)"),
    "SchedulerParameters": (UNION, "the site's options stay; the product adds its own"),
    "JobAcctGatherParams": (UNION, "the site's options stay; per-job MIG adds DisableGPUAcct"),
    "Prolog": (CHAIN, "every Prolog= line runs: the site's first, then the product's"),
    "Epilog": (CHAIN, "every Epilog= line runs: the product's first, then the site's"),
    "HealthCheckProgram": (CHAIN, "one program: the product's, which runs cluster.health.site_program first"),
    "SelectType": (OWNED, "GPU sharing needs select/cons_tres"),
    "SelectTypeParameters": (OWNED, "the product's memory and core accounting"),
    "PriorityType": (OWNED, "fair share by GPU-equivalents needs priority/multifactor"),
    "PreemptType": (OWNED, "GPU jobs are preempted by requeue or cancel, never suspended"),
    "PreemptMode": (OWNED, "GPU jobs are preempted by requeue or cancel, never suspended"),
    "TaskProlog": (OWNED, "one program: the product's sets the job's GPU variables"),
}
_KINDS = {k.lower(): v for k, v in KEYS.items()}
DEF_MEM = ("defmempercpu", "defmempergpu", "defmempernode")  # slurm.conf(5): mutually exclusive


@dataclass(frozen=True)
class Change:
    kind: str
    key: str
    old: str | None
    new: str | None
    why: str

    def __str__(self) -> str:
        old = "(unset)" if self.old is None else self.old
        new = "(unset)" if self.new is None else self.new
        return f"{self.kind:5} {self.key}: {old} -> {new}: {self.why}"


@dataclass(frozen=True)
class Options:
    """What the merge may do: the keys it may take over (lower case), everything with ``force``; the
    site's health program as the policy records it; the include's file name."""

    policy_nodes: frozenset[str]
    take_over: frozenset[str] = frozenset()
    force: bool = False
    site_health: str | None = None
    include: str = "slurm-gpushare.conf"

    def may_take(self, key: str) -> bool:
        return self.force or key.lower() in self.take_over


@dataclass
class Merged:
    """The merged slurm.conf, the include as merged, every change, and what was refused."""

    slurm_conf: str = ""
    fragment: str = ""
    changes: list[Change] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    commented: dict[int, str] = field(default_factory=dict)  # site line number -> why
    tail: list[str] = field(default_factory=list)  # lines after the Include in the block
    notes: list[str] = field(default_factory=list)
    site: list[Line] = field(default_factory=list)  # every site line, included files' too, as Slurm reads them
    included: list[includes.Included] = field(default_factory=list)  # the files slurm.conf includes


def unmerge(text: str) -> str:
    """The site's own slurm.conf from a merged one: the block taken out, commented lines given back."""
    out, inside = [], False
    for raw in text.splitlines(keepends=True):
        bare = raw.rstrip("\r\n")
        if bare == BEGIN:
            inside = True
        elif bare == END:
            inside = False
        elif not inside:
            out.append(raw[len(COMMENTED) :] if raw.startswith(COMMENTED) else raw)
    return "".join(out)


def plan_slurm_conf(
    site_text: str, fragment: str, opts: Options, read: Reader = no_files, directory: str = "."
) -> Merged:
    """The merged slurm.conf and include for ``site_text`` (a merged file is unmerged first), with the files
    it includes read through ``read`` (relative names relative to ``directory``, slurm.conf's)."""
    resolved = includes.resolve(unmerge(site_text), directory, read)
    site = resolved.lines
    merged = Merged(site=site, included=resolved.files)
    _read_problems(resolved, directory, opts, merged)
    site_keys = conf.keys(site)
    frag_out, frag = [], conf.parse(fragment)
    site_default = _site_default(site, frag, opts, merged)
    for line in frag:
        if line.record == "partitionname":
            frag_out.append(_partition(_not_default(line) if site_default else line, site, opts, merged))
        elif line.record is None and line.pairs and line.first is not None and line.first.name != "include":
            frag_out.append(_key(line.first, site_keys.get(line.first.name, []), opts, merged))
        else:
            frag_out.append(line.raw)
    _nodes(site, opts, merged)
    merged.fragment = "\n".join(frag_out) + "\n"
    merged.slurm_conf = _assemble(site, opts, merged)
    return merged


def _read_problems(resolved: includes.Resolved, directory: str, opts: Options, merged: Merged) -> None:
    """What Slurm could not read is refused (--force reads on without it); an include of the product's own
    file outside the block would define its nodes and partitions twice."""
    for problem in resolved.problems:
        if opts.force:
            merged.notes.append(f"{problem}; read on without it (--force)")
        else:
            merged.refusals.append(f"{problem}: fix slurm.conf first (or --force to merge without that file)")
    ours = f"{directory.rstrip('/')}/{opts.include}"
    for entry in resolved.files:
        if entry.path == ours:
            merged.refusals.append(
                f"{entry.by.where} includes {opts.include} itself: take that line out (`gpushare install` adds "
                "its own Include at the end of slurm.conf)"
            )


def _assemble(site: list[Line], opts: Options, merged: Merged) -> str:
    top = [line for line in site if not line.included]
    out = [COMMENTED + line.raw if line.number in merged.commented else line.raw for line in top]
    out += [BEGIN, f"Include {opts.include}", *merged.tail, END]
    return "\n".join(out) + "\n"


def _comment(entries: list[tuple[Line, Pair]], merged: Merged, why: str) -> None:
    """Comment out the site's lines in slurm.conf; a line in an included file stays, and is noted."""
    for line, pair in entries:
        if not line.included:
            merged.commented[line.number] = why
            continue
        merged.notes.append(
            f"{pair.key}={pair.value} is also set in {line.where}, which gpushare never edits: the include is read "
            f"after it and its value is the one Slurm keeps; Slurm logs {pair.key} as set more than once until "
            "that line is taken out"
        )


def _key(pair: Pair, entries: list[tuple[Line, Pair]], opts: Options, merged: Merged) -> str:
    """The include's line for one key, merged with the site's lines that set it."""
    kind, why = _KINDS.get(pair.name, (OWNED, "the product's setting"))
    ours = conf.render_pairs([pair])
    if not entries:
        merged.changes.append(Change(kind, pair.key, None, pair.value, f"added: {why}"))
        return ours
    if kind == UNION:
        return _union(pair, entries, opts, merged, why)
    if pair.name in ("prolog", "epilog"):
        _chain_script(pair, entries, opts, merged)
        return ours
    if pair.name == "healthcheckprogram":
        _chain_health(pair, entries, opts, merged)
        return ours
    site_value = entries[-1][1].value
    if site_value.lower() == pair.value.lower():
        _comment(entries, merged, "same value, set once in the include")
        merged.changes.append(Change(kind, pair.key, site_value, pair.value, "same value; now set in the include"))
    elif opts.may_take(pair.key):
        _comment(entries, merged, "taken over")
        merged.changes.append(Change(kind, pair.key, site_value, pair.value, f"taken over: {why}"))
    else:
        merged.refusals.append(_refusal(pair.key, site_value, pair.value, entries[-1][0], why))
    return ours


def _refusal(key: str, site_value: str, ours: str, line: Line, why: str) -> str:
    return (
        f"{key}={site_value} is the site's ({line.where}); slurm-gpushare sets {key}={ours} ({why}). "
        f"Pass --take-over {key} to replace it, or keep the site's value and change the policy"
    )


def _item_name(item: str) -> str:
    return item.split("=", 1)[0].strip().lower()


def _union(pair: Pair, entries: list[tuple[Line, Pair]], opts: Options, merged: Merged, why: str) -> str:
    """The site's items in its order, then the product's that are new; one item given two values is refused."""
    site_value = entries[-1][1].value
    items = {_item_name(i): i for i in conf.items(site_value)}
    conflicts = []
    for item in conf.items(pair.value):
        name = _item_name(item)
        if name in items and items[name].lower() != item.lower():
            conflicts.append(f"{items[name]} (the product's: {item})")
            if not opts.may_take(pair.key):
                continue
        items[name] = item
    if conflicts and not opts.may_take(pair.key):
        merged.refusals.append(
            f"{pair.key}: the site's {', '.join(conflicts)} ({entries[-1][0].where}); pass --take-over "
            f"{pair.key} for the product's values, or change the policy"
        )
    value = ",".join(items.values())
    problem = _flag_conflict(pair.name, items)
    if problem:
        merged.refusals.append(f"{pair.key}={value}: {problem} ({entries[-1][0].where})")
    _comment(entries, merged, "merged into the include")
    note = "nothing added" if value == site_value else why
    merged.changes.append(Change(UNION, pair.key, site_value, value, note))
    return conf.render_pairs([Pair(pair.key, value, pair.quoted)])


def _flag_conflict(name: str, items: dict[str, str]) -> str | None:
    """PrologFlags that slurmctld refuses to start with (read_config.c: NoHold with Contain or X11)."""
    if name == "prologflags" and "nohold" in items and {"contain", "x11", "runinjob"} & set(items):
        return (
            "slurmctld is fatal on NoHold with Contain (the product's prolog needs Contain with cgroups); "
            "take NoHold out of the site's PrologFlags"
        )
    return None


def _chain_script(pair: Pair, entries: list[tuple[Line, Pair]], opts: Options, merged: Merged) -> None:
    """Every Prolog=/Epilog= line runs, in the order read: the site's prologs stay before the include,
    its epilogs move after it (ours undo the job's GPU state first)."""
    what = pair.key
    for line, site in entries:
        if line.included:
            _chain_included(pair, line, site, opts, merged)
        elif site.value == pair.value:
            merged.commented[line.number] = "the product's own, set in the include"
            merged.changes.append(Change(CHAIN, what, site.value, pair.value, "the product's own; set once"))
        elif pair.name == "prolog":
            merged.changes.append(
                Change(CHAIN, what, site.value, f"{site.value}, then {pair.value}", "the site's prolog runs first")
            )
        else:
            merged.commented[line.number] = "moved after the include: runs after the product's epilog"
            merged.tail.append(line.raw.strip())
            merged.changes.append(
                Change(CHAIN, what, site.value, f"{pair.value}, then {site.value}", "the site's epilog runs after")
            )


def _chain_included(pair: Pair, line: Line, site: Pair, opts: Options, merged: Merged) -> None:
    """A Prolog=/Epilog= line in an included file stays where it is, read before the include: a prolog
    runs before ours as in slurm.conf; an epilog would run before ours, and ours twice is refused."""
    if site.value == pair.value:
        merged.refusals.append(
            f"{pair.key}={site.value} ({line.where}) is the product's own, which the include sets too: it would run "
            f"twice; take that line out of {line.file}"
        )
    elif pair.name == "prolog":
        why = f"the site's prolog ({line.where}) runs first"
        merged.changes.append(Change(CHAIN, pair.key, site.value, f"{site.value}, then {pair.value}", why))
    elif opts.may_take(pair.key):
        why = f"--take-over {pair.key}: the site's epilog ({line.where}) runs first; if it fails, ours does not"
        merged.changes.append(Change(CHAIN, pair.key, site.value, f"{site.value}, then {pair.value}", why))
    else:
        merged.refusals.append(
            f"{pair.key}={site.value} is the site's ({line.where}, read before the include, which gpushare never "
            f"edits): it would run before the product's epilog, and a failure there would leave the job's GPU state "
            f"behind. Move that line into slurm.conf (the install then runs it after ours), or pass --take-over "
            f"{pair.key} to keep this order"
        )


def _chain_health(pair: Pair, entries: list[tuple[Line, Pair]], opts: Options, merged: Merged) -> None:
    site_value = entries[-1][1].value
    if site_value == pair.value:
        _comment(entries, merged, "the product's own, set in the include")
        merged.changes.append(Change(CHAIN, pair.key, site_value, pair.value, "the product's own; set once"))
    elif opts.site_health == site_value:
        _comment(entries, merged, "run by the product's health check (cluster.health.site_program)")
        why = "the product's health check runs the site's first (cluster.health.site_program)"
        merged.changes.append(Change(CHAIN, pair.key, site_value, f"{pair.value} -> {site_value}", why))
    elif opts.may_take(pair.key):
        _comment(entries, merged, "taken over")
        merged.changes.append(Change(OWNED, pair.key, site_value, pair.value, "taken over: the site's no longer runs"))
    else:
        merged.refusals.append(
            f"HealthCheckProgram={site_value} is the site's ({entries[-1][0].where}): set "
            f"cluster.health.site_program: {site_value} in the policy so the gpushare health check runs it first "
            "(its exit code and drains kept apart from ours), or pass --take-over HealthCheckProgram to stop it"
        )


def _nodes(site: list[Line], opts: Options, merged: Merged) -> None:
    """Site NodeName lines naming policy nodes: those nodes now come from the include; the others stay."""
    for line in site:
        name = line.get("NodeName") if line.record == "nodename" else None
        if not name or name.upper() == "DEFAULT":
            continue
        names = expand_hostlist(name)
        inside = [n for n in names if n in opts.policy_nodes]
        if not inside:
            continue
        if line.included:
            merged.refusals.append(
                f"NodeName={name} ({line.where}) defines {collect_hostlist(inside)}, which the policy defines in "
                f"the include: slurmctld will not start with a node defined twice, and gpushare never edits "
                f"{line.file}. Move that line into slurm.conf (the install then keeps its other nodes), or take "
                "the policy's nodes out of it"
            )
            continue
        outside = [n for n in names if n not in opts.policy_nodes]
        merged.commented[line.number] = "nodes defined by the policy"
        why = "defined by the policy (the include)"
        if outside:
            merged.tail.append(conf.render_pairs([Pair("NodeName", collect_hostlist(outside)), *line.pairs[1:]]))
            why += f"; {collect_hostlist(outside)} kept as the site defined them"
        merged.changes.append(Change(OWNED, f"NodeName={name}", line.raw.strip(), collect_hostlist(inside), why))


def _partition(line: Line, site: list[Line], opts: Options, merged: Merged) -> str:
    """The include's partition with the site's options it does not set passed through."""
    name = line.pairs[0].value
    theirs = [s for s in site if s.record == "partitionname" and s.pairs[0].value == name]
    ours = list(line.pairs)
    key = f"PartitionName={name}"
    elsewhere = [s for s in theirs if s.included]
    if elsewhere:
        merged.refusals.append(
            f"{key} is defined in {elsewhere[0].where}, and the policy's tier {name} in the include: slurmctld will "
            f"not start with a partition defined twice, and gpushare never edits {elsewhere[0].file}. Move that "
            "line into slurm.conf (the install then keeps its options in the tier's definition), or give the tier "
            "another name in the policy"
        )
        return line.raw
    if not theirs:
        merged.changes.append(Change(OWNED, key, None, "(new)", "a tier of the policy"))
        return line.raw
    site_pairs = [p for s in theirs for p in s.pairs[1:]]
    ours, passed, differ = _partition_options(ours, site_pairs)
    for s in theirs:
        merged.commented[s.number] = "merged into the include's partition"
    if differ and not opts.may_take(key):
        merged.refusals.append(
            f"{key} ({theirs[-1].where}): the site sets {', '.join(differ)}; pass --take-over {key} for the "
            "policy's values, or give the tier the site's values in the policy"
        )
    why = f"the site's {', '.join(passed)} kept" if passed else "no site option to keep"
    if differ:
        why += f"; the policy's value for {', '.join(differ)}"
    merged.changes.append(Change(OWNED, key, theirs[-1].raw.strip(), conf.render_pairs(ours), why))
    return conf.render_pairs(ours)


def _partition_options(ours: list[Pair], site_pairs: list[Pair]) -> tuple[list[Pair], list[str], list[str]]:
    """Our options plus the site's we do not set; the names passed through; 'Opt=site (ours: x)' that differ.
    A site memory default (DefMemPerGPU/CPU/Node: Slurm takes one) replaces ours."""
    if any(p.name in DEF_MEM for p in site_pairs):
        ours = [p for p in ours if p.name not in DEF_MEM]
    mine = {p.name: p.value for p in ours}
    passed, differ, out = [], [], list(ours)
    state = out.pop() if out and out[-1].name == "state" else None
    for p in site_pairs:
        if p.name not in mine:
            out.append(p)
            passed.append(f"{p.key}={p.value}")
        elif not _same_option(p.name, mine[p.name], p.value):
            differ.append(f"{p.key}={p.value} (the policy's: {mine[p.name]})")
    if state is not None:
        out.append(state)
    return out, passed, differ


def _same_option(name: str, a: str, b: str) -> bool:
    """Two values of a partition option that Slurm reads the same: node lists as sets of nodes, other
    lists as sets of items, case aside."""
    if name == "nodes":
        return set(expand_hostlist(a)) == set(expand_hostlist(b))
    return {x.lower() for x in conf.items(a)} == {x.lower() for x in conf.items(b)}


def _site_default(site: list[Line], fragment: list[Line], opts: Options, merged: Merged) -> bool:
    """True when the site's own default partition stays the default (the tiers then get Default=NO):
    Slurm keeps the last Default=YES it reads, which would be the include's tier. --take-over Default
    makes the policy's default tier the cluster's."""
    tiers = {f.pairs[0].value for f in fragment if f.record == "partitionname"}
    ours = [f.pairs[0].value for f in fragment if f.record == "partitionname" and _is_default(f)]
    theirs = [
        s
        for s in site
        if s.record == "partitionname" and _is_default(s) and s.pairs[0].value not in tiers | {"DEFAULT"}
    ]
    if not ours or not theirs:
        return False
    old, new = theirs[-1].pairs[0].value, ours[0]
    if opts.may_take("Default"):
        merged.changes.append(Change(OWNED, "default partition", old, new, "taken over: the policy's default tier"))
        return False
    why = f"the site's default kept (--take-over Default makes tier {new} the default)"
    merged.changes.append(Change(SITE, "default partition", old, old, why))
    return True


def _is_default(line: Line) -> bool:
    return (line.get("Default") or "").upper() == "YES"


def _not_default(line: Line) -> Line:
    pairs = tuple(Pair(p.key, "NO", p.quoted) if p.name == "default" else p for p in line.pairs)
    return Line(line.number, conf.render_pairs(list(pairs)), pairs)
