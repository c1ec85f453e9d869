"""node.mpsmem: an MPS job's memory share set on its cgroup where the driver offers per-cgroup limits (r615+),
nothing attempted where it does not; the prolog hook on a test node, both ways. Against Slurm's order of events
(the job's cgroup made after the prolog): test_mpsmem_order.py."""

from __future__ import annotations

import json
import os

import pytest

from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import mpsmem
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.mpsmem import (
    NOTHING,
    MemoryLimits,
    SetMemoryLimit,
    cgroup_problem,
    job_cgroup,
    make_job_cgroup,
    offered,
    plan_memory_limits,
    refusal_value,
)
from tests.unit.hooks_support import HookNode, stop_daemons

A30_MIB = 24576


def no_scontrol(argv, **kw):
    raise AssertionError(f"no Slurm command expected: {argv}")


# ---- planning (pure) -------------------------------------------------------------------------


def test_the_share_of_each_mps_gpu_on_the_job_cgroup():
    plan = plan_memory_limits(7, (0, 2), 25, {0: 24576, 2: 81920}, True, "/cg/job_7", None)
    assert plan == MemoryLimits(actions=(SetMemoryLimit(0, "/cg/job_7", 6144), SetMemoryLimit(2, "/cg/job_7", 20480)))
    assert plan_memory_limits(7, (0,), 25, {0: 24576}, True, "/cg/job_7", None, made=True).made == "/cg/job_7"


def test_nothing_where_the_driver_has_no_cgroup_limits():
    assert plan_memory_limits(7, (0,), 25, {0: 24576}, False, "/cg/job_7", None) == NOTHING
    assert plan_memory_limits(7, (0,), 25, {0: 24576}, False, "/cg/job_7", "anything", "absent") == NOTHING


def test_nothing_for_a_job_without_mps():
    assert plan_memory_limits(7, (), None, {}, True, "/cg/job_7", None) == NOTHING


def test_a_node_that_puts_no_job_in_a_cgroup_v2_is_a_note():
    plan = plan_memory_limits(7, (0,), 25, {0: 24576}, True, "/cg/job_7", None, "no cgroup v2 mounted at /cg")
    assert plan.actions == () and plan.refusal is None and plan.code is None
    assert plan.note == (
        "job 7: GPU memory limit not set: no cgroup v2 mounted at /cg; the job's processes are held "
        "only by MPS's per-process limits"
    )


def test_an_unusable_cgroup_refuses_the_job():
    plan = plan_memory_limits(
        7, (0,), 25, {0: 24576}, True, "/cg/job_7", "the job's cgroup /cg/job_7 is a symbolic link"
    )
    assert plan.actions == () and plan.note is None and plan.code == "cgroup-unusable:/cg/job_7"
    assert plan.refusal.startswith("job 7: GPU memory limit not set: the job's cgroup /cg/job_7 is a symbolic link")
    assert plan.refusal.endswith("rather than run with MPS's per-process limits only")


def test_the_refusal_is_one_task_file_field():
    assert refusal_value("nvml-refused", "/sys/fs/cgroup/a b\n/job_7") == "nvml-refused:/sys/fs/cgroup/a_b_/job_7"


def test_job_cgroup_is_slurms_cgroup_v2_layout():
    assert job_cgroup(42) == "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    assert job_cgroup(42, "/x/") == "/x/system.slice/slurmstepd.scope/job_42"


# ---- the cgroup, checked without following links --------------------------------------------


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "cgroup"
    job = root / "system.slice" / "slurmstepd.scope" / "job_42"
    job.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
    return root, job


def test_cgroup_checks(tree, tmp_path):
    root, job = tree
    me = os.getuid()
    assert cgroup_problem(str(job), str(root), owner=me) is None
    assert cgroup_problem(str(job), str(root), owner=me + 1).endswith(f"is owned by uid {me}, not uid {me + 1}")
    if me != 0:  # a directory a user made is not root's
        assert cgroup_problem(str(job), str(root), owner=0).endswith(f"is owned by uid {me}, not root")
    assert "does not exist" in cgroup_problem(str(root / "job_9"), str(root), owner=me)
    (root / "link").symlink_to(job)
    assert "symbolic link" in cgroup_problem(str(root / "link"), str(root), owner=me)
    (root / "file").write_text("")
    assert "not a directory" in cgroup_problem(str(root / "file"), str(root), owner=me)
    assert "no cgroup v2 mounted" in cgroup_problem(str(job), str(tmp_path), owner=me)


def test_offered_needs_cgroup_v2_and_slurms_scope(tree, tmp_path):
    root, _job = tree
    assert offered(str(root)) is None
    assert offered(str(tmp_path)).startswith(f"no cgroup v2 mounted at {tmp_path}")
    (root / "system.slice" / "slurmstepd.scope" / "job_42").rmdir()
    (root / "system.slice" / "slurmstepd.scope").rmdir()
    assert offered(str(root)) == (
        f"no Slurm cgroup/v2 scope {root}/system.slice/slurmstepd.scope (Slurm puts no job in a cgroup v2 here)"
    )


def test_make_job_cgroup_makes_it_as_slurm_does_or_takes_it(tree):
    root, job = tree
    me = os.getuid()
    assert make_job_cgroup(42, str(root), owner=me) == (str(job), False, None)
    umask = os.umask(0o077)  # a prolog's umask does not change the mode Slurm gives it
    try:
        path, made, problem = make_job_cgroup(43, str(root), owner=me)
    finally:
        os.umask(umask)
    assert (made, problem) == (True, None) and os.stat(path).st_mode & 0o777 == 0o755
    os.rmdir(path)
    os.symlink(str(job), path)
    assert make_job_cgroup(43, str(root), owner=me)[1:] == (False, f"the job's cgroup {path} is a symbolic link")
    scope = root / "system.slice" / "slurmstepd.scope"
    os.rename(scope, root / "system.slice" / "real")
    scope.symlink_to(root / "system.slice" / "real")
    assert make_job_cgroup(44, str(root), owner=me)[1:] == (False, f"Slurm's cgroup scope {scope} is a symbolic link")
    assert not (root / "system.slice" / "real" / "job_44").exists()


# ---- the prolog hook on a test node ---------------------------------------------------------


@pytest.fixture
def mps_node(tmp_path, monkeypatch):
    node = HookNode(tmp_path, "lab-mps01")
    root = tmp_path / "cgroup"
    (root / "system.slice" / "slurmstepd.scope" / "job_11").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory dmem\n")
    monkeypatch.setattr(mpsmem, "CGROUP_ROOT", str(root))
    FakeNvml(node.state).mount_cgroup2(root)
    monkeypatch.setattr(mpsmem, "CGROUP_OWNER", os.getuid())
    node.cgroup = str(root / "system.slice" / "slurmstepd.scope" / "job_11")
    yield node
    stop_daemons(node.state_dir)


def test_prolog_sets_the_share_on_the_job_cgroup_where_the_driver_offers_it(mps_node):
    FakeNvml(mps_node.state).set_driver("615.20.01")
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    assert JournalStore(mps_node.state_dir).read(11).mps is not None
    with mps_node.backend() as backend:
        assert backend.memory_limit(0, mps_node.cgroup) == (A30_MIB // 4, A30_MIB // 4)


def test_prolog_attempts_nothing_where_the_driver_has_no_cgroup_limits(mps_node, capsys):
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    state = json.loads(mps_node.state.read_text())
    assert state["driver_version"].startswith("580.") and all("memory_limits" not in g for g in state["gpus"])
    assert "memory limit" not in capsys.readouterr().err


def test_prolog_on_a_node_without_slurms_cgroup_scope_runs_the_job_and_says_why(mps_node, capsys):
    """Slurm puts no job in a cgroup v2 here (no cgroup/v2 plugin): nothing to set, nothing made, the job runs."""
    FakeNvml(mps_node.state).set_driver("615.20.01")
    scope = os.path.dirname(mps_node.cgroup)
    os.rmdir(mps_node.cgroup)
    os.rmdir(scope)
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    err = capsys.readouterr().err
    assert f"gpushare-prolog: job 11: GPU memory limit not set: no Slurm cgroup/v2 scope {scope}" in err
    assert not os.path.exists(scope) and all(
        "memory_limits" not in g for g in json.loads(mps_node.state.read_text())["gpus"]
    )
    assert "GPUSHARE_REFUSE" not in JournalStore(mps_node.state_dir).task_path(11).read_text()


def test_prolog_with_an_old_driver_makes_no_cgroup(mps_node):
    os.rmdir(mps_node.cgroup)
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    assert not os.path.exists(mps_node.cgroup)


def test_a_failed_prolog_removes_the_job_cgroup_it_made(mps_node, monkeypatch, capsys):
    from slurm_gpushare.errors import GpushareError
    from slurm_gpushare.node import prolog as node_prolog

    def broken(actions, store, mps):
        raise GpushareError("journal directory full")

    FakeNvml(mps_node.state).set_driver("615.20.01")
    os.rmdir(mps_node.cgroup)
    monkeypatch.setattr(node_prolog, "execute_prolog", broken)
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=_drain_ok, mps=mps_node.mps) == 1
    assert "journal directory full" in capsys.readouterr().err and not os.path.exists(mps_node.cgroup)


def _drain_ok(argv, **kw):
    from slurm_gpushare.proc import Result

    return Result(list(argv), 0, "", "")
