"""Two tenants on one MPS GPU (issue 14 part 8): the GPU's compute mode in the fakes (NVML, nvidia-smi, the MPS
control daemon), the backend's read, the policy's compute_mode (validation, ExclusiveUser), the prolog's
decisions and the health check's report."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from slurm_gpushare.gpu import GpuError, open_backend
from slurm_gpushare.gpu import fakenvml as fk
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.health import check_compute_modes
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.observed import ObservedGpu
from slurm_gpushare.node.prolog import PrologRefused, StartMps, plan_prolog
from slurm_gpushare.policy import build_site
from slurm_gpushare.proc import run
from slurm_gpushare.render import render_all
from tests.conftest import minimal_policy
from tests.unit.hooks.test_prolog import job, live, whole_node
from tests.unit.hooks_support import FAKE_MPS, FAKES, no_scontrol
from tests.unit.policy.test_policy import one, problems

# ---- fake NVML and backend ---------------------------------------------------------------


@pytest.fixture
def nvml(tmp_path):
    fake = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[1], seed="cm")
    fake.nvmlInit()
    yield fake
    fake.nvmlShutdown()


def test_fake_compute_mode_defaults_and_persists_in_the_state(nvml):
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeMode(h) == fk.NVML_COMPUTEMODE_DEFAULT
    nvml.nvmlDeviceSetComputeMode(h, fk.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    other = FakeNvml(nvml.state_path)  # another process's view of the same GPUs
    other.nvmlInit()
    assert other.nvmlDeviceGetComputeMode(other.nvmlDeviceGetHandleByIndex(0)) == 3
    assert other.nvmlDeviceGetComputeMode(other.nvmlDeviceGetHandleByIndex(1)) == 0


def test_fake_refuses_removed_unknown_and_mig_exclusive_process(nvml):
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(fk.NVMLError_NotSupported):
        nvml.nvmlDeviceSetComputeMode(h0, fk.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
    with pytest.raises(fk.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetComputeMode(h0, 7)
    with pytest.raises(fk.NVMLError_NotSupported):  # GPU 1 is in MIG mode
        nvml.nvmlDeviceSetComputeMode(h1, fk.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    nvml.nvmlDeviceSetComputeMode(h1, fk.NVML_COMPUTEMODE_PROHIBITED)
    assert [nvml.nvmlDeviceGetComputeMode(h) for h in (h0, h1)] == [0, 2]
    nvml.nvmlDeviceSetComputeMode(h0, fk.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    with pytest.raises(fk.FakeNvmlError, match="EXCLUSIVE_PROCESS, which MIG mode does not support"):
        nvml.set_mig_mode(0, True)


def test_backend_reads_and_sets_compute_mode_by_name(nvml):
    with open_backend(nvml.state_path) as backend:
        assert backend.compute_mode(0) == "DEFAULT"
        backend.set_compute_mode(0, "EXCLUSIVE_PROCESS")
        assert backend.compute_mode(0) == "EXCLUSIVE_PROCESS"
        with pytest.raises(
            GpuError, match=r"GPU 1 \(GPU-.*\): set compute mode EXCLUSIVE_PROCESS: NVML_ERROR_NOT_SUPPORTED"
        ):
            backend.set_compute_mode(1, "EXCLUSIVE_PROCESS")
        with pytest.raises(GpuError, match="unknown compute mode; known: DEFAULT, EXCLUSIVE_THREAD, PROHIBITED"):
            backend.set_compute_mode(0, "SHARED")


def smi(state, *args):
    return run(
        [sys.executable, str(FAKES / "nvidia-smi"), *args],
        env={**os.environ, "GPUSHARE_FAKE_NVML": str(state)},
        check=False,
        timeout=60,
    )


def test_fake_nvidia_smi_sets_and_shows_the_compute_mode(nvml):
    res = smi(nvml.state_path, "-i", "0", "-c", "3")
    assert (
        res.returncode == 0
        and res.stdout == "Set compute mode to EXCLUSIVE_PROCESS for GPU 00000000:10:00.0.\nAll done.\n"
    )
    res = smi(nvml.state_path, "-i", "0", "-c", "EXCLUSIVE_PROCESS")
    assert res.stdout.startswith("Compute mode is already set to EXCLUSIVE_PROCESS for GPU")
    out = smi(nvml.state_path, "--query-gpu=index,compute_mode", "--format=csv,noheader").stdout
    assert out == "0, Exclusive_Process\n1, Default\n"
    res = smi(nvml.state_path, "-i", "1", "-c", "EXCLUSIVE_PROCESS")
    assert res.returncode == 3 and "NVML_ERROR_NOT_SUPPORTED" in res.stderr
    assert smi(nvml.state_path, "-c", "1").returncode == 3  # EXCLUSIVE_THREAD: gone from drivers
    assert smi(nvml.state_path, "-c", "SHARED").returncode == 2
    assert smi(nvml.state_path, "--query-gpu=power.draw", "--format=csv").returncode == 2


# ---- the fake MPS control daemon: servers only where the compute mode lets them ----------------


@pytest.fixture
def gpu_node(tmp_path):
    """One A30 with the fake NVML; daemons started here are quit afterwards."""
    fake = FakeNvml.build(tmp_path / "nvml.json", model="A30-24GB", count=1, mig_enabled=[], seed="mps")
    with open_backend(fake.state_path) as backend:
        uuid = backend.gpu(0).uuid
    started = []

    def daemon(name: str):
        env = {
            "PATH": os.defpath,
            "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / name / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / name / "log"),
            "CUDA_VISIBLE_DEVICES": uuid,
            "GPUSHARE_FAKE_NVML": str(fake.state_path),
        }

        def control(*lines, args=()):
            return run([*FAKE_MPS, *args], input="".join(f"{x}\n" for x in lines), env=env, check=False, timeout=20)

        assert control(args=["-d"]).returncode == 0
        started.append(control)
        control.log = tmp_path / name / "log"
        return control

    daemon.fake = fake
    yield daemon
    for control in started:
        control("quit")


def servers(control, want: int) -> list[str]:
    """The daemon's server list once it has ``want`` entries (a failing server takes a moment to exit)."""
    deadline = time.monotonic() + 15
    while True:
        found = control("get_server_list").stdout.split()
        if len(found) == want or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def set_mode(fake: FakeNvml, mode: int) -> None:
    fake.nvmlInit()
    fake.nvmlDeviceSetComputeMode(fake.nvmlDeviceGetHandleByIndex(0), mode)
    fake.nvmlShutdown()


def test_default_mode_runs_two_daemons_servers_on_one_gpu(gpu_node):
    a, b = gpu_node("a"), gpu_node("b")
    for control in (a, b):
        assert control(f"start_server -uid {os.getuid()}").returncode == 0
    assert len(servers(a, 1)) == 1 and len(servers(b, 1)) == 1


def test_exclusive_process_lets_one_server_hold_the_gpu(gpu_node):
    set_mode(gpu_node.fake, fk.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    a, b = gpu_node("a"), gpu_node("b")
    assert a(f"start_server -uid {os.getuid()}").returncode == 0
    held = servers(a, 1)
    assert len(held) == 1
    # acknowledged, as a real start_server is; the server then fails on the busy GPU and exits 1
    assert b(f"start_server -uid {os.getuid()}").returncode == 0
    assert servers(b, 0) == []
    control_log = (b.log / "control.log").read_text()
    assert (
        "Server encountered a fatal exception. Shutting down" in control_log and "exited with status 1" in control_log
    )
    server_log = (b.log / "server.log").read_text()
    assert f"compute mode EXCLUSIVE_PROCESS (held by server {held[0]})" in server_log
    assert "Failed to start : all CUDA-capable devices are busy or unavailable" in server_log
    a("quit")  # the holder goes: the GPU is free for the next server
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{held[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b(f"start_server -uid {os.getuid()}").returncode == 0
    assert len(servers(b, 1)) == 1


def test_prohibited_mode_lets_no_server_start(gpu_node):
    set_mode(gpu_node.fake, fk.NVML_COMPUTEMODE_PROHIBITED)
    a = gpu_node("a")
    assert a(f"start_server -uid {os.getuid()}").returncode == 0
    assert servers(a, 0) == []
    assert "compute mode PROHIBITED" in (a.log / "server.log").read_text()


def test_unknown_commands_are_still_refused(gpu_node):
    a = gpu_node("a")
    res = a("start_server -uid nobody")
    assert res.returncode == 1 and "this fake supports" in res.stderr


# ---- policy ----------------------------------------------------------------------------------


def mps_policy(policy, compute_mode=None, tiers=None):
    sharing = {"gpus": "0-3", "mode": "mps", "units": 100}
    if compute_mode is not None:
        sharing["compute_mode"] = compute_mode
    policy["node_groups"].append(
        {
            "name": "m",
            "nodes": "mps-01",
            "gpu": {"model": "A30-24GB", "count": 4},
            "cpus": 16,
            "memory_mb": 64000,
            "sharing": [sharing],
        }
    )
    policy["tiers"] = tiers or [
        {"name": "batch", "node_groups": ["g"], "default": True},
        {"name": "infer", "node_groups": ["m"]},
    ]
    return policy


def partition(site, name: str) -> str:
    conf = render_all(site)["slurm-gpushare.conf"]
    return next(line for line in conf.splitlines() if line.startswith(f"PartitionName={name} "))


def test_compute_mode_defaults_to_default_and_renders_no_exclusive_user(policy):
    site = build_site(mps_policy(policy), "t.yaml")
    assert {s.compute_mode for s in site.group("m").gpus} == {"default"}
    assert "ExclusiveUser" not in render_all(site)["slurm-gpushare.conf"]


def test_exclusive_process_renders_exclusive_user_on_its_tiers_only(policy):
    site = build_site(mps_policy(policy, "exclusive_process"), "t.yaml")
    assert "ExclusiveUser=YES" in partition(site, "infer")
    assert "ExclusiveUser" not in partition(site, "batch")


def test_tier_mixing_exclusive_process_mps_with_other_groups_is_refused(policy):
    tiers = [{"name": "batch", "node_groups": ["g", "m"], "default": True}]
    one(
        mps_policy(policy, "exclusive_process", tiers),
        "tiers[0].node_groups",
        "tier 'batch' mixes node groups m (MPS in compute_mode exclusive_process",
    )
    found = next(p for p in problems(mps_policy(minimal_policy(), "exclusive_process", tiers)) if "mixes" in p)
    assert "with g, which ExclusiveUser would also keep to one user per node" in found
    assert (
        "give m tiers of their own (only exclusive_process MPS groups), or set their compute_mode to default" in found
    )


def test_compute_mode_is_for_mps_and_takes_two_values(policy):
    policy["node_groups"][0]["sharing"][0]["compute_mode"] = "exclusive_process"
    one(policy, "node_groups[0].sharing[0].compute_mode", "not used by mode exclusive; it applies to mode mps")
    found = problems(mps_policy(minimal_policy(), "prohibited"))
    assert any("compute_mode" in p and "'default'" in p and "'exclusive_process'" in p for p in found), found


# ---- prolog decisions (pure) --------------------------------------------------------------------


A30_EP = ObservedGpu(0, "GPU-m", 0, 24576, False, compute_mode="EXCLUSIVE_PROCESS")


def test_default_mode_gives_each_user_and_percentage_a_daemon():
    a30 = ObservedGpu(0, "GPU-m", 0, 24576, False, compute_mode="DEFAULT")
    first = plan_prolog(job([0], 25, job_id=1), whole_node("mps"), live(a30))[0]
    other = plan_prolog(
        job([0], 50, job_id=2, uid=2002), whole_node("mps"), live(a30, journals={1: first}, alive={first.mps.key})
    )[0]
    assert (first.mps.key, other.mps.key) == ("g0-u2001-p25", "g0-u2002-p50")


def test_prohibited_gpu_refuses_naming_node_gpu_mode_and_fix():
    with pytest.raises(
        PrologRefused,
        match=r"GPU 0 \(GPU-m\) on n1: compute mode PROHIBITED lets no MPS server start; "
        r"set DEFAULT or EXCLUSIVE_PROCESS .*\(nvidia-smi -i 0 -c DEFAULT\)",
    ):
        plan_prolog(
            job([0], 25), whole_node("mps"), live(ObservedGpu(0, "GPU-m", 0, 24576, False, compute_mode="PROHIBITED"))
        )


def test_exclusive_process_one_daemon_per_user_at_100_with_client_limits():
    first, actions = plan_prolog(job([0], 25, job_id=1), whole_node("mps"), live(A30_EP))
    assert first.mps.key == "g0-u2001-p100" and first.mps.percentage == 100 and first.mps.mem_limit_mib == (24576,)
    assert first.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert first.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144MB"
    assert any(isinstance(a, StartMps) for a in actions)
    # the same user's job at another percentage shares the daemon that holds the GPU
    second, actions = plan_prolog(
        job([0], 50, job_id=2), whole_node("mps"), live(A30_EP, journals={1: first}, alive={first.mps.key})
    )
    assert second.mps.key == first.mps.key and not any(isinstance(a, StartMps) for a in actions)
    assert second.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert second.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288MB"


def test_exclusive_process_refuses_a_second_users_daemon_naming_the_holder():
    first = plan_prolog(job([0], 25, job_id=1), whole_node("mps"), live(A30_EP))[0]
    with pytest.raises(
        PrologRefused,
        match=r"compute mode EXCLUSIVE_PROCESS allows one MPS server and MPS daemon "
        r"g0-u2001-p100 \(uid 2001, job 1\) holds it, so the server for uid 2002 "
        r"cannot start: .*ExclusiveUser=YES",
    ):
        plan_prolog(
            job([0], 25, job_id=2, uid=2002),
            whole_node("mps"),
            live(A30_EP, journals={1: first}, alive={first.mps.key}),
        )
    # a holder whose daemon no longer answers is not in the way (the prolog starts a fresh one)
    journal, _ = plan_prolog(job([0], 25, job_id=2, uid=2002), whole_node("mps"), live(A30_EP, journals={1: first}))
    assert journal.mps.key == "g0-u2002-p100"


def test_prolog_hook_reads_the_live_compute_mode(mps_node):
    with mps_node.backend() as backend:
        backend.set_compute_mode(0, "EXCLUSIVE_PROCESS")
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    journal = JournalStore(mps_node.state_dir).read(11)
    assert journal.mps.percentage == 100 and journal.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    with mps_node.backend() as backend:
        backend.set_compute_mode(0, "PROHIBITED")
    calls = []
    assert (
        prolog_hook.main(
            mps_node.env(12, "0", 25, uid=os.getuid() + 1),
            runner=lambda argv, **kw: calls.append(argv) or no_scontrol(argv, **kw),
            mps=mps_node.mps,
        )
        == 1
    )
    assert any("compute mode PROHIBITED lets no MPS server start" in " ".join(c) for c in calls), calls


# ---- health ---------------------------------------------------------------------------------------


def test_health_names_an_mps_gpu_whose_compute_mode_is_not_the_policys(mps_node):
    slots = mps_node.slots
    with mps_node.backend() as backend:
        assert check_compute_modes(slots, backend) == []
        backend.set_compute_mode(0, "EXCLUSIVE_PROCESS")
        uuid = backend.gpu(0).uuid
        assert check_compute_modes(slots, backend) == [
            f"GPU 0 ({uuid}) is EXCLUSIVE_PROCESS, policy default: nvidia-smi -i 0 -c DEFAULT"
        ]


def test_fake_state_records_compute_mode(nvml):
    assert json.loads(nvml.state_path.read_text())["gpus"][0]["compute_mode"] == 0
