"""What the hooks read: Slurm's environment, gres.conf order, the node config and spec cache, journals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import slurm_gpushare
from slurm_gpushare.node.gresindex import GresConfReadError, expand, gpu_records
from slurm_gpushare.node.jobenv import HookInputError, job_from_env, job_id_from_env
from slurm_gpushare.node.journal import Device, Journal, JournalError, JournalStore
from slurm_gpushare.node.nodeconfig import (
    GpuSpec,
    NodeConfigError,
    NodeSpec,
    config_path,
    node_spec,
    parse_config,
    read_config,
)
from slurm_gpushare.policy.share import Mode, Share
from tests.unit.hooks_support import HookNode

BASE = {"SLURM_JOB_ID": "17", "SLURM_JOB_UID": "2001", "SLURM_JOB_GID": "2000", "SLURMD_NODENAME": "lab-mig01"}


# ---- Slurm's environment ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "start"), [(None, None), ("", None), ("1700000000", 1700000000), ("0", 0), ("17e3", None), ("-5", None)]
)
def test_the_runs_start_time_is_read_leniently(value, start):
    """SLURM_JOB_START_TIME only tells two runs of one job apart: a value that is no number is no start time,
    never a failed hook."""
    env = dict(BASE) if value is None else {**BASE, "SLURM_JOB_START_TIME": value}
    assert job_from_env(env).start_time == start


def test_job_from_prolog_env_as_observed():
    job = job_from_env(
        {**BASE, "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_COMMENT": "$(reboot)"}
    )
    assert (job.job_id, job.uid, job.gid, job.node, job.gpu_indexes, job.mps_percentage) == (
        17,
        2001,
        2000,
        "lab-mig01",
        (0, 1),
        None,
    )
    mps = job_from_env({**BASE, "SLURM_JOB_GPUS": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
    assert mps.mps_percentage == 25
    assert job_from_env({**BASE, "CUDA_VISIBLE_DEVICES": "3"}).gpu_indexes == (3,)
    assert job_from_env(BASE).gpu_indexes == ()


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("SLURM_JOB_ID", "0", "SLURM_JOB_ID='0' is not a decimal id"),
        ("SLURM_JOB_ID", "12 ; id", "is not a decimal id"),
        ("SLURM_JOB_UID", "-1", "SLURM_JOB_UID='-1' is not a decimal id"),
        ("SLURM_JOB_UID", "99999999999", "is not a decimal id"),
        ("SLURM_JOB_UID", "4294967295", "out of range"),
        ("SLURMD_NODENAME", "../etc", "is not a node name"),
        ("SLURM_JOB_GPUS", "0,,1", "is not a comma-separated list of GRES indexes"),
        ("SLURM_JOB_GPUS", "MIG-abc", "is not a comma-separated list"),
        ("SLURM_JOB_GPUS", "1,1", "lists an index twice"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "0", "is not a whole percentage 1-100"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "101", "is not a whole percentage 1-100"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25.5", "is not a whole percentage 1-100"),
    ],
)
def test_bad_values_are_named(name, value, message):
    with pytest.raises(HookInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        job_from_env({**BASE, name: value})


def test_missing_variables_say_where_this_runs():
    with pytest.raises(HookInputError, match="SLURM_JOB_ID is not set: this runs as a Slurm Prolog/Epilog"):
        job_id_from_env({})
    with pytest.raises(HookInputError, match="SLURMD_NODENAME is not set"):
        job_from_env({"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "1"})


# ---- gres.conf order ----------------------------------------------------------------------


def test_records_follow_line_order_includes_and_ranges(tmp_path):
    (tmp_path / "gres.d").mkdir()
    (tmp_path / "gres.d" / "mig.conf").write_text(
        "NodeName=n1 Name=gpu Type=x "
        "MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap300,/dev/nvidia-caps/nvidia-cap301\n"
    )
    (tmp_path / "gres.conf").write_text(
        "AutoDetect=off\n"
        "NodeName=n1 Name=gpu Type=b File=/dev/nvidia1\n"
        "NodeName=other Name=gpu Type=b File=/dev/nvidia9\n"
        "NodeName=n[1-2] Name=gpu Type=a File=/dev/nvidia[3-4]  # comment\n"
        "NodeName=n1 Name=mps Count=100 File=/dev/nvidia1\n"
        "Include gres.d/mig.conf\n"
        "NodeName=n1 Name=gpu Type=c \\\n  File=/dev/nvidia0\n"
    )
    records = gpu_records(tmp_path / "gres.conf", "n1")
    assert [r.files for r in records] == [
        ("/dev/nvidia1",),
        ("/dev/nvidia3",),
        ("/dev/nvidia4",),
        ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap300", "/dev/nvidia-caps/nvidia-cap301"),
        ("/dev/nvidia0",),
    ]
    assert [r.index for r in records] == [0, 1, 2, 3, 4] and records[4].source.endswith("gres.conf:7")


def test_missing_include_is_an_error(tmp_path):
    (tmp_path / "gres.conf").write_text("Include /nonexistent/x.conf\n")
    with pytest.raises(GresConfReadError, match="cannot read /nonexistent/x.conf"):
        gpu_records(tmp_path / "gres.conf", "n1")


def test_expand():
    assert expand("gpu-[01-03,7]") == ["gpu-01", "gpu-02", "gpu-03", "gpu-7"]
    assert expand("a,b[0-1]") == ["a", "b0", "b1"]
    with pytest.raises(GresConfReadError):
        expand("x[a-b]")


# ---- node config and spec cache ----------------------------------------------------------


def test_config_is_strict():
    assert parse_config("# c\npolicy: /p.yaml\nfake_nvml: '/f.json'\n", "n") == {
        "policy": "/p.yaml",
        "fake_nvml": "/f.json",
    }
    for text, message in [
        ("polcy: /p\n", "KEY one of policy, fake_nvml, spec_cache"),
        ("policy: p.yaml\n", "not an absolute path"),
        ("policy: /a\npolicy: /b\n", "given twice"),
        ("policy: /a/../etc/shadow\n", "not an absolute path"),
    ]:
        with pytest.raises(NodeConfigError, match=message):
            parse_config(text, "node.yaml")


def test_missing_config_means_real_nvml_and_default_policy(tmp_path):
    config = read_config(tmp_path / "node.yaml")
    assert config.fake_nvml is None and str(config.policy) == "/etc/gpushare/policy.yaml"


def test_config_writable_by_others_is_refused(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("policy: /p.yaml\n")
    os.chmod(path, 0o666)
    with pytest.raises(NodeConfigError, match="writable by no one else"):
        read_config(path)
    assert read_config(path, root_hook=False).policy.name == "p.yaml"


def test_config_path_override_must_be_absolute():
    assert str(config_path({})) == "/etc/gpushare/node.yaml"
    assert str(config_path({"GPUSHARE_NODE_CONFIG": "/t/n.yaml"})) == "/t/n.yaml"
    with pytest.raises(NodeConfigError):
        config_path({"GPUSHARE_NODE_CONFIG": "n.yaml"})


def test_spec_cache_follows_the_policy_file(tmp_path):
    node = HookNode(tmp_path, "lab-mig01")
    config = read_config(node.config)
    spec = node_spec(config, "lab-mig01")
    assert spec.gpus == (GpuSpec(0, "A100-SXM4-40GB", Share(Mode.MIG, ("1g.5gb",) * 7)),)
    assert spec.state_dir == str(node.state_dir) and config.spec_cache.exists()
    cached = json.loads(config.spec_cache.read_text())
    assert node_spec(config, "lab-mig01") == spec and NodeSpec.from_json(cached) == spec
    node.policy.write_text(node.policy.read_text().replace("units: 100", "units: 50"))
    assert node_spec(config, "lab-mig01").policy_sha256 != cached["policy_sha256"]
    with pytest.raises(NodeConfigError, match="node 'nope' is in no node group"):
        node_spec(config, "nope")


# ---- journals -----------------------------------------------------------------------------


def test_journal_store_round_trip_and_atomic_files(tmp_path):
    store = JournalStore(tmp_path)
    journal = Journal(
        5, 1, 1, "n", "ready", (Device(0, 0, "GPU-a", "exclusive"),), None, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    store.write(journal)
    assert store.read(5) == journal and store.job_ids() == [5]
    assert oct(os.stat(store.path(5)).st_mode & 0o777) == "0o600"  # root's only (issue 21 part 5)
    (store.dir / ".5.json.tmp123").write_text("{")  # what a crash between write and rename leaves
    (store.dir / "notes.txt").write_text("x")
    assert store.job_ids() == [5] and [p.name for p in store.stray_temporaries()] == [".5.json.tmp123"]
    assert store.remove(5) and not store.remove(5) and store.read(5) is None


def test_unreadable_journal_is_named(tmp_path):
    store = JournalStore(tmp_path)
    store.dir.mkdir(parents=True)
    store.path(3).write_text("{not json")
    with pytest.raises(JournalError, match=r"3.json: unreadable journal of job 3 \(not JSON"):
        store.read(3)
    store.path(3).write_text(json.dumps({"format": "other"}))
    with pytest.raises(JournalError, match="unreadable journal"):
        store.read(3)


def test_task_file_follows_the_journal_state(tmp_path):
    store = JournalStore(tmp_path)
    dev = Device(2, 0, "GPU-a", "mig", "MIG-b", 9, 0, "MIG-b")
    ready = Journal(5, 1, 1, "n", "ready", (dev,), None, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    store.write(ready.with_state("preparing"))
    assert not store.task_path(5).exists()
    store.write(ready)
    assert store.task_path(5).read_text() == "gpushare-task/1 5\nenv CUDA_DEVICE_ORDER PCI_BUS_ID\ndev 2 GPU-a MIG-b\n"
    store.write(ready.with_state("ending"))
    assert not store.task_path(5).exists()
    store.write(ready)
    store.path(5).unlink()  # a crash between removing the two: the task file is a stray
    assert [p.name for p in store.stray_temporaries()] == ["5.task"]
    with pytest.raises(JournalError, match="empty or blank field"):
        store.write(Journal(6, 1, 1, "n", "ready", (), None, {"X": "a b"}))


def test_a_spec_cache_of_another_shape_is_rebuilt(tmp_path):
    node = HookNode(tmp_path, "lab-mig01")
    config = read_config(node.config)
    spec = node_spec(config, "lab-mig01")
    stale = {k: v for k, v in spec.to_json().items() if k != "gres_include"}  # written by an older gpushare
    config.spec_cache.write_text(json.dumps(stale))
    assert NodeSpec.from_json(stale) is None
    assert node_spec(config, "lab-mig01") == spec
    assert NodeSpec.from_json({**spec.to_json(), "gpus": [{"index": 0}]}) is None


def test_slurm_environment_is_read_in_one_place():
    from slurm_gpushare.node.jobenv import HookInputError, node_name, node_name_or_none, slurm_conf

    assert node_name({"SLURMD_NODENAME": "gpu-01"}) == "gpu-01"
    with pytest.raises(HookInputError, match="SLURMD_NODENAME is not set"):
        node_name({})
    with pytest.raises(HookInputError, match="is not a node name"):
        node_name({"SLURMD_NODENAME": "a;rm -rf"})
    assert node_name_or_none({"SLURMD_NODENAME": "../x"}) is None
    assert slurm_conf({"SLURM_CONF": "/etc/slurm/slurm.conf"}) == "/etc/slurm/slurm.conf"
    assert slurm_conf({"SLURM_CONF": "/etc/slurm conf"}) is None
    package = Path(slurm_gpushare.__file__).parent
    readers = [p.name for p in package.rglob("*.py") if '"SLURMD_NODENAME"' in p.read_text(encoding="utf-8")]
    assert readers == ["jobenv.py"]
