#!/usr/bin/env python3
"""Create fake NVIDIA device nodes for a test-cluster node from its gres.conf.

Test-only (docker/). The device set comes from the rendered gres.conf: every
``File=`` / ``Files=`` / ``MultipleFiles=`` path on a line whose ``NodeName``
matches this host (or that has no NodeName) is created with mknod, hostlist
ranges such as ``/dev/nvidia[0-3]`` expanded, ``Include`` lines followed.
``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` are
always created.

Slurm only stat()s these files: a missing one makes slurmd exit after ~20 s,
one that is not a character/block device is silently dropped, so a char
device with any major:minor is what is needed. Numbers used (as on a real
driver): /dev/nvidiaN 195:N, nvidiactl 195:255, nvidia-modeset 195:254,
nvidia-uvm UVM:0, nvidia-uvm-tools UVM:1, /dev/nvidia-caps/nvidia-capN CAPS:N.

Usage: fake_gpus.py [--gres-conf PATH] [--node NAME] [--root DIR] [--dry-run]
Exit status 0, or 3 when an Include target is missing (devices from the rest
are still made). Paths that are not NVIDIA device names and do not exist are
reported on stderr and left alone (slurmd will then fail as on real hardware).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import stat
import sys
from pathlib import Path

NVIDIA_MAJOR = 195
DEFAULT_UVM_MAJOR = 508
DEFAULT_CAPS_MAJOR = 509
MISSING_INCLUDES: list[str] = []  # Include targets device_paths() could not read
ALWAYS = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside square brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_ranges(body: str) -> list[str]:
    out = []
    for item in body.split(","):
        item = item.strip()
        if "-" in item:
            lo, hi = item.split("-", 1)
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad range {item!r}")
            out.extend(str(i).zfill(width) for i in range(a, b + 1))
        elif item:
            out.append(item)
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression: ``a[1-3,5],b0[1-2]x`` -> names."""
    names: list[str] = []
    for part in _split_top(expr):
        m = re.search(r"\[([^\[\]]*)\]", part)
        if not m:
            names.append(part)
            continue
        head, tail = part[: m.start()], part[m.end() :]
        for mid in _expand_ranges(m.group(1)):
            names.extend(expand_hostlist(head + mid + tail))
    return names


def _logical_lines(path: Path):
    text = path.read_text()
    buf = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line, buf = (buf + line).strip(), ""
        if line:
            yield line


def device_paths(gres_conf: Path, node: str, _seen: set | None = None) -> list[str]:
    """Device paths gres.conf names for ``node``, in file order, no duplicates."""
    seen = _seen if _seen is not None else set()
    if gres_conf in seen:
        return []
    seen.add(gres_conf)
    paths: list[str] = []
    for line in _logical_lines(gres_conf):
        words = line.split()
        if words[0].lower() == "include" and len(words) == 2:
            inc = Path(words[1])
            if not inc.is_absolute():
                inc = gres_conf.parent / inc
            if inc.exists():
                paths += device_paths(inc, node, seen)
            else:
                MISSING_INCLUDES.append(str(inc))
            continue
        keys = {}
        for word in words:
            if "=" in word:
                k, v = word.split("=", 1)
                keys[k.lower()] = v.strip('"')
        if "nodename" in keys and node not in expand_hostlist(keys["nodename"]):
            continue
        for key in ("file", "files", "multiplefiles"):
            if key in keys:
                paths += expand_hostlist(keys[key])
    result: list[str] = []
    for p in paths:
        if p not in result:
            result.append(p)
    return result


def device_number(path: str, uvm_major: int, caps_major: int) -> tuple[int, int] | None:
    m = re.fullmatch(r"/dev/nvidia(\d+)", path)
    if m:
        return NVIDIA_MAJOR, int(m.group(1))
    m = re.fullmatch(r"/dev/nvidia-caps/nvidia-cap(\d+)", path)
    if m:
        return caps_major, int(m.group(1))
    return {
        "/dev/nvidiactl": (NVIDIA_MAJOR, 255),
        "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254),
        "/dev/nvidia-uvm": (uvm_major, 0),
        "/dev/nvidia-uvm-tools": (uvm_major, 1),
    }.get(path)


def create(paths, root: Path, uvm_major: int, caps_major: int, dry_run: bool) -> int:
    problems = 0
    for path in list(ALWAYS) + [p for p in paths if p not in ALWAYS]:
        target = root / path.lstrip("/")
        num = device_number(path, uvm_major, caps_major)
        if os.path.lexists(target):
            st = os.lstat(target)
            if stat.S_ISCHR(st.st_mode) and (num is None or (os.major(st.st_rdev), os.minor(st.st_rdev)) == num):
                print(f"fake_gpus: {path} exists", file=sys.stderr)
            else:
                print(f"fake_gpus: {path} exists and is not the expected char device; left alone", file=sys.stderr)
            continue
        if num is None:
            print(f"fake_gpus: {path}: not an NVIDIA device name; not created", file=sys.stderr)
            problems += 1
            continue
        print(f"fake_gpus: mknod {path} c {num[0]} {num[1]}", file=sys.stderr)
        if not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(*num))
            os.chmod(target, 0o666)
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gres-conf", default="/etc/slurm/gres.conf", type=Path)
    ap.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
    ap.add_argument("--root", default="/", type=Path, help="prefix for created paths (tests)")
    ap.add_argument("--uvm-major", type=int, default=DEFAULT_UVM_MAJOR)
    ap.add_argument("--caps-major", type=int, default=DEFAULT_CAPS_MAJOR)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the paths gres.conf names and exit")
    args = ap.parse_args(argv)
    paths = device_paths(args.gres_conf, args.node) if args.gres_conf.exists() else []
    if not args.gres_conf.exists():
        print(f"fake_gpus: no {args.gres_conf}; only the control devices are made", file=sys.stderr)
    for inc in MISSING_INCLUDES:
        print(
            f"fake_gpus: {args.gres_conf}: Include {inc} does not exist "
            "(slurmd would retry 60 s, then exit: 'error opening/reading gres.conf')",
            file=sys.stderr,
        )
    # Test hooks for the half-faked-node checks: leave a device out, or make it a plain file.
    omit = set(filter(None, os.environ.get("GPUSHARE_FAKE_GPUS_OMIT", "").split(",")))
    regular = set(filter(None, os.environ.get("GPUSHARE_FAKE_GPUS_REGULAR", "").split(",")))
    if args.list:
        print("\n".join(paths))
    else:
        create([p for p in paths if p not in omit | regular], args.root, args.uvm_major, args.caps_major, args.dry_run)
        for p in sorted(regular):
            target = args.root / p.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("not a device\n")
            print(f"fake_gpus: {p} made a regular file (GPUSHARE_FAKE_GPUS_REGULAR)", file=sys.stderr)
        for p in sorted(omit):
            print(f"fake_gpus: {p} left out (GPUSHARE_FAKE_GPUS_OMIT)", file=sys.stderr)
    return 3 if MISSING_INCLUDES else 0


if __name__ == "__main__":
    sys.exit(main())
