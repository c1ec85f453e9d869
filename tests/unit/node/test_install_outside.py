"""`gpushare node install --outside-policy`: on a node the policy does not describe, which the merged slurm.conf
still gives the product's hooks, it writes the hook scripts, a node.yaml saying so and the empty gres include,
and nothing else; the scripts it wrote then do nothing of ours. Which kind of node it installs is said, and a
node name that contradicts it is refused (a typo in the policy never silently makes a GPU node of the policy
an outside one)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.node import node
from slurm_gpushare.node import install as inst
from slurm_gpushare.proc import run
from tests.conftest import ROOT

SITE_PROGRAM = "/usr/sbin/nhc"


def invoke(*args):
    return CliRunner().invoke(node, ["install", *map(str, args)])


@pytest.fixture
def policy(tmp_path) -> Path:
    """The small lab (MIG nodes: gres.conf includes the gres include), with a site health program and metrics."""
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["cluster"].setdefault("health", {})["site_program"] = SITE_PROGRAM
    raw["cluster"].setdefault("metrics", {})["textfile_dir"] = "/var/lib/node-exporter/textfile"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def files(root: Path) -> dict[str, int]:
    """Every file under root (not the directories made on the way): its mode."""
    return {"/" + str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*") if p.is_file()}


def test_it_writes_the_hooks_an_outside_node_config_and_the_empty_gres_include_only(tmp_path, policy):
    root = tmp_path / "root"
    done = invoke("--policy", policy, "--root", root, "--outside-policy")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[0] == (
        "node install: for outside the policy (--outside-policy); node name not checked (--root without --node: "
        "an image)"
    )
    assert files(root) == {
        "/etc/gpushare/node.yaml": 0o644,
        "/etc/slurm/gres.d/gpushare-mig.conf": 0o644,
        "/usr/local/sbin/gpushare-prolog": 0o755,
        "/usr/local/sbin/gpushare-epilog": 0o755,
        "/usr/local/bin/gpushare-task-prolog": 0o755,
        "/usr/local/sbin/gpushare-node-health": 0o755,
    }  # no state dir, metrics dir or boot unit
    config = (root / "etc/gpushare/node.yaml").read_text()
    assert inst.ours(config) and config.splitlines()[3:] == [
        "outside_policy: yes",
        f"site_health_program: {SITE_PROGRAM}",
    ]
    assert (root / "etc/slurm/gres.d/gpushare-mig.conf").read_text() == ""
    prolog = (root / "usr/local/sbin/gpushare-prolog").read_text().splitlines()
    assert prolog[0] == f"#!{sys.executable} -IS" and prolog[-2:] == [
        inst.entry(inst.PROLOG),
        "raise SystemExit(main())",
    ]
    again = invoke("--policy", policy, "--root", root, "--outside-policy")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output


def test_the_scripts_it_wrote_do_nothing_of_ours(tmp_path, policy):
    """Each script's lines, run by this interpreter on this test's import path: its own ``-IS`` line would import
    the package installed in the interpreter, which in a checkout may be an older copy than the tree under test."""
    root = tmp_path / "root"
    assert invoke("--policy", policy, "--root", root, "--outside-policy").exit_code == 0
    env = {
        "PATH": os.defpath,
        "GPUSHARE_NODE_CONFIG": str(root / "etc/gpushare/node.yaml"),
        "SLURMD_NODENAME": "legacy-gpu01",
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    for hook in (
        "usr/local/sbin/gpushare-prolog",
        "usr/local/bin/gpushare-task-prolog",
        "usr/local/sbin/gpushare-epilog",
    ):
        done = run([sys.executable, str(root / hook)], env=env, timeout=60, check=False)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), hook


def test_a_policy_without_a_task_prolog_or_health_check_gets_no_script_for_them(tmp_path, policy):
    raw = yaml.safe_load(policy.read_text())
    del raw["cluster"]["health"]
    raw["cluster"]["hooks"].pop("task_prolog", None)
    policy.write_text(yaml.safe_dump(raw))
    root = tmp_path / "root"
    assert invoke("--policy", policy, "--root", root, "--outside-policy").exit_code == 0
    assert set(files(root)) == {
        "/etc/gpushare/node.yaml",
        "/etc/slurm/gres.d/gpushare-mig.conf",
        "/usr/local/sbin/gpushare-prolog",
        "/usr/local/sbin/gpushare-epilog",
    }
    assert (root / "etc/gpushare/node.yaml").read_text().splitlines()[3:] == ["outside_policy: yes"]


def test_an_empty_gres_include_already_there_is_kept_and_another_refused(tmp_path, policy):
    root = tmp_path / "root"
    include = root / "etc/slurm/gres.d/gpushare-mig.conf"
    include.parent.mkdir(parents=True)
    include.write_text("")
    os.chmod(include, 0o644)
    done = invoke("--policy", policy, "--root", root, "--outside-policy")
    assert done.exit_code == 0 and f"unchanged: {include}: gres include" in done.output, done.output
    include.write_text("NodeName=legacy-gpu01 Name=gpu File=/dev/nvidia0\n")
    done = invoke("--policy", policy, "--root", root, "--outside-policy")
    assert done.exit_code == 1 and f"refused: {include}: gres include" in done.output, done.output


def test_a_node_of_the_policy_is_refused_the_outside_mode(tmp_path, policy):
    done = invoke("--policy", policy, "--root", tmp_path / "root", "--outside-policy", "--node", "lab-mig01")
    assert done.exit_code != 0 and not (tmp_path / "root").exists()
    assert (
        f"node lab-mig01 is in node group lab-mig of the policy ({policy}): it needs the policy's hooks" in done.output
    )


def test_a_name_the_policy_does_not_have_is_refused_unless_outside_is_said(tmp_path, policy):
    """A typo (lab-mig1 for lab-mig01) is never taken for a node outside the policy."""
    done = invoke("--policy", policy, "--root", tmp_path / "root", "--node", "lab-mig1")
    assert done.exit_code != 0 and not (tmp_path / "root").exists()
    assert f"node lab-mig1 is in no node group of the policy ({policy}: " in done.output
    assert "run `gpushare node install --outside-policy`" in done.output and "pass --node NAME" in done.output
    done = invoke("--policy", policy, "--root", tmp_path / "root", "--node", "legacy-gpu01", "--outside-policy")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("node legacy-gpu01: outside the policy (--outside-policy; no node group of ")


def test_a_node_of_the_policy_is_named_as_such(tmp_path, policy):
    done = invoke("--policy", policy, "--root", tmp_path / "root", "--node", "lab-mig01")
    assert done.exit_code == 0 and done.output.startswith("node lab-mig01: node group lab-mig of the policy\n")
