"""The files a site's slurm.conf includes, read as Slurm reads them (pure: a reader function in, lines out).

src/common/parse_config.c (``_parse_include_directive``, ``s_p_parse_file``) and read_config.c
(``get_extra_conf_path``), the same in 24.11 and 26.05:

- a line ``Include FILE`` (the word in any case, then blanks, then one file name) is read where it stands,
  as if the file's lines were there; an included file may include others, to any depth;
- a relative name is relative to slurm.conf's directory, in a nested file too (never to the including file);
- ``%c`` in the name is the ClusterName read so far, in lower case (slurmctld fails without one);
- a name with ``*`` is not a glob: slurmctld logs "Slurm does not support glob parsing" and fails to start,
  and so does an include of a file that does not exist (after retrying for a minute) or a loop (no check).

``resolve`` gives every line in the order Slurm reads them, each with the file it is in, so a merge sees the
site's definitions wherever they are; the files it read; and what Slurm could not read, each a sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import conf
from .conf import Line

Reader = Callable[[str], str | None]  # a path -> its text, None when there is no such file


@dataclass(frozen=True)
class Included:
    path: str  # as Slurm opens it
    by: Line  # the Include line


@dataclass
class Resolved:
    lines: list[Line] = field(default_factory=list)  # every line of every file, in the order Slurm reads them
    files: list[Included] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def no_files(path: str) -> str | None:
    return None


def target(line: Line) -> str | None:
    """The file an Include line names, as written; None for any other line."""
    first = line.first
    return first.value if first is not None and first.name == "include" else None


def resolve(top: str, directory: str, read: Reader = no_files) -> Resolved:
    """slurm.conf's text ``top`` (in ``directory``) with every file it includes, read through ``read``."""
    out = Resolved()
    _walk(conf.parse(top), directory.rstrip("/") or "/", read, out, (conf.TOP,))
    return out


def _walk(lines: list[Line], directory: str, read: Reader, out: Resolved, stack: tuple[str, ...]) -> None:
    for line in lines:
        out.lines.append(line)
        name = target(line)
        if name is None:
            continue
        path = _path(name, directory, out, line)
        if path is None:
            continue
        if path in stack:
            out.problems.append(f"{line.where} includes {name}, which includes itself (Slurm would loop)")
            continue
        text = read(path)
        if text is None:
            out.problems.append(f"{line.where} includes {path}, which does not exist (slurmctld would not start)")
            continue
        out.files.append(Included(path, line))
        _walk(conf.parse(text, path), directory, read, out, (*stack, path))


def _path(name: str, directory: str, out: Resolved, line: Line) -> str | None:
    """The path Slurm opens for ``name``, or None (with the problem) when it opens none."""
    if "*" in name:
        out.problems.append(
            f"{line.where}: Include {name}: Slurm reads no glob in an Include (slurmctld would not start); "
            "include each file by its name"
        )
        return None
    if "%c" in name:
        cluster = _cluster_name(out.lines)
        if cluster is None:
            out.problems.append(f"{line.where}: Include {name}: %c needs a ClusterName set before this line")
            return None
        name = name.replace("%c", cluster.lower())
    return name if name.startswith("/") else f"{directory}/{name}"


def _cluster_name(lines: list[Line]) -> str | None:
    values = [v for line in lines if line.record is None and (v := line.get("ClusterName")) is not None]
    return values[-1] if values else None
