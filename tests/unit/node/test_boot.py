"""`gpushare node boot` on the fake NVML: a rebooted node's MIG mode, layouts, per-job GPUs, compute modes and gres
include put back before slurmd starts; what it cannot do refused before anything changes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.node import node
from slurm_gpushare.gpu import GpuError, open_backend
from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hardware import get_model
from slurm_gpushare.node.boot import (
    BootRefused,
    BootState,
    EnableMig,
    SetComputeMode,
    SweepInstance,
    plan_boot,
    run_boot,
)
from slurm_gpushare.node.journal import Device, Journal, JournalStore
from slurm_gpushare.node.mig import CreateGi, observe
from slurm_gpushare.policy import build_site
from tests.conftest import minimal_policy

H100 = "H100-SXM5-80GB"
FIXED = [{"gpus": 0, "mode": "mig", "layout": ["3g.40gb", "3g.40gb"]}, {"gpus": 1, "mode": "exclusive"}]
PER_JOB = [{"gpus": "0-1", "mode": "mig", "per_job": True, "profiles": ["1g.10gb", "3g.40gb"]}]
MPS = [
    {"gpus": 0, "mode": "mps", "units": 100, "compute_mode": "exclusive_process"},
    {"gpus": 1, "mode": "mps", "units": 100},
]


def policy_raw(tmp_path: Path, model: str, count: int, sharing: list[dict]) -> dict:
    raw = copy.deepcopy(minimal_policy())
    raw["node_groups"][0].update(nodes="gpu-01", gpu={"model": model, "count": count}, sharing=sharing)
    raw["cluster"]["paths"] = {"gres_include": str(tmp_path / "gres.d" / "mig.conf"), "state_dir": str(tmp_path / "st")}
    raw["cluster"]["hooks"] = {
        "prolog": "/usr/local/sbin/gpushare-prolog",
        "epilog": "/usr/local/sbin/gpushare-epilog",
        "task_prolog": "/usr/local/bin/gpushare-task-prolog",
        "job_submit_lua": True,
    }
    return raw


def write_policy(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


class Node:
    """A node: its policy file, node.yaml, fake NVML (MIG mode as built) and the boot command on them."""

    def __init__(self, tmp_path: Path, model: str, sharing: list[dict], mig: tuple[int, ...] = (), count: int = 2):
        self.tmp = tmp_path
        self.raw = policy_raw(tmp_path, model, count, sharing)
        self.policy = write_policy(tmp_path / "policy.yaml", self.raw)
        self.slots = build_site(self.raw, "policy.yaml").group_for_node("gpu-01").gpus
        self.fake = FakeNvml.build(tmp_path / "nvml.json", model=model, count=count, mig_enabled=list(mig), seed="t")
        self.config = tmp_path / "node.yaml"
        self.write_config()
        self.include = tmp_path / "gres.d" / "mig.conf"

    def write_config(self, **extra: str) -> None:
        lines = {"policy": str(self.policy), "fake_nvml": str(self.fake.state_path), **extra}
        self.config.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
        self.config.chmod(0o644)

    def boot(self, *args: str):
        return CliRunner().invoke(node, ["boot", "--node-config", str(self.config), "--node", "gpu-01", *args])

    def backend(self):
        return open_backend(self.fake.state_path)

    def mig_modes(self) -> list[bool | None]:
        with self.backend() as b:
            return [g.mig_current for g in b.gpus()]

    def profiles(self, index: int) -> list[str]:
        model = get_model(self.slots[0].model.name)
        with self.backend() as b:
            return sorted(model.profile_for_constant(g.profile_constant).name for g in b.gpu_instances(index))

    def fake_uuid(self, index: int) -> str:
        with self.backend() as b:
            return b.gpu(index).uuid

    def compute_modes(self) -> list[str]:
        with self.backend() as b:
            return [b.compute_mode(i) for i in range(len(b.gpus()))]


def make_instance(n: Node, index: int, profile: str, start: int) -> int:
    model = n.slots[0].model
    with n.backend() as b:
        ids = {p.constant: p.id for p in b.gpu_instance_profiles(index)}
        gi = b.create_gpu_instance(index, ids[model.profile(profile).nvml_constant], start)
        b.create_compute_instance(index, gi.id, model.profile(profile).full_compute_constant)
        return gi.id


# ---- a Hopper node after a reboot ------------------------------------------------------------------


def test_a_rebooted_hopper_node_gets_mig_mode_layout_and_gres_include_back(tmp_path):
    n = Node(tmp_path, H100, FIXED, mig=(0,))
    first = n.boot()
    assert first.exit_code == 0, first.output
    assert n.profiles(0) == ["3g.40gb", "3g.40gb"]
    before = n.include.read_text()
    assert before.count("NodeName=gpu-01 Name=gpu Type=h100_3g.40gb") == 2

    n.fake.reboot()  # instances gone, and Hopper loses MIG mode with the driver
    assert n.mig_modes() == [False, False] and n.profiles(0) == []
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert n.mig_modes() == [True, False] and n.profiles(0) == ["3g.40gb", "3g.40gb"]
    lines = res.output.splitlines()
    assert f"node gpu-01: policy {n.policy} (the site's: policy in {n.config})" == lines[0]
    enable = next(i for i, line in enumerate(lines) if line.endswith(": enable MIG mode"))
    create = next(i for i, line in enumerate(lines) if "create 3g.40gb" in line)
    assert lines[enable].startswith("GPU 0 (GPU-") and enable < create
    assert f"wrote the gres include {n.include} (2 MIG devices)" in lines
    assert lines[-1] == "node gpu-01: ready for slurmd (3 change(s) made)"
    after = n.include.read_text()
    assert after != before and after.count("Type=h100_3g.40gb") == 2  # new MIG UUIDs, the same slices

    again = n.boot()
    assert again.exit_code == 0 and "nothing to change" in again.output and "unchanged (2 MIG devices)" in again.output


def test_dry_run_changes_nothing(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    res = n.boot("--dry-run")
    assert res.exit_code == 0, res.output
    assert "would: GPU 0 (GPU-" in res.output and "enable MIG mode" in res.output
    assert "would then plan the MIG layout" in res.output and "would: then write the gres include" in res.output
    assert n.mig_modes() == [False, False] and not n.include.exists()


def test_processes_on_a_gpu_whose_mig_mode_is_off_refuse_the_boot(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    n.fake.add_process(0, 4242)
    res = n.boot()
    assert res.exit_code == 1
    assert "node gpu-01 is not ready for slurmd" in res.stderr and "PIDs 4242" in res.stderr
    assert n.mig_modes() == [False, False] and not n.include.exists()


def test_nvml_answering_in_use_is_an_error_naming_the_gpu(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    n.fake.add_process(0, 7)
    with n.backend() as b, pytest.raises(GpuError) as exc:
        b.set_mig_mode(0, True)
    assert exc.value.code == 19 and "GPU 0 (GPU-" in str(exc.value) and "nvidia-persistenced" in str(exc.value)
    n.fake.remove_process(7)
    with n.backend() as b:
        b.set_mig_mode(0, True)
        assert b.gpu(0).mig_current


# ---- an A100: MIG mode takes a reset --------------------------------------------------------------


def test_an_a100_whose_mig_mode_is_off_is_refused_with_what_blocks_it(tmp_path):
    n = Node(tmp_path, "A100-SXM4-40GB", [{"gpus": 0, "mode": "mig", "layout": ["3g.20gb", "3g.20gb"]}], count=1)
    res = n.boot()
    assert res.exit_code == 1, res.output
    for words in ("GPU 0 (GPU-", "GPU reset", "nvidia-persistenced", "dcgm-exporter", "nvidia_drm", "-mig 1", "-r`"):
        assert words in res.stderr, (words, res.stderr)
    assert n.mig_modes() == [False] and not n.include.exists()

    n.fake.set_mig_mode(0, True)  # the admin's reset
    n.fake.reboot()  # an A100 keeps MIG mode across a reboot
    assert n.boot().exit_code == 0 and n.profiles(0) == ["3g.20gb", "3g.20gb"]


def test_a_gpu_of_another_model_is_refused(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    other = FakeNvml.build(tmp_path / "nvml.json", model="A100-SXM4-40GB", count=2, mig_enabled=[], seed="t")
    assert other.state_path == n.fake.state_path
    res = n.boot()
    assert res.exit_code == 1 and "but the policy says H100-SXM5-80GB" in res.stderr


# ---- per-job MIG GPUs -----------------------------------------------------------------------------


def test_per_job_gpus_get_mig_mode_and_lose_instances_no_journal_names(tmp_path):
    n = Node(tmp_path, H100, PER_JOB, mig=(0, 1))
    claimed = make_instance(n, 0, "3g.40gb", 0)
    stale = make_instance(n, 0, "1g.10gb", 6)
    used = make_instance(n, 1, "1g.10gb", 0)
    n.fake.add_process(1, 99, gi=used, ci=0)
    with n.backend() as b:
        uuid = b.gpu(0).uuid
    store = JournalStore(tmp_path / "st")
    device = Device(0, 0, uuid, "mig", gi=claimed, profile="3g.40gb", start=0)
    with store.locked():
        store.write(Journal(17, 1000, 1000, "gpu-01", "ready", (device,)))
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert f"GPU 0: destroy GPU instance {stale} at memory slice 6 (no job's)" in res.output
    assert "processes 99 use it: left" in res.output
    assert n.profiles(0) == ["3g.40gb"] and n.profiles(1) == ["1g.10gb"]
    assert "no MIG GPUs in the policy" in n.include.read_text()  # per-job GPUs are declared in slurm.conf only


def test_a_per_job_node_after_a_reboot_gets_mig_mode_back(tmp_path):
    n = Node(tmp_path, H100, PER_JOB, mig=(0, 1))
    n.fake.reboot()
    assert n.mig_modes() == [False, False]
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert n.mig_modes() == [True, True] and res.output.count("enable MIG mode") == 2


def test_a_journal_set_aside_keeps_per_job_instances_for_reconcile(tmp_path):
    n = Node(tmp_path, H100, PER_JOB, mig=(0, 1))
    make_instance(n, 0, "1g.10gb", 0)
    jobs = tmp_path / "st" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "5.json").write_text("not a journal")
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert "left for `gpushare node reconcile`" in res.output and n.profiles(0) == ["1g.10gb"]


# ---- MPS compute modes ----------------------------------------------------------------------------


def test_mps_compute_modes_are_put_back(tmp_path):
    n = Node(tmp_path, H100, MPS)
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert n.compute_modes() == ["EXCLUSIVE_PROCESS", "DEFAULT"]
    assert "GPU 0 (GPU-" in res.output and "compute mode DEFAULT -> EXCLUSIVE_PROCESS" in res.output
    n.fake.reboot()
    assert n.compute_modes() == ["DEFAULT", "DEFAULT"]
    with n.backend() as b:
        b.set_compute_mode(1, "PROHIBITED")
    assert n.boot().exit_code == 0 and n.compute_modes() == ["EXCLUSIVE_PROCESS", "DEFAULT"]


# ---- which policy ---------------------------------------------------------------------------------


def test_the_live_planners_policy_wins_once_written(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    live = tmp_path / "live.yaml"
    n.write_config(live_policy=str(live))
    res = n.boot()
    assert res.exit_code == 0 and f"live_policy {live} not written yet" in res.output
    raw = copy.deepcopy(n.raw)
    raw["node_groups"][0]["sharing"][0]["layout"] = ["1g.10gb"] * 7
    write_policy(live, raw)
    n.fake.reboot()
    res = n.boot()
    assert res.exit_code == 0, res.output
    assert f"policy {live} (the live planner's: live_policy in {n.config})" in res.output
    assert n.profiles(0) == ["1g.10gb"] * 7 and n.include.read_text().count("Type=h100_1g.10gb") == 7


# ---- the pure plan --------------------------------------------------------------------------------


def test_the_plan_waits_for_mig_mode_before_the_layout(tmp_path):
    n = Node(tmp_path, H100, FIXED)
    with n.backend() as b:
        seen = BootState(observe(b), {}, {})
    plan = plan_boot(n.slots, seen)
    assert [type(a) for a in plan.actions] == [EnableMig] and plan.again and not plan.blockers
    with n.backend() as b:
        b.set_mig_mode(0, True)
        seen = BootState(observe(b), {}, {})
    plan = plan_boot(n.slots, seen)
    assert [type(a) for a in plan.actions] == [CreateGi, CreateGi] and not plan.again


def test_compute_modes_are_planned_for_mps_gpus_only(tmp_path):
    n = Node(tmp_path, H100, MPS)
    with n.backend() as b:
        seen = BootState(observe(b), {0: "DEFAULT", 1: "EXCLUSIVE_PROCESS"}, {})
    plan = plan_boot(n.slots, seen)
    assert [(a.index, a.want) for a in plan.actions if isinstance(a, SetComputeMode)] == [
        (0, "EXCLUSIVE_PROCESS"),
        (1, "DEFAULT"),
    ]


def test_a_node_that_never_settles_is_refused(tmp_path, monkeypatch):
    n = Node(tmp_path, H100, PER_JOB, mig=(0, 1))
    gi = make_instance(n, 0, "1g.10gb", 0)
    from slurm_gpushare.node import perjob

    monkeypatch.setattr(perjob, "destroy_unjournaled", lambda *a: None)  # a destroy that changes nothing
    said: list[str] = []
    with n.backend() as b, pytest.raises(BootRefused, match="still differ from the policy after 3 rounds"):
        run_boot("gpu-01", n.slots, b, JournalStore(tmp_path / "st"), str(tmp_path / "st"), said.append)
    assert said == [str(SweepInstance(Device(-1, 0, n.fake_uuid(0), "mig", gi=gi, profile="unjournaled", start=0)))] * 3


# ---- the fake NVML's reboot as the test cluster uses it ------------------------------------------


def test_fake_nvml_reboot_command(tmp_path):
    n = Node(tmp_path, H100, FIXED, mig=(0,))
    make_instance(n, 0, "3g.40gb", 0)
    run = CliRunner().invoke
    bad = run(node, ["fake-nvml", "reboot", "--state", str(n.fake.state_path), "--model", "A100-SXM4-40GB"])
    assert bad.exit_code == 2 and "init --force" in bad.stderr and n.profiles(0) == ["3g.40gb"]
    res = run(node, ["fake-nvml", "reboot", "--state", str(n.fake.state_path), "--model", H100, "--count", "2"])
    assert res.exit_code == 0, res.output
    assert n.profiles(0) == [] and n.mig_modes() == [False, False]
