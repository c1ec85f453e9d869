"""Epilog planning (journal + live state -> actions) and execution: exactly the prolog's work undone,
leftovers killed, strangers reported, the MPS daemon stopped with its last job, a second run a no-op."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpushare.gpu.backend import GpuProcess
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.epilog import EpilogRefused, KillProcess, QuitMps, RemoveJournal, plan_epilog, process_jobs
from slurm_gpushare.node.journal import Device, Journal, JournalStore, MpsDaemon
from slurm_gpushare.node.mps import MpsControl, _running
from slurm_gpushare.node.observed import ObservedGpu, ObservedState, WriteJournal
from slurm_gpushare.proc import Result
from tests.unit.hooks_support import HookNode, no_scontrol

DAEMON = MpsDaemon("g0-u5-p25", (0,), ("GPU-m",), 5, 5, 25, (6144,), "/s/mps/g0-u5-p25/pipe", "/l/g0-u5-p25")
MIG_DEV = Device(2, 0, "GPU-a", "mig", "MIG-9", 9, 0, "MIG-9")


def journal(job_id=5, devices=(MIG_DEV,), mps=None) -> Journal:
    return Journal(job_id, 5, 5, "n1", "ready", tuple(devices), mps, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})


def state(procs=(), owners=None, journals=None, mig=True) -> ObservedState:
    gpu = ObservedGpu(0, "GPU-a", 0, 40960, mig, (), tuple(procs))
    return ObservedState({0: gpu}, journals or {}, frozenset(), owners or {})


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_no_journal_nothing_to_do():
    assert plan_epilog(None, state()) == ([], [])


def test_clean_mig_job_marks_then_removes():
    actions, problems = plan_epilog(journal(), state())
    assert kinds(actions) == ["WriteJournal", "RemoveJournal"] and problems == []
    assert actions[0].journal.state == "ending"


def test_the_jobs_leftover_on_its_mig_device_is_killed_a_strangers_is_reported():
    procs = [GpuProcess(10, 1, 9, 0), GpuProcess(11, 1, 9, 0), GpuProcess(12, 1, 8, 0)]
    actions, problems = plan_epilog(journal(), state(procs, {10: 5, 11: 7, 12: 7}))
    assert [a.pid for a in actions if isinstance(a, KillProcess)] == [10]
    assert problems == ["MIG device MIG-9 on GPU 0 (GPU-a) busy after the job: process 11 (of job 7)"]


def test_unknown_process_on_an_exclusive_gpu_is_a_problem():
    dev = Device(0, 0, "GPU-a", "exclusive")
    _actions, problems = plan_epilog(
        journal(devices=[dev]), state([GpuProcess(3, 1, None, None)], {3: None}, mig=False)
    )
    assert problems == ["GPU 0 (GPU-a) busy after the job: process 3 (not on this node)"]


def test_on_shared_gpus_only_the_jobs_own_processes_matter():
    dev = Device(0, 0, "GPU-a", "shard")
    actions, problems = plan_epilog(
        journal(devices=[dev]),
        state([GpuProcess(3, 1, None, None), GpuProcess(4, 1, None, None)], {3: 5, 4: 0}, mig=False),
    )
    assert [a.pid for a in actions if isinstance(a, KillProcess)] == [3] and problems == []


def test_mps_daemon_stops_with_its_last_job_only():
    dev = Device(0, 0, "GPU-m", "mps", visible="GPU-m")
    mine, other = journal(5, [dev], DAEMON), journal(6, [dev], DAEMON)
    actions, _ = plan_epilog(mine, state(journals={5: mine, 6: other}, mig=False))
    assert not any(isinstance(a, QuitMps) for a in actions)
    actions, _ = plan_epilog(mine, state(journals={5: mine}, mig=False))
    assert kinds(actions) == ["WriteJournal", "QuitMps", "RemoveJournal"] and actions[1].daemon == DAEMON


def test_gpu_gone_from_nvml_is_a_problem():
    actions, problems = plan_epilog(journal(devices=[Device(0, 3, "GPU-x", "exclusive")]), state())
    assert problems == ["GPU 3 (GPU-x) is no longer listed by NVML"] and isinstance(actions[-1], RemoveJournal)


def test_process_jobs_reads_slurm_cgroup_paths(tmp_path):
    for pid, text in {
        10: "12:devices:/slurm_n1/uid_5/job_77/step_batch\n",
        11: "0::/system.slice/sshd.service\n",
        12: "0::/system.slice/slurmstepd.scope/job_8/step_0/user/task_0\n",
    }.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert process_jobs([10, 11, 12, 13], str(tmp_path)) == {10: 77, 11: 0, 12: 8, 13: None}


# ---- execution on a test node ------------------------------------------------------------


def test_epilog_undoes_the_prolog_and_a_second_run_is_a_no_op(mps_node):
    env = mps_node.env(31, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(31).mps
    assert epilog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    assert not mps_node.mps.alive(daemon) and mps_node.journals() == []
    assert sorted(p.name for p in (mps_node.state_dir / "jobs").iterdir()) == [".lock"]  # no task file either
    # the key dir was set aside and removed once the locks were released; .aside stays, empty
    assert [p.name for p in (mps_node.state_dir / "mps").iterdir()] == [".aside"]
    assert list((mps_node.state_dir / "mps" / ".aside").iterdir()) == []
    assert epilog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0


def test_two_jobs_share_the_daemon_until_the_last_ends(mps_node):
    a, b = mps_node.env(41, "0", 25), mps_node.env(42, "0", 25)
    for env in (a, b):
        assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(41).mps
    assert JournalStore(mps_node.state_dir).read(42).mps == daemon
    assert epilog_hook.main(a, runner=no_scontrol, mps=mps_node.mps) == 0
    assert mps_node.mps.alive(daemon) and mps_node.journals() == ["42.json"]
    assert epilog_hook.main(b, runner=no_scontrol, mps=mps_node.mps) == 0
    assert not mps_node.mps.alive(daemon) and mps_node.journals() == []


def test_daemon_that_will_not_quit_is_killed_by_its_recorded_pid(mps_node):
    """A daemon that ignores ``quit`` is SIGKILLed by the pid recorded at its start (a pidfd, identity checked),
    with its servers: the epilog succeeds and nothing is left (issue 21 part 1)."""
    import json

    env = mps_node.env(51, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(51).mps
    state = json.loads((Path(daemon.pipe_dir) / ".fake-state.json").read_text())

    class Stubborn(MpsControl):
        def send(self, daemon, *lines, check=True):
            if lines == ("quit",):
                return Result(("quit",), 0, "", "")  # swallowed: the daemon stays up
            return super().send(daemon, *lines, check=check)

    stubborn = Stubborn(mps_node.mps.runner, mps_node.mps.command, quit_wait=0.5)
    assert epilog_hook.main(env, runner=no_scontrol, mps=stubborn) == 0
    assert mps_node.journals() == [] and not Path(daemon.pipe_dir).exists()
    for pid in [state["pid"], *map(int, state["servers"])]:
        assert not _running(pid)


def test_leftover_process_is_killed_and_gone(tmp_path, monkeypatch):
    node = HookNode(tmp_path, "lab-mig01")
    env = node.env(61, "1")
    assert prolog_hook.main(env, runner=no_scontrol) == 0
    dev = JournalStore(node.state_dir).read(61).devices[0]
    node.fake.add_process(0, 4242, gi=dev.gi, ci=dev.ci)
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text("0::/slurmstepd.scope/job_61/step_batch\n")
    killed = []

    def kill(pid):
        killed.append(pid)
        node.fake.remove_process(pid)

    from slurm_gpushare.node import epilog as epilog_mod

    original = epilog_mod.process_jobs
    monkeypatch.setattr(epilog_mod, "process_jobs", lambda pids, root="/proc": original(pids, str(tmp_path / "proc")))
    assert epilog_hook.main(env, runner=no_scontrol, kill=kill) == 0
    assert killed == [4242] and node.journals() == []


def test_stranger_on_the_mig_device_fails_the_epilog(tmp_path, capsys):
    node = HookNode(tmp_path, "lab-mig01")
    env = node.env(62, "3")
    assert prolog_hook.main(env, runner=no_scontrol) == 0
    dev = JournalStore(node.state_dir).read(62).devices[0]
    node.fake.add_process(0, 999999, gi=dev.gi, ci=dev.ci)  # no such process on this machine
    assert epilog_hook.main(env, runner=no_scontrol) == 1
    err = capsys.readouterr().err
    assert f"MIG device {dev.mig_uuid}" in err and "busy after the job: process 999999 (not on this node)" in err
    assert node.journals() == []  # the undo itself succeeded; the drain reason says what is wrong


def test_epilog_of_a_job_without_gpus_needs_no_backend(tmp_path):
    node = HookNode(tmp_path, "lab-excl01")
    env = node.env(71)
    assert prolog_hook.main(env, runner=no_scontrol) == 0
    node.state.unlink()  # no NVML at all: the epilog must not need it
    assert epilog_hook.main(env, runner=no_scontrol) == 0 and node.journals() == []


def test_write_journal_action_in_plan_is_the_ending_state():
    actions, _ = plan_epilog(journal(), state())
    assert isinstance(actions[0], WriteJournal) and actions[0].journal.state == "ending"
    with pytest.raises(EpilogRefused):
        raise EpilogRefused(1, "n", ["x"])


# ---- one job id, two runs: Slurm starts the job again before the first run's epilog ------------------------------


def test_an_earlier_runs_epilog_leaves_a_later_runs_journal_daemon_and_task_file(mps_node):
    """slurmctld, SIGKILLed just after a job ended, recovers it as pending from its saved state and starts it again
    under the same id; the new run's prolog may come before the old run's epilog (docs/reference/slurm-behaviour.md).
    That epilog must not undo the new run: before this was known, it removed the new run's journal and task file and
    quit the daemon under it (in the soak, the new run's task prolog then exported nothing)."""
    first, second = mps_node.env(51, "0", 25), mps_node.env(51, "0", 25)
    first["SLURM_JOB_START_TIME"], second["SLURM_JOB_START_TIME"] = "1700000000", "1700000007"
    assert prolog_hook.main(first, runner=no_scontrol, mps=mps_node.mps) == 0
    assert prolog_hook.main(second, runner=no_scontrol, mps=mps_node.mps) == 0  # the second run's prolog, first
    store = JournalStore(mps_node.state_dir)
    daemon = store.read(51).mps
    assert store.read(51).start_time == 1700000007
    assert epilog_hook.main(first, runner=no_scontrol, mps=mps_node.mps) == 0  # the first run's epilog, late
    assert store.read(51).start_time == 1700000007 and mps_node.mps.alive(daemon)
    assert (mps_node.state_dir / "jobs" / "51.task").exists()
    assert epilog_hook.main(second, runner=no_scontrol, mps=mps_node.mps) == 0  # the second run's: all undone
    assert not mps_node.mps.alive(daemon) and mps_node.journals() == []


def test_a_later_runs_epilog_undoes_an_earlier_runs_journal(mps_node):
    """Where Slurm ran the second run without its prolog (the first run's terminate never reached slurmd, so the
    job's credential was still cached), the first run's journal served it: the second run's epilog undoes it."""
    first, second = mps_node.env(52, "0", 25), mps_node.env(52, "0", 25)
    first["SLURM_JOB_START_TIME"], second["SLURM_JOB_START_TIME"] = "1700000000", "1700000009"
    assert prolog_hook.main(first, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(52).mps
    assert epilog_hook.main(second, runner=no_scontrol, mps=mps_node.mps) == 0
    assert not mps_node.mps.alive(daemon) and mps_node.journals() == []


@pytest.mark.parametrize(("journal_start", "epilog_start", "later"), [(7, 3, True), (7, 7, False), (3, 7, False)])
def test_only_a_journal_of_a_later_run_is_left(journal_start, epilog_start, later):
    assert Journal(5, 5, 5, "n1", start_time=journal_start).later_than(epilog_start) is later


@pytest.mark.parametrize(("journal_start", "epilog_start"), [(None, 3), (7, None), (None, None)])
def test_without_both_start_times_the_journal_is_the_epilogs(journal_start, epilog_start):
    """Slurm versions or journals without a start time: the epilog undoes the journal, as it always did."""
    assert not Journal(5, 5, 5, "n1", start_time=journal_start).later_than(epilog_start)
