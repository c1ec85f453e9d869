"""`gpushare node ...` through click's CliRunner, on the fake NVML: exit codes and messages."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.node import FAKE_ENV, node
from slurm_gpushare.gpu.fakenvml import FakeNvml
from tests.conftest import ROOT, minimal_policy

LAB = str(ROOT / "etc" / "small-lab.yaml")


def run(*args, env=None):
    return CliRunner().invoke(node, [str(a) for a in args], env=env)


@pytest.fixture
def lab_mig(tmp_path):
    """The small lab's MIG node: one A100-40GB in MIG mode, no instances yet."""
    state = tmp_path / "nvml.json"
    res = run(
        "fake-nvml", "init", "--state", state, "--model", "A100-SXM4-40GB", "--count", 1, "--mig", "0", "--seed", "lab"
    )
    assert res.exit_code == 0, res.output
    return state


def lab(*args, state):
    return run(*args, "--policy", LAB, "--node", "lab-mig01", "--fake-nvml", state)


def test_init_writes_state_and_mig_minors(lab_mig):
    assert FakeNvml(lab_mig).mig_minors_path.read_text().startswith("config 1\nmonitor 2\n")
    res = run("fake-nvml", "init", "--state", lab_mig, "--model", "A100-SXM4-40GB", "--count", 1)
    assert res.exit_code == 2 and "--force" in res.stderr
    res = run("fake-nvml", "init", "--state", lab_mig, "--model", "A100-SXM4-40GB", "--count", 1, "--force")
    assert res.exit_code == 0


def test_init_force_replaces_only_a_fake_state(tmp_path):
    other = tmp_path / "slurm.conf"
    other.write_text("ClusterName=x\n")
    res = run("fake-nvml", "init", "--state", other, "--model", "L40S", "--count", 1, "--force")
    assert res.exit_code == 2 and "not a fake NVML state" in res.stderr
    assert other.read_text() == "ClusterName=x\n"


def test_init_refuses_bad_input(tmp_path):
    res = run("fake-nvml", "init", "--state", tmp_path / "s.json", "--model", "L40S", "--count", 2, "--mig", "0")
    assert res.exit_code == 2 and "does not support MIG" in res.stderr
    res = run("fake-nvml", "init", "--state", tmp_path / "s.json", "--model", "L40S", "--count", 2, "--mig", "zero")
    assert res.exit_code == 2 and "comma-separated" in res.stderr
    assert not (tmp_path / "s.json").exists()


def test_assert_apply_assert(lab_mig):
    res = lab("mig", "assert", state=lab_mig)
    assert res.exit_code == 1
    assert (
        "node lab-mig01: MIG layout differs" in res.stdout
        and "GPU 0: have no MIG instances, want 1g.5gb x7" in res.stdout
    )
    assert "using fake NVML state" in res.stderr

    before = lab_mig.read_text()
    res = lab("mig", "apply", "--dry-run", state=lab_mig)
    assert res.exit_code == 0 and res.stdout.count("would GPU 0: create 1g.5gb") == 7
    assert lab_mig.read_text() == before

    res = lab("mig", "apply", state=lab_mig)
    assert res.exit_code == 0 and "MIG layout applied (7 actions)" in res.stdout
    res = lab("mig", "assert", state=lab_mig)
    assert res.exit_code == 0 and "matches the policy" in res.stdout
    res = lab("mig", "apply", state=lab_mig)
    assert res.exit_code == 0 and "nothing to do" in res.stdout


def test_env_selects_the_fake(lab_mig):
    res = run("mig", "assert", "--policy", LAB, "--node", "lab-mig01", env={FAKE_ENV: str(lab_mig)})
    assert res.exit_code == 1 and "want 1g.5gb x7" in res.stdout


def test_apply_refused_with_processes(tmp_path):
    state = tmp_path / "nvml.json"
    FakeNvml.build(state, model="A100-SXM4-40GB", count=1, mig_enabled=[0])
    run("mig", "apply", "--policy", LAB, "--node", "lab-mig01", "--fake-nvml", state)
    res = run("fake-nvml", "add-process", "--state", state, "--gpu", 0, "--gi", 7, "--ci", 0, "--pid", 4242)
    assert res.exit_code == 0, res.output
    policy = copy.deepcopy(yaml.safe_load(Path(LAB).read_text()))
    policy["node_groups"][2]["sharing"][0]["layout"] = ["3g.20gb", "2g.10gb", "1g.5gb"]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(policy))
    res = run("mig", "apply", "--policy", other, "--node", "lab-mig01", "--fake-nvml", state)
    assert res.exit_code == 1
    assert "node lab-mig01: GPU 0 (GPU-" in res.stderr and "PIDs 4242" in res.stderr
    res = run("fake-nvml", "remove-process", "--state", state, "--pid", 4242)
    assert res.exit_code == 0
    assert run("mig", "apply", "--policy", other, "--node", "lab-mig01", "--fake-nvml", state).exit_code == 0


def test_gres_conf_out_and_default_path(tmp_path, lab_mig):
    assert lab("gres-conf", "--out", "-", state=lab_mig).exit_code == 1  # not applied yet: refused
    lab("mig", "apply", state=lab_mig)
    res = lab("gres-conf", "--out", "-", state=lab_mig)
    assert res.exit_code == 0 and res.stdout.count("NodeName=lab-mig01 Name=gpu Type=a100_40g_1g.5gb") == 7

    raw = copy.deepcopy(minimal_policy())
    raw["node_groups"][0]["sharing"][1]["layout"] = ["1g.5gb"] * 7
    raw["node_groups"][0]["sharing"] = [raw["node_groups"][0]["sharing"][1] | {"gpus": 0}]
    raw["node_groups"][0]["gpu"]["count"] = 1
    raw["cluster"]["paths"] = {"gres_include": str(tmp_path / "gres.d" / "mig.conf")}
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(raw))
    res = run("gres-conf", "--policy", policy, "--node", "gpu-01", "--fake-nvml", lab_mig)
    assert res.exit_code == 0, res.output
    written = (tmp_path / "gres.d" / "mig.conf").read_text()
    assert written.count("NodeName=gpu-01 Name=gpu Type=a100_40g_1g.5gb") == 7


def test_usage_and_other_errors_exit_2(tmp_path, lab_mig):
    assert run("mig", "assert", "--node", "x").exit_code == 2  # --policy missing
    res = run("mig", "assert", "--policy", LAB, "--node", "nowhere", "--fake-nvml", lab_mig)
    assert res.exit_code == 2 and "'nowhere' is in no node group" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    res = run("mig", "assert", "--policy", bad, "--node", "x", "--fake-nvml", lab_mig)
    assert res.exit_code == 1 and "bad.yaml" in res.stderr  # a policy with problems: 1, as for `gpushare validate`
    res = run("mig", "assert", "--policy", LAB, "--node", "lab-mig01", "--fake-nvml", tmp_path / "none.json")
    assert res.exit_code == 2 and "fake-nvml init" in res.stderr


def test_without_fake_uses_real_nvml_and_says_why_it_cannot(monkeypatch):
    monkeypatch.delenv(FAKE_ENV, raising=False)
    if _real_nvml_works():  # pragma: no cover - the gpu tier runs on GPU machines
        pytest.skip("NVML is available here")
    res = run("mig", "assert", "--policy", LAB, "--node", "lab-mig01")
    assert res.exit_code == 2 and "NVML" in res.stderr and "fake NVML" not in res.stderr


def _real_nvml_works() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True
