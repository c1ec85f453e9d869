"""docker/fakes: the test-only nvidia-cuda-mps-control and nvidia-smi speak the real syntax, keep
state, refuse what they do not know. Run with this interpreter, as real processes."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from slurm_gpushare.gpu import open_backend
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.node.mig import apply_actions, observe, plan_mig
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import run
from tests.unit.hooks_support import FAKE_MPS, FAKES, ROOT

LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control +\d+\] ")


@pytest.fixture
def mps(tmp_path):
    env = {
        "PATH": os.defpath,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
    }

    def control(*lines, args=(), check=False):
        return run([*FAKE_MPS, *args], input="".join(f"{x}\n" for x in lines), env=env, check=check, timeout=20)

    control.tmp = tmp_path
    yield control
    control("quit")


def state(mps) -> dict:
    return json.loads((mps.tmp / "pipe" / ".fake-state.json").read_text())


def test_daemon_commands_and_state(mps):
    assert mps(args=["-d"]).returncode == 0
    assert mps("get_server_list").stdout == ""
    res = mps("set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 0 6144M")
    assert (res.returncode, res.stdout) == (0, "25.0\n")  # the percentage is echoed as a float; the limit has no reply
    assert mps("get_default_active_thread_percentage").stdout == "25.0\n"
    assert mps(f"start_server -uid {os.getuid()}").returncode == 0
    servers = mps("get_server_list").stdout.split()
    assert len(servers) == 1 and state(mps)["servers"] == {servers[0]: os.getuid()}
    assert os.path.exists(f"/proc/{servers[0]}")
    assert state(mps)["default_device_pinned_mem_limit"] == {"0": "6144M"}
    again = mps(f"start_server -uid {os.getuid()}")
    assert again.returncode == 1 and "already running" in again.stderr
    assert mps("quit").returncode == 0
    # As with the real daemon, quit is acknowledged before the daemon has finished
    # exiting: wait (bounded) for it to remove its socket.
    control = mps.tmp / "pipe" / "control"
    deadline = time.monotonic() + 10
    while control.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not control.exists()
    log = (mps.tmp / "log" / "control.log").read_text().splitlines()
    assert all(LOG_LINE.match(line) for line in log)
    messages = [LOG_LINE.sub("", line) for line in log]
    assert messages[0] == f"Starting control daemon using socket {mps.tmp}/pipe/control"
    assert f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={mps.tmp}/pipe" in messages
    assert "Cmd:set_default_active_thread_percentage 25" in messages and "25.0" in messages
    assert f"Starting new server {servers[0]} for user {os.getuid()}" in messages and messages[-1] == "Exit"


def test_unknown_commands_and_arguments_are_refused(mps):
    assert mps(args=["-d"]).returncode == 0
    for line in (
        "bogus",
        "start_server 5",
        "set_default_device_pinned_mem_limit 0 lots",
        "set_default_active_thread_percentage 0",
    ):
        res = mps(line)
        assert res.returncode == 1 and res.stderr.strip(), line
    assert "this fake supports: get_server_list" in mps("ps").stderr
    res = mps(args=["--static-partitioning"])
    assert res.returncode == 1 and "unsupported arguments" in res.stderr


def test_second_daemon_and_client_without_daemon(mps):
    res = mps("get_server_list")
    assert res.returncode == 1 and "Cannot find MPS control daemon" in res.stderr
    assert mps(args=["-d"]).returncode == 0
    res = mps(args=["-d"])
    assert res.returncode == 1 and "An instance of this daemon is already running" in res.stderr


def test_the_control_socket_is_reachable_by_anyone_who_can_enter_the_pipe_dir(mps):
    assert mps(args=["-d"]).returncode == 0
    assert oct(os.stat(mps.tmp / "pipe" / "control").st_mode & 0o777) == "0o777"


# ---- nvidia-smi -----------------------------------------------------------------------------


@pytest.fixture
def mig_state(tmp_path):
    fake = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[0], seed="s")
    slots = load_file(ROOT / "etc" / "small-lab.yaml").group_for_node("lab-mig01").gpus
    with open_backend(fake.state_path) as backend:
        apply_actions(backend, plan_mig(slots, observe(backend, [0])))
        migs = backend.mig_devices(0)
        gpus = backend.gpus()
    return fake.state_path, gpus, migs


def smi(state, *args):
    return run(
        [sys.executable, str(FAKES / "nvidia-smi"), *args],
        env={**os.environ, "GPUSHARE_FAKE_NVML": str(state)},
        check=False,
        timeout=60,
    )


def test_smi_lists_gpus_and_mig_devices(mig_state):
    state, gpus, migs = mig_state
    lines = smi(state, "-L").stdout.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {gpus[0].uuid})"
    assert re.fullmatch(rf"  MIG 1g\.5gb +Device  0: \(UUID: {migs[0].uuid}\)", lines[1])
    assert len(lines) == 1 + 7 + 1 and lines[-1].startswith("GPU 1: ")


def test_smi_lists_gpu_instances(mig_state):
    state, _gpus, _migs = mig_state
    out = smi(state, "mig", "-lgi").stdout
    rows = [line for line in out.splitlines() if "MIG 1g.5gb" in line]
    assert len(rows) == 7
    assert re.search(r"\|\s+0\s+MIG 1g\.5gb\s+19\s+7\s+0:1\s+\|", rows[0]), rows[0]
    assert smi(state, "mig", "-lgi", "-i", "1").stdout.strip() == "No MIG-enabled devices found."


def test_smi_refuses_what_it_does_not_know(mig_state):
    res = smi(mig_state[0], "-q")
    assert res.returncode == 2 and "this fake supports: nvidia-smi -L" in res.stderr


def _servers_of(pipe_dir) -> list[int]:
    """Processes whose environment names ``pipe_dir`` as their MPS pipe directory (this user's: readable)."""
    want = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"{entry.path}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_quit_right_after_start_server_leaves_no_server(mps):
    """A quit whose SIGTERM reaches a just-forked server before it execs (start_server and quit in one session)
    ends that server too: the daemon exits and no server of its pipe dir is left (the soak once found one)."""
    pipe = mps.tmp / "pipe"
    for attempt in range(15):
        assert mps(args=["-d"]).returncode == 0, attempt
        assert mps(f"start_server -uid {os.getuid()}", "quit").returncode == 0, attempt
        deadline = time.monotonic() + 10
        while (left := _servers_of(pipe)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert left == [], f"attempt {attempt}: daemon or server of {pipe} still running: pids {left}"


# ---- the fake control client's start cost (issue 14): a stub importing fake_mps_control.py, C modules only ----


def _fake_module():
    sys.path.insert(0, str(FAKES))
    try:
        import fake_mps_control
    finally:
        sys.path.remove(str(FAKES))
    return fake_mps_control


def test_state_file_json_is_what_json_dumps_writes():
    fake = _fake_module()
    hostile = [
        "",
        'a"b\\c',
        "tab\tnew\nline\r\x00\x1f\x7f",
        "é ü",
        "\u2028\uffff",
        "\U0001f600 \U00010000",
        "GPU-0,GPU-1",
    ]
    for text in hostile:
        assert fake._json(text) == json.dumps(text)
    state = {
        "pid": 123,
        "servers": {"456": 1000},
        "default_active_thread_percentage": 25.0,
        "default_device_pinned_mem_limit": {k: "6144M" for k in hostile},
        "cuda_visible_devices": 'GPU-a"b',
    }
    assert fake._json(state) == json.dumps(state) and json.loads(fake._json(state)) == state
    for value in (33.3333333333, 100.0, 0.5, 7, 10**20):
        assert fake._json(value) == json.dumps(value)
    for bad in (float("nan"), float("inf"), True, None, [1], {1: 2}):
        with pytest.raises(TypeError):
            fake._json(bad)


def test_memory_limit_check_is_the_regular_expression_it_replaces():
    fake = _fake_module()
    for value in (
        "6144M",
        "1G",
        "0M",
        "M",
        "G",
        "",
        "6144",
        "61.4M",
        "6144K",
        "6144m",
        "-1M",
        "٣M",
        "²G",
        "1 M",
        "6144MM",
        "１M",
        "12G\n",
    ):
        assert fake._mem_limit(value) == bool(re.fullmatch(r"[0-9]+[MG]", value)), value


def test_client_and_daemon_paths_import_only_c_modules(tmp_path):
    """A client start and a daemon's serving need neither json, re, socket nor signal's Python layer (each
    costs a -I -S interpreter 19-31 M instructions); the server registry and NVML state are read with json."""
    code = (
        f"import sys; sys.path.insert(0, {str(FAKES)!r}); import fake_mps_control as f; "
        "f._daemon_modules(); d = f.Daemon(); d.handle('set_default_device_pinned_mem_limit 0 6144M'); d.save(); "
        "print(sorted(m for m in ('json', 're', 'socket', 'signal', 'enum') if m in sys.modules))"
    )
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path), "PATH": os.defpath}
    res = run([sys.executable, "-I", "-S", "-c", code], env=env)
    assert res.stdout.strip() == "[]"
    assert json.loads((tmp_path / ".fake-state.json").read_text())["default_device_pinned_mem_limit"] == {"0": "6144M"}


def test_stub_finds_its_module_through_a_link(tmp_path):
    link = tmp_path / "nvidia-cuda-mps-control"
    link.symlink_to(FAKES / "nvidia-cuda-mps-control")
    res = run([sys.executable, "-I", "-S", str(link), "--bogus"], check=False, env={"PATH": os.defpath})
    assert res.returncode == 1 and "unsupported arguments '--bogus'" in res.stderr
