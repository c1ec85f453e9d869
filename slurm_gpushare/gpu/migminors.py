"""/proc/driver/nvidia-caps/mig-minors: which /dev/nvidia-caps minor grants which MIG instance.

Slurm's MIG lines need ``/dev/nvidia-caps/nvidia-cap<minor>`` for the GPU
instance and the compute instance. The driver publishes the whole static
table (every GPU minor 0-31, GI 0-14, CI 0-7) whether or not the instances
exist, keyed by the GPU's *device minor*, not its NVML index (NVIDIA MIG
User Guide, "Device Nodes and Capabilities", which lists the table).
Pure: parsing and the closed-form table, no GPU access.
"""

from __future__ import annotations

import os
import re

from ..errors import GpushareError

TYPE_CHECKING = False  # typing costs every node hook a few ms at start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Iterable

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"  # a str: pathlib costs every node hook ~17 M instructions

# Key: (gpu minor, GI id, CI id or None for the GI's own access capability).
MinorKey = tuple[int, int, int | None]

_GPUS, _GIS, _CIS = 32, 15, 8
_ACCESS = re.compile(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access")
# The table as the driver writes it, checked whole in one match (about 1 ms for its 4,322 lines, against
# 6-12 ms to parse them one by one): the prolog then parses only its lines. Any other text goes line by line.
_CANONICAL = re.compile(r"(?:(?:config|monitor|gpu[0-9]+/gi[0-9]+(?:/ci[0-9]+)?/access) (?:0|[1-9][0-9]*)\n)*")
_OTHER = frozenset({"config", "monitor"})


PROC_DEVICES = "/proc/devices"
CAPS_DEVICE = "nvidia-caps"  # the driver's character device name in /proc/devices, the major of /dev/nvidia-caps/*
# The major the test cluster's fake capability files use (docker/fake_gpus.py DEFAULT_CAPS_MAJOR): a container's
# /proc/devices is its host's, which has no NVIDIA driver.
FAKE_CAPS_MAJOR = 509


def mig_minors_path(fake_state: str | None) -> str:
    """Where the node's mig-minors table is: the driver's, or a fake NVML's beside its state file."""
    return MIG_MINORS if fake_state is None else fake_state + ".mig-minors"


def caps_major(fake: bool = False, path: str = PROC_DEVICES) -> int:
    """The character major of /dev/nvidia-caps/nvidia-cap<N> (the driver's ``nvidia-caps`` in /proc/devices);
    ``fake``: FAKE_CAPS_MAJOR where the file names none (a test node)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError as exc:
        raise MigMinorsError(f"cannot read {path}: {exc.strerror}") from None
    block = text.split("Block devices:", 1)[0]
    for line in block.splitlines():
        number, _, name = line.strip().partition(" ")
        if name.strip() == CAPS_DEVICE and number.isdigit():
            return int(number)
    if fake:
        return FAKE_CAPS_MAJOR
    raise MigMinorsError(f"{path} lists no {CAPS_DEVICE} character device (is the NVIDIA driver loaded?)")


class MigMinorsError(GpushareError):
    """A mig-minors file that cannot be read or has a line we do not understand."""


def gi_access_minor(gpu_minor: int, gi: int) -> int:
    """The closed form behind the driver's table: 135 minors per GPU, 9 per GI (inferred from the
    table the MIG User Guide's "Device Nodes and Capabilities" prints; tests check it line by line)."""
    return 3 + 135 * gpu_minor + 9 * gi


def ci_access_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_access_minor(gpu_minor, gi) + 1 + ci


def mig_minors_text() -> str:
    """The full static table as the driver writes it (used by the fake NVML)."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(_GPUS):
        for gi in range(_GIS):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_access_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {ci_access_minor(gpu, gi, ci)}" for ci in range(_CIS)]
    return "\n".join(lines) + "\n"


def parse_mig_minors(text: str, source: str = "mig-minors", only: frozenset[int] | None = None) -> dict[MinorKey, int]:
    """{(gpu minor, gi, ci or None): minor}; any line we cannot read is an error, not skipped.

    ``only``: just the entries of these minors (the prolog needs those of its gres.conf's capability
    files); the whole text is still checked."""
    if only is not None and _CANONICAL.fullmatch(text):
        if not only:
            return {}
        wanted = re.compile(r"^.* (?:{})$".format("|".join(map(str, sorted(only)))), re.MULTILINE)
        lines: Iterable[tuple[int, str]] = ((text.count("\n", 0, m.start()) + 1, m[0]) for m in wanted.finditer(text))
    else:
        lines = enumerate(text.splitlines(), 1)
    table: dict[MinorKey, int] = {}
    for number, line in lines:
        if line.strip():
            key, minor = _parse_line(line, f"{source}:{number}")
            if key is not None and (only is None or minor in only):
                table[key] = minor
    return table


def _parse_line(line: str, where: str) -> tuple[MinorKey | None, int]:
    name, _, value = line.strip().rpartition(" ")
    if not value.isdigit():
        raise MigMinorsError(f"{where}: expected '<name> <minor>', got {line!r}")
    if name in _OTHER:
        return None, int(value)
    match = _ACCESS.fullmatch(name)
    if match is None:
        raise MigMinorsError(
            f"{where}: unknown capability {name!r}; expected config, monitor, gpuN/giG/access or gpuN/giG/ciC/access"
        )
    gpu, gi, ci = match.groups()
    return (int(gpu), int(gi), None if ci is None else int(ci)), int(value)


def read_mig_minors(path: str | os.PathLike = MIG_MINORS, only: frozenset[int] | None = None) -> dict[MinorKey, int]:
    """Parse the file at ``path`` (``only``: see parse_mig_minors); a missing file means the driver has no MIG
    support loaded."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("ascii")  # not read_text: its codec lookup imports a module
    except OSError as exc:
        raise MigMinorsError(
            f"cannot read {path}: {exc.strerror} (is the NVIDIA driver with MIG support loaded?)"
        ) from None
    return parse_mig_minors(text, str(path), only)
