"""node.mpsmem: an MPS job's memory share set on its cgroup where the driver offers per-cgroup limits (r615+),
nothing attempted where it does not; the prolog hook on a test node, both ways."""

from __future__ import annotations

import json
import os

import pytest

from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import mpsmem
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.mpsmem import SetMemoryLimit, cgroup_problem, job_cgroup, plan_memory_limits
from tests.unit.hooks_support import HookNode, stop_daemons

A30_MIB = 24576


def no_scontrol(argv, **kw):
    raise AssertionError(f"no Slurm command expected: {argv}")


# ---- planning (pure) -------------------------------------------------------------------------


def test_the_share_of_each_mps_gpu_on_the_job_cgroup():
    actions, note = plan_memory_limits(7, (0, 2), 25, {0: 24576, 2: 81920}, True, "/cg/job_7", None)
    assert actions == [SetMemoryLimit(0, "/cg/job_7", 6144), SetMemoryLimit(2, "/cg/job_7", 20480)] and note is None


def test_nothing_where_the_driver_has_no_cgroup_limits():
    assert plan_memory_limits(7, (0,), 25, {0: 24576}, False, "/cg/job_7", None) == ([], None)
    assert plan_memory_limits(7, (0,), 25, {0: 24576}, False, "/cg/job_7", "anything") == ([], None)


def test_nothing_for_a_job_without_mps():
    assert plan_memory_limits(7, (), None, {}, True, "/cg/job_7", None) == ([], None)


def test_an_unusable_cgroup_is_a_note_not_a_limit():
    actions, note = plan_memory_limits(7, (0,), 25, {0: 24576}, True, "/cg/job_7", "the job's cgroup /cg/job_7 does not exist")
    assert actions == [] and note.startswith("job 7: GPU memory limit not set: the job's cgroup /cg/job_7 does not exist")
    assert note.endswith("held only by MPS's per-process limits")


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


def test_prolog_without_the_job_cgroup_runs_the_job_and_says_why(mps_node, capsys):
    FakeNvml(mps_node.state).set_driver("615.20.01")
    os.rmdir(mps_node.cgroup)
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    err = capsys.readouterr().err
    assert "gpushare-prolog: job 11: GPU memory limit not set: the job's cgroup" in err and "does not exist" in err
    assert all("memory_limits" not in g for g in json.loads(mps_node.state.read_text())["gpus"])


def test_a_failed_limit_fails_the_prolog_before_any_daemon_starts(mps_node, monkeypatch, capsys):
    """r615 but NVML refuses (here: not root): the node cannot give the job the limit it offers; nothing started."""
    FakeNvml(mps_node.state).set_driver("615.20.01")
    monkeypatch.setattr(FakeNvml, "__init__", _as_user(FakeNvml.__init__))
    assert prolog_hook.main(mps_node.env(11, "0", 25), runner=_drain_ok, mps=mps_node.mps) == 1
    assert "NVML_ERROR_NO_PERMISSION" in capsys.readouterr().err
    assert mps_node.journals() == [] and not list(mps_node.state_dir.glob("mps/*/pipe/control"))


def _as_user(init):
    def wrapped(self, state_path, euid=None):
        init(self, state_path, euid=1000)
    return wrapped


def _drain_ok(argv, **kw):
    from slurm_gpushare.proc import Result

    return Result(list(argv), 0, "", "")
