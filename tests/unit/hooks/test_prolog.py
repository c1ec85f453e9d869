"""Prolog planning (job + node layout + live state -> journal and actions) in every mode, and its
execution on the fake NVML with the fake MPS control daemon (real processes)."""

from __future__ import annotations

import os
import stat

import pytest

from slurm_gpushare.gpu.backend import GpuProcess, MigDevice
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.gresindex import GresRecord
from slurm_gpushare.node.jobenv import JobEnv
from slurm_gpushare.node.journal import Journal, JournalStore, MpsDaemon
from slurm_gpushare.node.mps import MpsControl, MpsError
from slurm_gpushare.node.observed import ObservedGpu, ObservedState, WriteJournal
from slurm_gpushare.node.prolog import NodeLayout, PrologRefused, StartMps, StopMps, execute_prolog, plan_prolog
from slurm_gpushare.policy.share import Mode, Share
from slurm_gpushare.proc import Result
from slurm_gpushare.records import replace
from tests.unit.hooks_support import HookNode, no_scontrol

A100_MIG = [MigDevice(f"MIG-{gi:04d}", gi, 0, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864) for gi in range(7, 14)]


def cap(gi: int, ci: int | None = None) -> int:
    """The driver's closed form (migminors): GPU minor 0."""
    base = 3 + 9 * gi
    return base if ci is None else base + 1 + ci


def shares(modes: dict) -> dict:
    """NodeLayout's shares (policy.share.Share) from modes."""
    return {i: Share(Mode(m)) for i, m in modes.items()}


def mig_node(modes=None, records=None) -> NodeLayout:
    records = records or [
        GresRecord(
            i,
            "a100_40g_1g.5gb",
            ("/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{cap(gi)}", f"/dev/nvidia-caps/nvidia-cap{cap(gi, 0)}"),
            f"g:{i}",
        )
        for i, gi in enumerate(range(7, 14))
    ]
    minors = {cap(gi): (0, gi, None) for gi in range(15)} | {cap(gi, 0): (0, gi, 0) for gi in range(15)}
    return NodeLayout("n1", shares(modes or {0: "mig"}), tuple(records), minors, "/var/lib/gpushare", "/var/log/slurm")


def whole_node(mode: str, count: int = 1) -> NodeLayout:
    records = [GresRecord(i, "a30", (f"/dev/nvidia{i}",), f"g:{i}") for i in range(count)]
    return NodeLayout(
        "n1", shares({i: mode for i in range(count)}), tuple(records), {}, "/var/lib/gpushare", "/var/log/slurm"
    )


def live(*gpus: ObservedGpu, journals=None, alive=()) -> ObservedState:
    return ObservedState({g.index: g for g in gpus}, journals or {}, frozenset(alive))


MIG_GPU = ObservedGpu(0, "GPU-a", 0, 40960, True, tuple(A100_MIG))
A30 = ObservedGpu(0, "GPU-m", 0, 24576, False)


def job(gpus=(), pct=None, job_id=5, uid=2001) -> JobEnv:
    return JobEnv(job_id, uid, 2000, "n1", tuple(gpus), pct)


# ---- MIG ----------------------------------------------------------------------------------


def test_mig_index_maps_to_the_records_instance_uuid():
    journal, actions = plan_prolog(job([2]), mig_node(), live(MIG_GPU))
    (dev,) = journal.devices
    assert (dev.mode, dev.gi, dev.ci, dev.mig_uuid, dev.visible) == ("mig", 9, 0, "MIG-0009", "MIG-0009")
    assert journal.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and journal.mps is None
    assert [type(a) for a in actions] == [WriteJournal, WriteJournal]
    assert actions[0].journal.state == "preparing" and actions[-1].journal.state == "ready"


def test_mig_records_are_taken_in_slurm_order_not_minor_order():
    reversed_records = [GresRecord(i, "t", r.files, r.source) for i, r in enumerate(reversed(mig_node().records))]
    journal, _ = plan_prolog(job([0, 2]), mig_node(records=reversed_records), live(MIG_GPU))
    assert [d.mig_uuid for d in journal.devices] == ["MIG-0013", "MIG-0011"]


def test_busy_mig_instance_is_refused():
    busy = ObservedGpu(
        0, "GPU-a", 0, 40960, True, tuple(A100_MIG), (GpuProcess(4242, 10, 9, 0), GpuProcess(99, 1, 8, 0))
    )
    with pytest.raises(
        PrologRefused, match=r"job 5 on n1: MIG device MIG-0009 .* busy before the job starts: processes 4242$"
    ):
        plan_prolog(job([2]), mig_node(), live(busy))
    plan_prolog(job([0]), mig_node(), live(busy))  # another instance's process is no concern of GI 7


def test_missing_instance_is_layout_drift():
    gone = ObservedGpu(0, "GPU-a", 0, 40960, True, tuple(d for d in A100_MIG if d.gi_id != 9))
    with pytest.raises(
        PrologRefused, match="GPU instance 9 compute instance 0, which does not exist: the MIG layout drifted"
    ):
        plan_prolog(job([2]), mig_node(), live(gone))


def test_gres_conf_that_disagrees_with_the_policy_is_refused():
    with pytest.raises(PrologRefused, match="declares it as MIG instances but the policy shares it as exclusive"):
        plan_prolog(job([0]), mig_node(modes={0: "exclusive"}), live(MIG_GPU))
    with pytest.raises(PrologRefused, match="declares it whole but the policy shares it as mig"):
        plan_prolog(job([0]), whole_node("mig"), live(A30))


def test_index_beyond_gres_conf_and_bad_files_are_refused():
    with pytest.raises(PrologRefused, match="GRES index 9: gres.conf declares only 7 gpu record"):
        plan_prolog(job([9]), mig_node(), live(MIG_GPU))
    bad = [
        GresRecord(0, "t", ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap76"), "g:0")
    ]
    with pytest.raises(PrologRefused, match="are not the GI and CI access capabilities of one GPU instance"):
        plan_prolog(job([0]), mig_node(records=bad), live(MIG_GPU))
    odd = [GresRecord(0, "t", ("/dev/tty0",), "g:0")]
    with pytest.raises(PrologRefused, match=r"files /dev/tty0 are not /dev/nvidiaN"):
        plan_prolog(job([0]), mig_node(records=odd), live(MIG_GPU))
    missing = [GresRecord(0, "t", ("/dev/nvidia3",), "g:0")]
    with pytest.raises(PrologRefused, match=r"/dev/nvidia3 is no GPU NVML lists \(minors 0\)"):
        plan_prolog(job([0]), mig_node(modes={0: "exclusive"}, records=missing), live(A30))


def test_every_reason_is_reported_at_once():
    with pytest.raises(PrologRefused) as info:
        plan_prolog(JobEnv(5, 1, 1, "other", (9, 2)), mig_node(), live(ObservedGpu(0, "GPU-a", 0, 1, True)))
    assert len(info.value.reasons) == 3 and "SLURMD_NODENAME is other" in str(info.value)


# ---- exclusive, shard ----------------------------------------------------------------------


def test_exclusive_gpu_keeps_slurms_index():
    journal, actions = plan_prolog(job([0]), whole_node("exclusive"), live(A30))
    assert journal.devices[0].mode == "exclusive" and journal.devices[0].visible is None
    assert journal.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and len(actions) == 2


def test_busy_exclusive_gpu_is_refused():
    busy = ObservedGpu(0, "GPU-m", 0, 24576, False, (), (GpuProcess(77, 100, None, None),))
    with pytest.raises(PrologRefused, match=r"GPU 0 \(GPU-m\) is busy before the job starts: processes 77"):
        plan_prolog(job([0]), whole_node("exclusive"), live(busy))


def test_shard_gpu_is_shared_so_processes_are_fine():
    busy = ObservedGpu(0, "GPU-m", 0, 24576, False, (), (GpuProcess(77, 100, None, None),))
    journal, _ = plan_prolog(job([0]), whole_node("shard"), live(busy))
    assert journal.devices[0].mode == "shard" and journal.devices[0].visible is None


def test_whole_gpu_of_an_mps_gpu_must_not_be_held_by_mps_jobs():
    holder = Journal(
        3, 2002, 2000, "n1", "ready", plan_prolog(job([0], 50, job_id=3), whole_node("mps"), live(A30))[0].devices
    )
    with pytest.raises(PrologRefused, match=r"allocated whole but jobs 3 still hold it"):
        plan_prolog(job([0]), whole_node("mps"), live(A30, journals={3: holder}))
    journal, _ = plan_prolog(job([0]), whole_node("mps"), live(A30))
    assert journal.devices[0].mode == "mps-whole" and journal.mps is None


def test_job_without_gpus_gets_an_empty_journal():
    journal, actions = plan_prolog(job(), whole_node("exclusive"), live(A30))
    assert journal.devices == () and journal.env == {} and len(actions) == 2


# ---- MPS ----------------------------------------------------------------------------------


def test_mps_job_gets_a_daemon_with_its_limits():
    journal, actions = plan_prolog(job([0], 25), whole_node("mps"), live(A30))
    daemon = journal.mps
    assert daemon.key == "g0-u2001-p25" and daemon.gpu_uuids == ("GPU-m",) and daemon.mem_limit_mib == (6144,)
    assert daemon.pipe_dir == "/var/lib/gpushare/mps/g0-u2001-p25/pipe"
    assert daemon.log_dir == "/var/log/slurm/gpushare-mps/g0-u2001-p25"
    assert journal.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144MB",
    }
    assert journal.devices[0].visible == "GPU-m"
    assert [type(a) for a in actions] == [WriteJournal, StartMps, WriteJournal] and actions[1].daemon == daemon


def test_client_mem_limit_caps_the_pinned_memory_of_every_client():
    """policy client_mem_limit_mib: the daemon's default pinned memory limit and the job's variable are the smaller
    of the cap and the job's share of the GPU; a cap above the share changes nothing."""
    capped = NodeLayout(
        "n1",
        {0: Share(Mode.MPS, units=100, compute_mode="default", client_mem_limit_mib=4096)},
        whole_node("mps").records,
        {},
        "/var/lib/gpushare",
        "/var/log/slurm",
    )
    journal, _ = plan_prolog(job([0], 25), capped, live(A30))
    assert journal.mps.mem_limit_mib == (4096,) and journal.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096MB"
    loose = NodeLayout(
        "n1",
        {0: Share(Mode.MPS, units=100, compute_mode="default", client_mem_limit_mib=20000)},
        whole_node("mps").records,
        {},
        "/var/lib/gpushare",
        "/var/log/slurm",
    )
    journal, _ = plan_prolog(job([0], 25), loose, live(A30))
    assert journal.mps.mem_limit_mib == (6144,)
    shared = replace(A30, compute_mode="EXCLUSIVE_PROCESS")  # one daemon at 100 %: the cap binds the job's own limit
    journal, _ = plan_prolog(job([0], 50), capped, live(shared))
    assert journal.mps.mem_limit_mib == (4096,) and journal.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096MB"


def test_mps_daemon_that_answers_is_reused():
    _journal, actions = plan_prolog(job([0], 25), whole_node("mps"), live(A30, alive={"g0-u2001-p25"}))
    assert not any(isinstance(a, StartMps) for a in actions)


def test_mps_keys_separate_users_and_percentages():
    keys = {
        plan_prolog(job([0], pct, uid=uid), whole_node("mps"), live(A30))[0].mps.key
        for uid, pct in ((2001, 25), (2002, 25), (2001, 50))
    }
    assert keys == {"g0-u2001-p25", "g0-u2002-p25", "g0-u2001-p50"}


def test_percentage_without_an_mps_gpu_is_refused():
    with pytest.raises(
        PrologRefused, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 but none of GRES indexes 0 is an MPS GPU"
    ):
        plan_prolog(job([0], 25), whole_node("exclusive"), live(A30))


def test_socket_path_too_long_is_refused():
    node = NodeLayout("n1", shares({0: "mps"}), whole_node("mps").records, {}, "/" + "x" * 90, "/log")
    with pytest.raises(PrologRefused, match="unix socket allows 100: shorten cluster.paths.state_dir"):
        plan_prolog(job([0], 25), node, live(A30))


def test_rerun_with_another_daemon_stops_the_old_one_only_if_unshared():
    old = plan_prolog(job([0], 50), whole_node("mps"), live(A30))[0]
    _journal, actions = plan_prolog(job([0], 25), whole_node("mps"), live(A30, journals={5: old}))
    assert [a.daemon.key for a in actions if isinstance(a, StopMps)] == ["g0-u2001-p50"]
    other = Journal(6, 2001, 2000, "n1", "ready", old.devices, old.mps)
    _journal, actions = plan_prolog(job([0], 25), whole_node("mps"), live(A30, journals={5: old, 6: other}))
    assert not any(isinstance(a, StopMps) for a in actions)


# ---- execution: the hook on a test node ----------------------------------------------------


def test_hook_starts_the_daemon_with_a_private_pipe_dir(mps_node):
    env = mps_node.env(11, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    journal = JournalStore(mps_node.state_dir).read(11)
    pipe = journal.mps.pipe_dir
    info = os.stat(pipe)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert mps_node.mps.alive(journal.mps)
    state = (mps_node.tmp / "state" / "mps" / journal.mps.key / "pipe" / ".fake-state.json").read_text()
    assert '"default_active_thread_percentage": 25.0' in state and '"0": "6144M"' in state
    assert f'"cuda_visible_devices": "{journal.mps.gpu_uuids[0]}"' in state
    log = (mps_node.tmp / "log" / "gpushare-mps" / journal.mps.key / "control.log").read_text()
    assert "Cmd:set_default_active_thread_percentage 25" in log and f"for user {os.getuid()}" in log


def test_hook_is_idempotent(mps_node):
    env = mps_node.env(11, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    first = JournalStore(mps_node.state_dir).read(11)
    pid = (mps_node.state_dir / "mps" / first.mps.key / "pipe" / ".fake-state.json").read_text()
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    assert JournalStore(mps_node.state_dir).read(11) == first
    assert (mps_node.state_dir / "mps" / first.mps.key / "pipe" / ".fake-state.json").read_text() == pid  # same daemon


def test_failed_daemon_start_rolls_back_and_drains(mps_node, capsys):
    calls = []

    def runner(argv, **kw):
        calls.append(list(argv))
        return Result(tuple(argv), 0, "", "")

    class Broken(MpsControl):
        def start(self, daemon):
            raise MpsError("MPS daemon would not start")

    broken = Broken(mps_node.mps.runner, mps_node.mps.command)
    assert prolog_hook.main(mps_node.env(12, "0", 25), runner=runner, mps=broken) == 1
    line = capsys.readouterr().err.strip()
    assert line == "gpushare-prolog: MPS daemon would not start"
    assert calls == [["scontrol", "update", "nodename=lab-mps01", "state=drain", f"reason={line}"]]
    assert mps_node.journals() == []  # rolled back


def test_hook_refuses_hostile_environment(mps_node, capsys):
    env = mps_node.env(13, "0;rm -rf /", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 1
    assert "SLURM_JOB_GPUS='0;rm -rf /' is not a comma-separated list of GRES indexes" in capsys.readouterr().err
    assert mps_node.journals() == []


def test_hook_on_mig_node_records_uuids(tmp_path):
    node = HookNode(tmp_path, "lab-mig01")
    assert prolog_hook.main(node.env(21, "0,6"), runner=no_scontrol) == 0
    journal = JournalStore(node.state_dir).read(21)
    with node.backend() as backend:
        uuids = [d.uuid for d in backend.mig_devices(0)]
    assert [d.mig_uuid for d in journal.devices] == [uuids[0], uuids[6]]
    assert journal.state == "ready" and journal.node == "lab-mig01"


def test_execute_without_actions_is_a_type_error():
    with pytest.raises(TypeError):
        execute_prolog(["nonsense"], JournalStore("/nonexistent"), None)


def test_mps_daemon_dataclass_round_trips():
    journal = plan_prolog(job([0], 25), whole_node("mps"), live(A30))[0]
    assert Journal.from_json(journal.to_json()) == journal
    assert isinstance(journal.mps, MpsDaemon)


def test_hook_process_runs_without_the_cyclic_collector():
    """main() without an environment is the process slurmd started: no gc passes, the run frozen at exit
    (hooks/_common._no_gc); with one (a caller's process, these tests) the collector is left alone."""
    import subprocess
    import sys

    code = (
        "import atexit, gc; from slurm_gpushare.hooks._common import guarded; seen = []; "
        "guarded('t', lambda env: seen.append(gc.isenabled()), environ={'X': '1'}); "
        "guarded('t', lambda env: seen.append(gc.isenabled())); "
        "before = gc.get_freeze_count(); atexit._run_exitfuncs(); print(seen, before, gc.get_freeze_count() > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[True,", "False]", "0", "True"]
