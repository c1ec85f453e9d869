"""bench/doubles_clock: the node hook benchmark's timing of the test doubles from inside a hook process.

bench/node_hooks.py subtracts what this clock records from a hook's wall time to get the product's own time;
if a seam it wraps moved (the fake control client no longer run through ``proc.run``, the fake NVML's calls
renamed, the daemon's exit no longer awaited by ``ProcessHandle.wait``) the doubles would silently count as
the product's. These tests run real hook processes with the clock on, started as the bench starts them (the
hook scripts ``gpushare node install`` writes, through ``clocked``), and check that every seam is seen, the right
number of times, and that the hooks do the same work as without it."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from bench.node_hooks import clocked as with_clock
from bench.node_hooks import write_scripts
from slurm_gpushare.node.install import probe_import_dirs
from slurm_gpushare.node.mps import answers
from slurm_gpushare.proc import run
from tests.unit.hooks_support import FAKES, ROOT, HookNode, stop_daemons

CLOCK = ROOT / "bench" / "doubles_clock"
DIRS = probe_import_dirs(sys.executable)


def hook(node: HookNode, name: str, env: dict, clock: Path | None) -> dict | None:
    """Run hook ``name``'s script as bench/node_hooks.py does (as slurmd would; with ``clock``, through the
    bench's ``clocked``); the clock's line."""
    argv = write_scripts(node.tmp / "bin", DIRS)[name]
    if clock is not None:
        env, argv = {**env, "GPUSHARE_BENCH_DOUBLES": str(clock)}, with_clock(argv)
    res = run(argv, env=env, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    if clock is None:
        return None
    lines = clock.read_text().splitlines()
    clock.unlink()
    assert len(lines) == 1, lines
    return dict(word.split("=", 1) for word in lines[0].split())


@pytest.fixture
def clocked():
    """Test nodes (a directory each, short: the MPS control socket's path has at most 100 characters), whose
    node config names the fake control client by its own name, as bench/node_hooks.py's does; their fake
    MPS daemons are quit afterwards."""
    made, top = [], Path(tempfile.mkdtemp(prefix="gs-clock-"))

    def node(name: str, label: str = "") -> HookNode:
        where = top / (label or name)
        where.mkdir()
        made.append(HookNode(where, name))
        made[-1].config.write_text(made[-1].config.read_text() + f"mps_control: {FAKES / 'nvidia-cuda-mps-control'}\n")
        return made[-1]

    yield node
    for found in made:
        stop_daemons(found.state_dir)
    shutil.rmtree(top)


def test_an_mps_job_three_client_starts_the_daemon_awaited_and_nvml_calls(clocked, tmp_path):
    node = clocked("lab-mps01")
    env = node.env(1, gpus="0", pct=25)
    prolog = hook(node, "prolog", env, tmp_path / "clock")
    pipe = next(node.state_dir.glob("mps/*/pipe"))
    assert answers(str(pipe))  # the clock changed nothing: the daemon runs and answers
    epilog = hook(node, "epilog", env, tmp_path / "clock")
    assert not pipe.exists() and node.journals() == []
    assert (prolog["mps_n"], epilog["mps_n"]) == ("2", "1")  # -d, then the job's settings and start_server; quit
    assert (prolog["wait_n"], epilog["wait_n"]) == ("0", "1")  # the epilog waits for the daemon to exit
    assert int(prolog["nvml_n"]) > 0 and int(epilog["nvml_n"]) > 0
    assert (prolog["import_n"], epilog["import_n"]) == ("1", "1")  # the fake NVML module's import, a double too
    # no command other than the fake client, but for the key dir's own tmpfs (node.mps.PIPE_TMPFS), mounted where
    # the hooks may (as root) and detached when the daemon quits
    if os.geteuid() == 0:
        assert (prolog["other"], epilog["other"]) == ("mount", "umount")
    else:
        assert prolog["other"] == epilog["other"] == "-"


@pytest.mark.parametrize("name, gpus", [("lab-excl01", "1"), ("lab-mig01", "0"), ("lab-shard01", "0")])
def test_other_modes_only_nvml_calls(clocked, tmp_path, name, gpus):
    node = clocked(name)
    env = node.env(1, gpus=gpus)
    for which in ("prolog", "epilog"):
        seen = hook(node, which, env, tmp_path / "clock")
        assert (seen["mps_n"], seen["wait_n"], seen["other"], seen["import_n"]) == ("0", "0", "-", "1")
        assert int(seen["nvml_n"]) > 0 and float(seen["import_ms"]) > 0
    assert node.journals() == []


def jobs_dir(node: HookNode) -> list[str]:
    return sorted(p.read_text().replace(str(node.tmp), "TMP") for p in (node.state_dir / "jobs").iterdir())


def test_the_clock_changes_nothing_the_hook_writes(clocked, tmp_path):
    """The same MIG job on two like nodes, without the clock and with it: the same journal and task file."""
    plain, timed = clocked("lab-mig01", "plain"), clocked("lab-mig01", "timed")
    hook(plain, "prolog", plain.env(1, gpus="0"), None)
    hook(timed, "prolog", timed.env(1, gpus="0"), tmp_path / "clock")
    assert jobs_dir(plain) == jobs_dir(timed) != []


def test_a_fake_nvml_call_made_inside_another_counts_once(clocked, tmp_path):
    node = clocked("lab-mig01")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sitecustomize as s; "
        "from slurm_gpushare.gpu.fakenvml import FakeNvml; f = FakeNvml(sys.argv[2]); "
        "f.nvmlInit(); f.nvmlDeviceGetCount(); f.nvmlShutdown(); print(s._SEEN['nvml_n'])"
    )
    res = run(
        [sys.executable, "-c", code, str(CLOCK), str(node.state)],
        env={**os.environ, "GPUSHARE_BENCH_DOUBLES": str(tmp_path / "direct")},
        timeout=60,
    )
    assert res.stdout.strip() == "3"  # nvmlInit calls nvmlInitWithFlags: that inner call is not counted again


def test_without_its_variable_the_clock_does_nothing(tmp_path):
    code = "import sys, sitecustomize as s; print(s.__file__, s._Finder in sys.meta_path)"
    res = run([sys.executable, "-c", code], env={"PYTHONPATH": str(CLOCK)}, timeout=60)
    assert res.stdout.split() == [str(CLOCK / "sitecustomize.py"), "False"]
