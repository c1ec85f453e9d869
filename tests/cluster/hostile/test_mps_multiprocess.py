"""A multi-process MPS job on the small lab (issue 21 part 6): refused at submission, with the reason.

NVIDIA MPS applies the active thread percentage and the pinned device memory limit to each client
process (docs/users/mps-isolation.md), so a job of n tasks on one node would hold n times its
``mps:N`` share. job_submit.lua refuses such a job (MPS_TASKS) whether it comes from sbatch or srun,
says why, and steers to one task per node or to a MIG slice; a one-task MPS job still runs, its one
process limited to the job's share by the daemon the prolog set up.

Its own compose project (small-lab with the node hooks, as tests/cluster/test_node_runtime.py).
Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_mps_multiprocess.py
"""

from __future__ import annotations

import os

import pytest

from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import own_cluster
from tests.cluster.test_node_runtime import (
    ENV_SCRIPT,
    env_of,
    finished,
    hooks_policy,
    mps_daemons,
    node_shell,
    submit,
    wait_clean,
)

PROJECT = os.environ.get("GPUSHARE_MPS_MULTIPROCESS_PROJECT", "gpsh21mpsmp")
USER, ACCOUNT = "carol", "biology"
WHY = "an MPS share is enforced per process, not per job"
MIG_HINT = "ask for a MIG slice (e.g. --gres=gpu:a100_40g_1g.5gb:1)"


@pytest.fixture(scope="module")
def lab():
    yield from own_cluster(
        "mpsmultiprocess",
        PROJECT,
        lambda work: hooks_policy(work / "small-lab-hooks.yaml"),
        "GPUSHARE_MPS_MULTIPROCESS_KEEP",
    )


def refused(c: TestCluster, argv: list[str]) -> str:
    """Run a submission command as the user; it must fail. What the user was told (stdout and stderr)."""
    res = c.slurm(argv, user=USER, check=False, timeout=60)
    assert res.returncode != 0, f"{argv} was accepted: {res.stdout}"
    return res.stdout + res.stderr


def jobs_of(c: TestCluster, user: str) -> list[str]:
    return c.slurm(["squeue", "-h", "-u", user, "-o", "%i"]).stdout.split()


@pytest.mark.parametrize(
    "argv, tasks",
    [
        (["sbatch", f"--account={ACCOUNT}", "--gres=mps:50", "--ntasks=2", "--output=/dev/null", "--wrap=true"], 2),
        (
            [
                "sbatch",
                f"--account={ACCOUNT}",
                "--gres=mps:25",
                "--ntasks-per-node=3",
                "--output=/dev/null",
                "--wrap=true",
            ],
            3,
        ),
        (["srun", f"--account={ACCOUNT}", "--gres=mps:50", "-n", "2", "true"], 2),
    ],
)
def test_multi_task_mps_job_is_refused_with_the_reason(lab, argv, tasks):
    c = lab
    told = refused(c, argv)
    assert f"MPS_TASKS tasks={tasks}" in told, told
    assert WHY in told and f"{tasks} tasks on one node would each get the whole" in told, told
    assert MIG_HINT in told, told
    assert jobs_of(c, USER) == []
    log = c.exec(
        "slurmctld", ["grep", "-c", f"rejected: MPS_TASKS tasks={tasks}", "/var/log/slurm/slurmctld.log"], check=False
    ).stdout.strip()
    assert log not in ("", "0"), "slurmctld's log has no rejection line"


def test_one_task_mps_job_runs_limited_to_its_share(lab):
    """The accepted form: one task, whose one process gets the job's share, set on its daemon by root."""
    c = lab
    _rec, out = finished(c, submit(c, ENV_SCRIPT, user=USER, account=ACCOUNT, gres="mps:50", ntasks=1))
    env = env_of(out)
    half = c.site.group("lab-mps").model.memory_mib * 50 // 100
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={half}MB"
    # what root told the daemon before its server started: the defaults every client process of it gets
    log = node_shell(c, "lab-mps01", f"grep -h 'Cmd:set_default' {env['CUDA_MPS_LOG_DIRECTORY']}/control.log").stdout
    commands = [line.split("Cmd:", 1)[1].strip() for line in log.splitlines()]
    assert commands == ["set_default_active_thread_percentage 50", f"set_default_device_pinned_mem_limit 0 {half}M"], (
        out
    )
    wait_clean(c, "lab-mps01")
    assert mps_daemons(c) == []
