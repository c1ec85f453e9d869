"""Journals (issue 21 part 3 and 5): one unreadable journal is set aside and the node goes on; the rule
for a GPU in doubt; journals written by earlier versions read; the journal directory is root's."""

from __future__ import annotations

import json
import os
import stat

import pytest

from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.epilog import Killer
from slurm_gpushare.node.journal import Device, Journal, JournalError, JournalStore, MpsDaemon
from slurm_gpushare.node.reconcile import execute_reconcile, plan_for_node
from slurm_gpushare.proc import Result
from tests.unit.hooks_support import no_scontrol

GARBAGE = b"\x8b\xff\x00journal?\xfe"
DEV = Device(0, 0, "GPU-a", "exclusive")

# written by the version before this one (a69906f: JournalStore.write), byte for byte
OLD_JOURNAL = """{
 "devices": [
  {
   "ci": null,
   "gi": null,
   "gpu_index": 0,
   "gpu_uuid": "GPU-3c1a6f1e-0000-4000-8000-000000000001",
   "mig_uuid": null,
   "mode": "mps",
   "slurm_index": 0,
   "visible": "GPU-3c1a6f1e-0000-4000-8000-000000000001"
  }
 ],
 "env": {
  "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
  "CUDA_MPS_PIPE_DIRECTORY": "/var/lib/gpushare/mps/g0-u1001-p25/pipe"
 },
 "format": "gpushare-journal/1",
 "gid": 1001,
 "job_id": 812,
 "mps": {
  "gid": 1001,
  "gpu_indexes": [
   0
  ],
  "gpu_uuids": [
   "GPU-3c1a6f1e-0000-4000-8000-000000000001"
  ],
  "key": "g0-u1001-p25",
  "log_dir": "/var/log/gpushare/mps/g0-u1001-p25",
  "mem_limit_mib": [
   12288
  ],
  "percentage": 25,
  "pipe_dir": "/var/lib/gpushare/mps/g0-u1001-p25/pipe",
  "uid": 1001
 },
 "node": "lab-mps01",
 "state": "ready",
 "uid": 1001
}"""


def journal(job_id: int) -> Journal:
    return Journal(job_id, 5, 5, "n1", "ready", (DEV,), None, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})


def store_with(tmp_path, bad: dict[int, bytes], good=(1, 3)) -> JournalStore:
    store = JournalStore(tmp_path)
    for job_id in good:
        store.write(journal(job_id))
    for job_id, data in bad.items():
        store.path(job_id).write_bytes(data)
    return store


def names(store: JournalStore) -> list[str]:
    return sorted(n for n in os.listdir(store.dir) if n != ".lock")


# ---- one bad journal never stops the others ----------------------------------------------------------


def test_all_sets_an_unreadable_journal_aside_and_reads_the_others(tmp_path, capsys):
    store = store_with(tmp_path, {2: GARBAGE})
    with store.locked():
        found = store.all()
    assert sorted(found) == [1, 3]
    [aside] = store.quarantined
    assert aside.job_id == 2 and aside.moved and aside.reason == "not UTF-8 text"
    moved = os.path.basename(aside.path)
    assert moved.startswith("2.json.bad-") and os.path.dirname(aside.path) == str(store.dir)
    assert open(aside.path, "rb").read() == GARBAGE  # kept for the admin, as it was
    assert "2.json" not in names(store) and store.job_ids() == [1, 3]
    assert (
        capsys.readouterr().err
        == f"gpushare journal: {aside.path}: unreadable journal of job 2 (not UTF-8 text), set aside\n"
    )
    assert [a.path for a in store.set_aside()] == [aside.path]
    with store.locked():
        assert sorted(store.all()) == [1, 3] and len(store.quarantined) == 1  # once set aside, gone from the way


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "unreadable journal"),
        (
            json.dumps({"format": "gpushare-journal/9", "state": "ready"}).encode(),
            "format 'gpushare-journal/9' is not one of gpushare-journal/1",
        ),
        (
            json.dumps({**journal(2).to_json(), "state": "odd"}).encode(),
            "state 'odd' is not one of preparing, ready, ending",
        ),
        (json.dumps({**journal(2).to_json(), "job_id": 3}).encode(), "names job 3, not 2"),
        (
            json.dumps({k: v for k, v in journal(2).to_json().items() if k != "uid"}).encode(),
            "unreadable journal ('uid')",
        ),
    ],
)
def test_each_kind_of_bad_journal_is_set_aside_with_its_reason(tmp_path, data, reason):
    store = store_with(tmp_path, {2: data})
    with store.locked():
        assert sorted(store.all()) == [1, 3]
    assert reason in store.quarantined[0].reason and store.quarantined[0].moved


def test_a_link_is_set_aside_never_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(journal(2).to_json()))
    store = store_with(tmp_path, {})
    store.path(2).symlink_to(target)
    with store.locked():
        assert sorted(store.all()) == [1, 3]  # the job 2 journal the link points at is not read
    aside = store.quarantined[0]
    assert aside.reason == "a symbolic link" and os.path.islink(aside.path) and target.exists()


def test_a_fifo_is_set_aside_without_blocking(tmp_path):
    store = store_with(tmp_path, {})
    os.mkfifo(store.path(2))
    with store.locked():
        assert sorted(store.all()) == [1, 3]
    assert store.quarantined[0].reason == "not a regular file"


def test_without_the_lock_a_bad_journal_is_skipped_and_left_in_place(tmp_path):
    store = store_with(tmp_path, {2: GARBAGE})
    assert sorted(store.all()) == [1, 3]  # a reader without the lock (metrics) ...
    assert store.quarantined[0].moved is False and "2.json" in names(store)  # ... renames nothing
    assert store.set_aside() == []


def test_the_jobs_own_bad_journal_raises_naming_the_file_once_set_aside(tmp_path):
    store = store_with(tmp_path, {2: b"{not json"})
    with store.locked():
        with pytest.raises(
            JournalError,
            match=r"2\.json\.bad-[0-9TZ]+: unreadable journal of job 2 \(not JSON.*"
            r"set aside; what the job holds on the GPUs is unknown",
        ):
            store.read(2)
        assert store.read(2) is None  # a rerun finds nothing to undo


# ---- the rule for a GPU in doubt ---------------------------------------------------------------------


def test_a_gpu_is_in_doubt_only_while_slurm_runs_the_job_and_no_readable_journal_of_it_is_here(tmp_path):
    store = store_with(tmp_path, {2: GARBAGE, 4: b"{"})
    with store.locked():
        store.all()
    assert [q.job_id for q in store.doubts(running={1, 2, 3})] == [2]  # job 4 ended: nothing held
    assert store.doubts(running={1, 3}) == []
    doubt = store.doubts(running={2})[0].doubt()
    assert doubt.startswith(str(store.dir / "2.json.bad-")) and "what the job holds on the GPUs is unknown" in doubt
    store.write(journal(2))  # the job's prolog ran again: its new journal says what it holds
    assert store.doubts(running={2}) == []
    later = JournalStore(tmp_path)  # another run finds the files set aside earlier
    later.remove(2)
    assert [q.job_id for q in later.doubts(running={2, 4})] == [2, 4]


def _reconcile(node, running: set[int]):
    store = JournalStore(node.state_dir)
    with node.backend() as backend, store.locked():
        journals = store.all()
        plan = plan_for_node(journals, running, backend, str(node.state_dir), store)
        return store, plan, execute_reconcile(plan, store, node.mps, Killer(backend), journals)


def test_reconcile_reports_a_doubt_as_not_repaired_and_stops_no_daemon_meanwhile(mps_node):
    env = mps_node.env(63, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(63).mps
    JournalStore(mps_node.state_dir).path(63).write_bytes(GARBAGE)
    store, plan, failed = _reconcile(mps_node, running={63})  # Slurm still runs job 63 here
    assert mps_node.mps.alive(daemon) and plan.daemons == [] and store.task_path(63).exists()
    assert failed == [store.quarantined[0].doubt()]  # the health check drains naming the file
    assert any("unreadable journal of job 63" in line for line in plan.lines("lab-mps01"))
    store, plan, failed = _reconcile(mps_node, running=set())  # job 63 has ended: its daemon is an orphan
    assert failed == [] and not mps_node.mps.alive(daemon) and not store.task_path(63).exists()


# ---- the hooks go on ---------------------------------------------------------------------------------


def test_an_unrelated_mps_jobs_prolog_and_epilog_succeed_beside_a_bad_journal(mps_node, capsys):
    store = JournalStore(mps_node.state_dir)
    store.dir.mkdir(parents=True)
    store.path(999).write_bytes(GARBAGE)
    calls = []
    runner = lambda argv, **kw: calls.append(argv) or Result(tuple(argv), 0, "", "")  # noqa: E731
    env = mps_node.env(61, "0", 25)
    assert prolog_hook.main(env, runner=runner, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(61).mps
    assert mps_node.mps.alive(daemon)
    assert epilog_hook.main(env, runner=runner, mps=mps_node.mps) == 0
    assert not mps_node.mps.alive(daemon) and mps_node.journals() == []
    assert calls == []  # no scontrol: nothing drained
    [aside] = JournalStore(mps_node.state_dir).set_aside()
    assert aside.job_id == 999 and os.path.basename(aside.path).startswith("999.json.bad-")
    assert "999.json.bad-" in capsys.readouterr().err  # reported in slurmd's log


def test_the_epilog_of_the_job_whose_journal_is_bad_drains_naming_the_file(mps_node, capsys):
    env = mps_node.env(62, "0", 25)
    assert prolog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0
    daemon = JournalStore(mps_node.state_dir).read(62).mps
    JournalStore(mps_node.state_dir).path(62).write_bytes(GARBAGE)
    calls = []
    assert (
        epilog_hook.main(
            env, runner=lambda argv, **kw: calls.append(argv) or Result(tuple(argv), 0, "", ""), mps=mps_node.mps
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "gpushare-epilog: " in err and "62.json.bad-" in err and "what the job holds on the GPUs is unknown" in err
    assert calls and calls[0][:3] == ["scontrol", "update", "nodename=lab-mps01"] and "62.json.bad-" in calls[0][-1]
    assert mps_node.mps.alive(daemon)  # nothing undone blind: reconcile stops it once the job is gone
    assert epilog_hook.main(env, runner=no_scontrol, mps=mps_node.mps) == 0  # a rerun: nothing to undo


# ---- formats -----------------------------------------------------------------------------------------


def test_a_journal_written_by_the_previous_version_reads(tmp_path):
    store = JournalStore(tmp_path)
    store.dir.mkdir(parents=True)
    store.path(812).write_text(OLD_JOURNAL)
    with store.locked():
        found = store.all()
    assert store.quarantined == []
    old = found[812]
    assert old.mps == MpsDaemon(
        "g0-u1001-p25",
        (0,),
        ("GPU-3c1a6f1e-0000-4000-8000-000000000001",),
        1001,
        1001,
        25,
        (12288,),
        "/var/lib/gpushare/mps/g0-u1001-p25/pipe",
        "/var/log/gpushare/mps/g0-u1001-p25",
    )
    assert old.devices[0].visible == "GPU-3c1a6f1e-0000-4000-8000-000000000001" and old.state == "ready"
    assert old.start_time is None  # written before journals recorded the run's start: the epilog's, as before
    store.write(old.with_state("ending"))  # the epilog's rewrite
    assert store.read(812) == old.with_state("ending")


def test_a_field_added_later_with_a_default_is_absent_from_an_older_file(tmp_path):
    data = journal(7).to_json()
    for dev in data["devices"]:
        for name in ("mig_uuid", "gi", "ci", "visible"):
            del dev[name]
    store = JournalStore(tmp_path)
    store.dir.mkdir(parents=True)
    store.path(7).write_text(json.dumps(data))
    assert store.read(7) == journal(7)


def test_the_runs_start_time_is_written_and_read_back(tmp_path):
    store = JournalStore(tmp_path)
    store.dir.mkdir(parents=True)
    stamped = Journal(9, 5, 5, "n1", "ready", (DEV,), start_time=1700000123)
    store.write(stamped)
    assert json.loads(store.path(9).read_text())["start_time"] == 1700000123
    assert store.read(9) == stamped and store.read(9).with_state("ending").start_time == 1700000123


# ---- permissions -------------------------------------------------------------------------------------


def test_journal_directory_is_roots_and_unlistable_journals_private_task_files_readable(tmp_path):
    store = JournalStore(tmp_path / "state")
    store.write(journal(5))
    mode = lambda p: oct(stat.S_IMODE(os.lstat(p).st_mode))  # noqa: E731
    assert mode(store.dir) == "0o711" and mode(store.dir.parent) == "0o711"
    assert mode(store.path(5)) == "0o600" and mode(store.task_path(5)) == "0o644"


def test_an_existing_world_readable_journal_directory_is_made_roots(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.chmod(jobs, 0o755)
    JournalStore(tmp_path).write(journal(5))
    assert oct(stat.S_IMODE(os.stat(jobs).st_mode)) == "0o711"


def test_a_link_in_place_of_the_journal_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "jobs").symlink_to(elsewhere)
    with pytest.raises(OSError):
        JournalStore(tmp_path / "state").write(journal(5))
    assert list(elsewhere.iterdir()) == [] and oct(stat.S_IMODE(os.stat(elsewhere).st_mode)) == "0o755"
