"""The task prolog: export lines from the journal only, per mode and per step; loud without one."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import taskprolog
from slurm_gpushare.node.journal import JournalStore
from tests.unit.hooks_support import HookNode, no_scontrol, stop_daemons


def task(node: HookNode, job_id: int, **env) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    base = {"SLURM_JOB_ID": str(job_id), "GPUSHARE_NODE_CONFIG": str(node.config)}
    rc = taskprolog.main({**base, **env}, out, err)
    return rc, out.getvalue(), err.getvalue()


def exported(text: str) -> dict[str, str]:
    assert all(line.startswith("export ") for line in text.splitlines()), text
    return dict(line[len("export ") :].split("=", 1) for line in text.splitlines())


@pytest.fixture
def mig(tmp_path):
    node = HookNode(tmp_path, "lab-mig01")
    assert prolog_hook.main(node.env(7, "1,4"), runner=no_scontrol) == 0
    with node.backend() as backend:
        node.uuids = [d.uuid for d in backend.mig_devices(0)]
    return node


def test_mig_job_gets_its_mig_uuids_in_slurms_order(mig):
    rc, out, _ = task(mig, 7, SLURM_JOB_GPUS="1,4", CUDA_VISIBLE_DEVICES="0,1")
    assert rc == 0
    assert exported(out) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": f"{mig.uuids[1]},{mig.uuids[4]}",
    }


def test_step_gets_only_its_devices(mig):
    rc, out, _ = task(mig, 7, SLURM_JOB_GPUS="1,4", SLURM_STEP_GPUS="4", CUDA_VISIBLE_DEVICES="0")
    assert rc == 0 and exported(out)["CUDA_VISIBLE_DEVICES"] == mig.uuids[4]


def test_step_index_not_in_the_journal_fails(mig):
    rc, out, err = task(mig, 7, SLURM_STEP_GPUS="5")
    assert rc == 1 and out == "" and "GRES indexes [5] are not in job 7's journal" in err


def test_exclusive_job_gets_only_the_device_order(tmp_path):
    node = HookNode(tmp_path, "lab-excl01")
    assert prolog_hook.main(node.env(8, "1"), runner=no_scontrol) == 0
    rc, out, _ = task(node, 8, SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES="0")
    assert rc == 0 and out == "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n"


def test_mps_job_gets_pipe_dir_limits_and_the_gpu(tmp_path):
    node = HookNode(tmp_path, "lab-mps01")
    try:
        assert prolog_hook.main(node.env(9, "0", 50), runner=no_scontrol, mps=node.mps) == 0
        rc, out, _ = task(node, 9, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50")  # Slurm gives mps jobs no CVD here
        env = exported(out)
        with node.backend() as backend:
            uuid = backend.gpu(0).uuid
        assert rc == 0 and env["CUDA_VISIBLE_DEVICES"] == uuid
        assert (
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288MB" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        )
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{node.state_dir}/mps/g0-u{os.getuid()}-p50/pipe"
    finally:
        stop_daemons(node.state_dir)


def test_gpu_task_without_journal_fails_a_plain_one_is_left_alone(tmp_path):
    node = HookNode(tmp_path, "lab-excl01")
    rc, out, err = task(node, 10, CUDA_VISIBLE_DEVICES="0")
    assert rc == 1 and out == "" and "job 10 holds GPUs but has no ready journal" in err and "prolog did not run" in err
    assert task(node, 10) == (0, "", "")


def test_journal_that_is_not_ready_has_no_task_file(mig):
    store = JournalStore(mig.state_dir)
    store.write(store.read(7).with_state("ending"))
    assert not store.task_path(7).exists()
    rc, _, err = task(mig, 7, SLURM_JOB_GPUS="1,4")
    assert rc == 1 and "job 7 holds GPUs but has no ready journal" in err


def test_foreign_or_hostile_task_file_is_refused(mig):
    path = JournalStore(mig.state_dir).task_path(7)
    text = path.read_text()
    path.write_text(text.replace("gpushare-task/1 7", "gpushare-task/1 8"))
    rc, _, err = task(mig, 7)
    assert rc == 1 and "is not the task file of job 7" in err
    path.write_text(text.replace("env CUDA_DEVICE_ORDER PCI_BUS_ID", "env CUDA_DEVICE_ORDER x;reboot"))
    rc, _, err = task(mig, 7)
    assert rc == 1 and "refusing to export CUDA_DEVICE_ORDER='x;reboot'" in err
    path.write_text(text + "rm -rf /\n")
    rc, _, err = task(mig, 7)
    assert rc == 1 and "unreadable line 'rm -rf /'" in err


def test_bad_job_id_is_refused(mig):
    err = io.StringIO()
    assert taskprolog.main({"SLURM_JOB_ID": "7/../8"}, io.StringIO(), err) == 1
    assert "SLURM_JOB_ID='7/../8' is not a job id" in err.getvalue()


def test_state_dir_comes_from_the_node_config_or_the_default(mig, tmp_path):
    assert taskprolog.state_dir({"GPUSHARE_NODE_CONFIG": str(mig.config)}) == str(mig.state_dir)
    assert taskprolog.state_dir({"GPUSHARE_NODE_CONFIG": str(tmp_path / "none.yaml")}) == "/var/lib/gpushare"


def test_task_prolog_imports_almost_nothing():
    """It runs on every task start: no dataclasses, JSON, YAML, pydantic, NVML or policy code."""
    code = "import sys; import slurm_gpushare.hooks.taskprolog; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    heavy = {"dataclasses", "yaml", "pydantic", "click", "ctypes", "hostlist", "jinja2", "inspect", "json"}
    assert not loaded & heavy, loaded & heavy
    ours = {m for m in loaded if m.startswith("slurm_gpushare")}
    assert ours == {
        "slurm_gpushare",
        "slurm_gpushare.hooks",
        "slurm_gpushare.hooks.taskprolog",
        "slurm_gpushare.node",
        "slurm_gpushare.node.paths",
        "slurm_gpushare.node.taskprolog",
    }
