"""The systemd units shipped in the package (slurm_gpushare/systemd/) pass `systemd-analyze verify`, are in the
wheel, and start the commands the CLI has.

`systemd-analyze verify` loads a unit as systemd would and fails on a missing or non-executable ExecStart
binary, an unknown unit it needs, or a bad section; a setting it cannot parse is only a warning on stderr, so
a unit passes here when it exits 0 *and* prints nothing. It runs with --root on a scratch tree holding the
host's own units (sysinit.target and the like) and an executable at each ExecStart path, so the result does
not depend on what this machine has installed. CI installs Debian's systemd package when systemd-analyze
is missing (.ci/run); elsewhere the verify tests skip without it, unless GPUSHARE_REQUIRE_SYSTEMD=1.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.node.paths import NODE_CONFIG
from slurm_gpushare.systemd import BOOT_UNIT, DIR, UNITS, unit_paths
from tests.conftest import ROOT

ANALYZE = shutil.which("systemd-analyze")
HOST_UNITS = next(
    (p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if (p / "sysinit.target").exists()), None
)


def need_analyze():
    if ANALYZE and HOST_UNITS:
        return
    why = "systemd-analyze is not installed" if not ANALYZE else "no sysinit.target in /usr/lib/systemd/system"
    if os.environ.get("GPUSHARE_REQUIRE_SYSTEMD") == "1":
        pytest.fail(f"{why} (GPUSHARE_REQUIRE_SYSTEMD=1)", pytrace=False)
    pytest.skip(f"{why}: apt-get install systemd")


def exec_starts(text: str) -> list[list[str]]:
    return [shlex.split(line.split("=", 1)[1]) for line in text.splitlines() if line.startswith("ExecStart=")]


def verify(units: dict[str, str], tmp: Path) -> subprocess.CompletedProcess:
    """`systemd-analyze verify` of ``units`` (name -> text) in /etc/systemd/system of a scratch root."""
    root = tmp / "root"
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    etc = root / "etc/systemd/system"
    etc.mkdir(parents=True)
    for name, text in units.items():
        (etc / name).write_text(text)
        for argv in exec_starts(text):
            binary = root / argv[0].lstrip("/")
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("#!/bin/sh\nexit 0\n")
            binary.chmod(0o755)
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", f"--root={root}", *(f"/etc/systemd/system/{n}" for n in units)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def shipped() -> dict[str, str]:
    return {p.name: p.read_text() for p in unit_paths()}


def test_the_shipped_units_verify_clean(tmp_path):
    need_analyze()
    done = verify(shipped(), tmp_path)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        f"systemd-analyze verify exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )


@pytest.mark.parametrize(
    "change, reported",
    [
        (("Restart=on-failure", "Restart=sometimes"), "Failed to parse service restart specifier"),
        (("[Service]", "[Servce]"), "Unknown section 'Servce'"),
        (("Wants=network-online.target", "Requires=gpushare-no-such.service"), "gpushare-no-such.service"),
    ],
)
def test_a_broken_unit_is_reported(tmp_path, change, reported):
    need_analyze()
    units = shipped()
    name = "gpushare-exporter.service"
    assert change[0] in units[name]
    units[name] = units[name].replace(change[0], change[1])
    done = verify(units, tmp_path)
    output = done.stdout + done.stderr
    assert reported in output and (done.returncode != 0 or output.strip()), output


def test_a_missing_executable_fails_verify(tmp_path):
    need_analyze()
    text = shipped()["gpushare-exporter.service"].replace("/usr/local/bin/gpushare ", "/usr/local/bin/gpushare-nope ")
    root_units = {"gpushare-exporter.service": text}
    done = verify(root_units, tmp_path)
    assert done.returncode == 0  # the scratch root gets an executable at every ExecStart path
    (tmp_path / "root/usr/local/bin/gpushare-nope").unlink()
    again = subprocess.run(
        [ANALYZE, "verify", "--man=no", f"--root={tmp_path / 'root'}", "/etc/systemd/system/gpushare-exporter.service"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode != 0 and "is not executable" in again.stderr, again.stderr


def test_each_unit_runs_a_command_the_cli_has():
    runner = CliRunner()
    for name, text in shipped().items():
        (argv,) = exec_starts(text)
        assert argv[0] == "/usr/local/bin/gpushare", (name, argv)
        options = [w.split("=", 1)[0] for w in argv[1:] if w.startswith("--")]
        command, path = main, []  # the leaf command the unit runs: gpushare exporter, gpushare live apply, ...
        for word in argv[1:]:
            if not isinstance(command, click.Group) or word not in command.commands:
                break
            command, path = command.commands[word], [*path, word]
        helped = runner.invoke(main, [*path, "--help"])
        assert helped.exit_code == 0 and path, (name, helped.output)
        for option in options:
            assert option in helped.output, f"{name}: {option} is not an option of `gpushare {' '.join(path)}`"
        reads = ("--policy", "/etc/gpushare/policy.yaml") if name != BOOT_UNIT else ("--node-config", NODE_CONFIG)
        assert reads[0] in options and reads[1] in argv, (name, argv)


def test_the_units_are_in_the_wheel(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"slurm_gpushare/systemd/{u}" for u in UNITS} <= names, sorted(n for n in names if "systemd" in n)
    assert sorted(p.name for p in DIR.glob("*.service")) == sorted(UNITS)
