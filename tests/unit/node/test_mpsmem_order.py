"""The MPS memory limit against Slurm's order of events on a node (cgroup v2, PrologFlags=Alloc,Contain).

Slurm runs the Prolog at allocation outside of any cgroup (Prolog and Epilog Guide) and only then spawns the
extern step (slurmd ``_rpc_prolog``: ``run_prolog``, then ``_spawn_prolog_stepd``), whose slurmstepd makes the
job's cgroup ``system.slice/slurmstepd.scope/job_<id>`` (cgroup/v2 ``cgroup_p_step_create``: ``mkdir`` 0755,
EEXIST accepted) and the step's cgroups below it. The scope itself is made when slurmd starts. So the fake tree
here holds the scope but no job cgroup when the prolog runs; ``extern_step`` does what the extern step does
after it. The task prolog then runs as the user in the job's cgroup, and its failure cancels the task (the
guide's "Failure Handling"); a prolog failure would drain the node, so these tests' runner fails on scontrol.
"""

from __future__ import annotations

import io
import json
import os

import pytest

from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import mpsmem, taskprolog
from tests.unit.hooks_support import HookNode, stop_daemons

A30_MIB = 24576
SCOPE = ("system.slice", "slurmstepd.scope")


def no_drain(argv, **kw):
    raise AssertionError(f"the node must not be drained: {argv}")


def extern_step(root, job_id: int):
    """What the extern step's slurmstepd does once the prolog returned: the job's cgroup (taken as it is when it
    exists), the extern step's below it, the stepd in ``slurm``, the job's processes in ``user``."""
    job = root.joinpath(*SCOPE, f"job_{job_id}")
    for d in (job, job / "step_extern", job / "step_extern" / "user", job / "step_extern" / "slurm"):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            pass
    return job


def task(node: HookNode, job_id: int) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {
        "SLURM_JOB_ID": str(job_id),
        "GPUSHARE_NODE_CONFIG": str(node.config),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    return taskprolog.main(env, out, err), out.getvalue(), err.getvalue()


@pytest.fixture
def node(tmp_path, monkeypatch):
    """An MPS node on an r615 driver: cgroup v2 at a test root, Slurm's scope made at slurmd's start, no job cgroup."""
    n = HookNode(tmp_path, "lab-mps01")
    root = tmp_path / "cgroup"
    root.joinpath(*SCOPE).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    monkeypatch.setattr(mpsmem, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(mpsmem, "CGROUP_OWNER", os.getuid())
    FakeNvml(n.state).mount_cgroup2(root)
    FakeNvml(n.state).set_driver("615.20.01")
    n.root = root
    yield n
    stop_daemons(n.state_dir)


def limit(node: HookNode, cgroup) -> tuple[int, int] | None:
    with node.backend() as backend:
        return backend.memory_limit(0, str(cgroup))


def test_the_limit_is_on_the_cgroup_slurm_puts_the_job_in_after_the_prolog(node):
    job = node.root.joinpath(*SCOPE, "job_11")
    assert not job.exists()  # Slurm's order: the prolog runs before the extern step makes it
    assert prolog_hook.main(node.env(11, "0", 25), runner=no_drain, mps=node.mps) == 0
    assert extern_step(node.root, 11) == job and (job / "step_extern" / "user").is_dir()
    assert limit(node, job) == (A30_MIB // 4, A30_MIB // 4)
    rc, out, _ = task(node, 11)
    assert rc == 0 and "CUDA_MPS_PIPE_DIRECTORY" in out and "GPUSHARE" not in out


def test_a_rerun_of_the_prolog_takes_the_job_cgroup_as_it_finds_it(node):
    job = extern_step(node.root, 11)
    assert prolog_hook.main(node.env(11, "0", 25), runner=no_drain, mps=node.mps) == 0
    assert limit(node, job) == (A30_MIB // 4, A30_MIB // 4) and (job / "step_extern").is_dir()


def _refused(node: HookNode, job_id: int, why: str) -> str:
    """The prolog ran the job's set-up without draining, and every task of the job fails with ``why`` in its output."""
    rc, out, err = task(node, job_id)
    assert rc == 1 and not any(line.startswith("export ") for line in out.splitlines()), out
    assert out.startswith(f"print gpushare-task-prolog: job {job_id} is not run on this node") and why in out
    assert "not run with per-process limits only" in out and "is not run on this node" in err
    return out


def test_a_job_cgroup_that_is_a_link_refuses_the_job_not_the_node(node, capsys):
    elsewhere = node.tmp / "elsewhere"
    elsewhere.mkdir()
    node.root.joinpath(*SCOPE, "job_11").symlink_to(elsewhere)
    assert prolog_hook.main(node.env(11, "0", 25), runner=no_drain, mps=node.mps) == 0
    assert "symbolic link" in capsys.readouterr().err
    assert json.loads(node.state.read_text())["gpus"][0].get("memory_limits", {}) == {}
    _refused(node, 11, "cgroup-unusable:")


def test_a_scope_not_of_root_refuses_the_job_not_the_node(node, monkeypatch, capsys):
    monkeypatch.setattr(mpsmem, "CGROUP_OWNER", os.getuid() + 1)
    assert prolog_hook.main(node.env(11, "0", 25), runner=no_drain, mps=node.mps) == 0
    assert "Slurm's cgroup scope" in capsys.readouterr().err
    assert not node.root.joinpath(*SCOPE, "job_11").exists()
    _refused(node, 11, "cgroup-unusable:")


def test_nvml_refusing_the_limit_refuses_the_job_not_the_node(node, monkeypatch):
    """r615 but NVML refuses (here: not root): the job does not run with per-process limits only."""
    init = FakeNvml.__init__
    monkeypatch.setattr(FakeNvml, "__init__", lambda self, state_path, euid=None: init(self, state_path, euid=1000))
    assert prolog_hook.main(node.env(11, "0", 25), runner=no_drain, mps=node.mps) == 0
    _refused(node, 11, "nvml-refused:")
