"""The site's own health program (cluster.health.site_program) run by the gpushare health check first:
its output and exit code stay its own, and our decision is unchanged by it."""

from __future__ import annotations

import os

import yaml

from slurm_gpushare.hooks import health as health_hook
from slurm_gpushare.node.health import Leave
from slurm_gpushare.proc import run
from tests.unit.hooks.test_repair import FakeSlurm
from tests.unit.hooks_support import ROOT, HookNode


def site_node(tmp_path, script: str) -> tuple[HookNode, str]:
    program = tmp_path / "nhc"
    program.write_text(script)
    os.chmod(program, 0o755)
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    raw["cluster"].setdefault("health", {})["site_program"] = str(program)
    policy = tmp_path / "site-policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    return HookNode(tmp_path, "lab-excl01", policy), str(program)


def runner_for(program: str, slurm: FakeSlurm):
    def runner(argv, **kw):
        return run(argv, **kw) if list(argv) == [program] else slurm(argv, **kw)

    return runner


def test_the_site_program_runs_first_and_its_failure_is_its_own(tmp_path, capsys):
    node, program = site_node(tmp_path, "#!/bin/sh\necho 'ERROR: nhc: /scratch is full'\nexit 3\n")
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    lines: list[str] = []
    env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config), "PATH": "/usr/bin:/bin"}
    report = health_hook.health(
        env, runner=runner_for(program, slurm), mps=node.mps, is_device=lambda p: True, out=lines.append
    )
    assert lines[:2] == [
        f"site health program {program}: ERROR: nhc: /scratch is full",
        f"site health program {program}: exited 3",
    ]
    assert report.decision == Leave("healthy")  # ours decides on its own findings only
    assert not [c for c in slurm.calls if c[:2] == ["scontrol", "update"]]
    code = health_hook.main(env, runner=runner_for(program, slurm), mps=node.mps, is_device=lambda p: True)
    assert code == 3


def test_a_passing_site_program_leaves_the_exit_code_ours(tmp_path):
    node, program = site_node(tmp_path, "#!/bin/sh\nexit 0\n")
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config), "PATH": "/usr/bin:/bin"}
    assert health_hook.main(env, runner=runner_for(program, slurm), mps=node.mps, is_device=lambda p: True) == 0


def test_a_site_program_that_cannot_start_is_reported_not_fatal(tmp_path):
    node, program = site_node(tmp_path, "#!/bin/sh\nexit 0\n")
    os.unlink(program)
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    lines: list[str] = []
    env = {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config), "PATH": "/usr/bin:/bin"}
    report = health_hook.health(
        env, runner=runner_for(program, slurm), mps=node.mps, is_device=lambda p: True, out=lines.append
    )
    assert lines[0].startswith(f"site health program {program}: `{program}` could not start")
    assert report.decision == Leave("healthy")
