"""The health check beside ordinary and hostile tenants and a site's own scripts (issue 21 parts 2, 4, 5):
an interactive job is never requeued and never drains the node, a requeue Slurm refuses is a note, a
generic ``Prolog error`` / ``Epilog error`` is healed only when it is ours, and no node-wide lock is held
while Slurm is asked anything. Whole runs of `gpushare-node-health` against the fake NVML and a stateful
fake Slurm that answers as Slurm 24.11 does (who set a drain reason, ``scontrol show config``, requeue refusals)."""

from __future__ import annotations

import fcntl
import json
import os
import time

import pytest

from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import health as health_mod
from slurm_gpushare.node.health import Drain, Leave, Resume
from slurm_gpushare.node.journal import Journal, JournalStore
from slurm_gpushare.proc import CommandError, Result
from tests.unit.hooks.test_repair import FakeSlurm
from tests.unit.hooks_support import no_scontrol
from tests.unit.node.test_health import run, updates

BATCH_ONLY = "Only batch jobs are accepted or processed"  # slurm_strerror(ESLURM_BATCH_ONLY)


class SiteSlurm(FakeSlurm):
    """FakeSlurm with who set the drain reason (``reason_set_by_user``), slurmctld's Prolog/Epilog settings
    (``scontrol show config``) and scontrol requeue's refusals: a job with no batch script (``interactive``)
    is refused as Slurm refuses it, and so is any job in ``refuse`` with its message."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.reason_user = ""
        self.interactive: set[int] = set()
        self.refuse: dict[int, str] = {}
        self.config = {"Prolog": "(null)", "Epilog": "(null)"}  # a value with ',': several programs

    def drained_by_slurm(self, reason: str) -> None:
        self.flags.add("DRAIN")
        self.reason, self.reason_user = reason, "slurm"

    def __call__(self, argv, **kw):
        argv = list(argv)
        if argv == ["scontrol", "show", "node", self.node, "--json"]:
            doc = json.loads(super().__call__(argv, **kw).stdout)
            doc["nodes"][0]["reason_set_by_user"] = self.reason_user if self.reason else ""
            return Result(tuple(argv), 0, json.dumps(doc), "")
        if argv == ["scontrol", "show", "config"]:
            self.calls.append(argv)
            # Slurm 24.11: one Prolog[N] line per program, or "Prolog = (null)"
            lines = [
                f"{k:<24}= (null)\n"
                if v == "(null)"
                else "".join(f"{k + f'[{i}]':<24}= {p}\n" for i, p in enumerate(v.split(",")))
                for k, v in self.config.items()
            ]
            return Result(tuple(argv), 0, "".join(lines), "")
        if argv[:2] == ["scontrol", "requeue"] and len(argv) == 3:
            job = int(argv[2])
            why = BATCH_ONLY if job in self.interactive else self.refuse.get(job)
            if why:
                self.calls.append(argv)
                raise CommandError(Result(tuple(argv), 1, "", f"scontrol: error: Requeue of JobId={job} failed: {why}"))
        return super().__call__(argv, **kw)


@pytest.fixture
def no_stepds(monkeypatch):
    monkeypatch.setattr(health_mod, "stepd_jobs", lambda *a: set())  # not this machine's /proc


def requeues(slurm) -> list[list[str]]:
    return [c for c in slurm.calls if c[:2] == ["scontrol", "requeue"]]


# ---- part 2: interactive jobs, refused requeues ---------------------------------------------------


def test_an_interactive_job_submitted_from_the_node_is_never_requeued_nor_drains(excl_node, no_stepds):
    """salloc from lab-excl01, placed on it: squeue's batch host is the submit host, and there is no batch
    slurmstepd. Held long past the lost-launch threshold, over several health runs."""
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2", jobs={43: "gres/gpu:1"})
    slurm.interactive = {43}
    slurm.started = {43: int(time.time()) - 10 * health_mod.LOST_AFTER_S}
    for _ in range(3):
        report, lines = run(excl_node, slurm)
        assert not isinstance(report.decision, Drain), lines
    assert requeues(slurm) == [] and updates(slurm) == [] and "DRAIN" not in slurm.flags
    assert 43 in slurm.jobs


def test_a_requeue_slurm_refuses_is_a_note_never_a_drain(excl_node, no_stepds):
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2", jobs={44: "gres/gpu:1"})
    slurm.started = {44: int(time.time()) - 600}
    slurm.refuse = {44: "Requested operation is presently disabled"}
    report, lines = run(excl_node, slurm)
    assert requeues(slurm) == [["scontrol", "requeue", "44"]]
    assert report.decision == Leave("healthy") and updates(slurm) == [], lines
    assert any(n.startswith("job 44: ") and "presently disabled" in n for n in report.findings.notes), lines


def test_a_job_that_ended_after_the_first_read_is_not_requeued(excl_node, no_stepds):
    """The lost launches are read again after the slurmstepd scan: a job gone (or restarted) meanwhile is
    not requeued."""

    class EndsAfterFirstRead(SiteSlurm):
        def __call__(self, argv, **kw):
            out = super().__call__(argv, **kw)
            if list(argv[:2]) == ["squeue", "-w"] and "RUNNING" in argv:
                self.jobs.pop(45, None)
            return out

    slurm = EndsAfterFirstRead("lab-excl01", "gpu:l40s:2", jobs={45: "gres/gpu:1"})
    slurm.started = {45: int(time.time()) - 600}
    report, _ = run(excl_node, slurm)
    assert requeues(slurm) == [] and report.decision == Leave("healthy")


# ---- part 4: which generic drains are ours ------------------------------------------------------------


def our_prolog(tmp_path, name="gpushare-prolog", module="slurm_gpushare.hooks.prolog") -> str:
    """A console script as pip writes it for our hook."""
    path = tmp_path / name
    path.write_text(
        f"#!/opt/gpushare/bin/python3\nimport re\nimport sys\nfrom {module} import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    return str(path)


def test_a_prolog_error_of_another_script_is_left_drained(excl_node, tmp_path):
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")
    slurm.config["Prolog"] = "/etc/slurm/prolog.d/*"  # the site's scripts and ours
    slurm.drained_by_slurm("Prolog error")
    report, lines = run(excl_node, slurm)
    assert isinstance(report.decision, Leave) and "not attributed to the gpushare prolog" in str(report.decision), lines
    assert updates(slurm) == [] and "DRAIN" in slurm.flags and slurm.reason == "Prolog error"


def test_a_site_prolog_that_is_not_ours_is_not_attributed(excl_node, tmp_path):
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")
    slurm.config["Prolog"] = our_prolog(tmp_path, "site-prolog", module="site.checks")
    slurm.drained_by_slurm("Prolog error")
    report, _ = run(excl_node, slurm)
    assert updates(slurm) == [] and "DRAIN" in slurm.flags


def lean_prolog(tmp_path) -> str:
    """The prolog script as gpushare node install writes it."""
    from slurm_gpushare.node.install import PROLOG, hook_script

    path = tmp_path / "gpushare-prolog"
    path.write_text(hook_script("/opt/gpushare/bin/python3", ["/opt/gpushare/lib/python3.13/site-packages"], PROLOG))
    return str(path)


@pytest.mark.parametrize("write", [our_prolog, lean_prolog], ids=["console script", "node install's script"])
def test_a_prolog_error_is_healed_when_ours_is_the_only_prolog(excl_node, tmp_path, write):
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")
    slurm.config["Prolog"] = write(tmp_path)
    slurm.drained_by_slurm("Prolog error")
    report, _ = run(excl_node, slurm)
    assert report.decision == Resume("Prolog error", by="Slurm after a hook failure, cleaned up since")
    assert "DRAIN" not in slurm.flags


def test_our_killed_prolog_is_healed_beside_other_scripts_and_a_later_foreign_failure_is_not(excl_node):
    """SIGKILLed after it wrote its journal (``preparing``): the journal shows our prolog never finished, so
    the ``Prolog error`` is ours even with other Prolog scripts configured. The evidence is used by that
    heal: a later ``Prolog error`` with no journal of ours left is another script's."""
    uid, gid = os.getuid(), os.getgid()
    JournalStore(excl_node.state_dir).write(Journal(51, uid, gid, "lab-excl01", "preparing"))
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")  # job 51 was requeued: not on the node any more
    slurm.config["Prolog"] = "/etc/slurm/prolog.d/*"
    slurm.drained_by_slurm("Prolog error")
    report, lines = run(excl_node, slurm)
    assert excl_node.journals() == [] and isinstance(report.decision, Resume), lines
    assert "DRAIN" not in slurm.flags
    slurm.drained_by_slurm("Prolog error")  # a site script fails later
    report, lines = run(excl_node, slurm)
    assert isinstance(report.decision, Leave) and "DRAIN" in slurm.flags, lines


def test_our_killed_epilog_is_healed_beside_other_scripts(excl_node):
    assert prolog_hook.main(excl_node.env(52, "0"), runner=no_scontrol) == 0
    store = JournalStore(excl_node.state_dir)
    store.write(store.read(52).with_state("ending"))  # the epilog began undoing, then was SIGKILLed
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")
    slurm.config["Epilog"] = "/usr/local/sbin/site-epilog,/usr/local/sbin/gpushare-epilog"
    slurm.drained_by_slurm("Epilog error")
    report, lines = run(excl_node, slurm)
    assert excl_node.journals() == [] and isinstance(report.decision, Resume), lines
    assert "DRAIN" not in slurm.flags


def test_a_journal_of_a_job_that_simply_ended_is_no_evidence(excl_node):
    """A ``ready`` journal left by a job whose epilog never ran (another Epilog script failed first, say)
    says nothing about ours: cleaned up, but the Epilog error stays."""
    assert prolog_hook.main(excl_node.env(53, "0"), runner=no_scontrol) == 0
    slurm = SiteSlurm("lab-excl01", "gpu:l40s:2")
    slurm.config["Epilog"] = "/etc/slurm/epilog.d/*"
    slurm.drained_by_slurm("Epilog error")
    report, _ = run(excl_node, slurm)
    assert excl_node.journals() == [] and isinstance(report.decision, Leave) and "DRAIN" in slurm.flags


# ---- part 5: no node-wide lock across a Slurm call ------------------------------------------------


def held_locks(state_dir) -> list[str]:
    """Which of the node's locks (the journal lock every hook takes, the MPS lock) someone holds now: a second
    open file description cannot flock them without blocking."""
    from slurm_gpushare.node.mps import lock_path

    held = []
    for path in (os.path.join(state_dir, "jobs", ".lock"), lock_path(str(state_dir))):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(path)
        finally:
            os.close(fd)
    return held


def test_no_node_lock_is_held_while_slurm_is_asked(excl_node, no_stepds, tmp_path):
    """Every Slurm command of a run that repairs an orphan, requeues a lost launch and heals a Prolog error."""

    class LockProbe(SiteSlurm):
        def __call__(self, argv, **kw):
            self.held.extend((" ".join(argv[:3]), p) for p in held_locks(excl_node.state_dir))
            return super().__call__(argv, **kw)

    assert prolog_hook.main(excl_node.env(11, "1"), runner=no_scontrol) == 0  # its job ended: an orphan
    slurm = LockProbe("lab-excl01", "gpu:l40s:2", jobs={41: "gres/gpu:1"})
    slurm.held = []
    slurm.started = {41: int(time.time()) - 600}
    slurm.config["Prolog"] = our_prolog(tmp_path)
    slurm.drained_by_slurm("Prolog error")
    report, lines = run(excl_node, slurm)
    heads = {" ".join(c[:2]) for c in slurm.calls}
    assert {"squeue -w", "scontrol show", "scontrol requeue", "scontrol update"} <= heads, slurm.calls
    assert slurm.held == [], slurm.held
    assert excl_node.journals() == [] and slurm.requeued == [41] and isinstance(report.decision, Resume), lines


def test_a_journal_written_while_slurm_is_asked_is_not_taken_for_an_orphan(excl_node):
    """A prolog that runs while the health check waits for squeue (its job allocated after squeue answered,
    so squeue does not list it) writes a journal the repair must keep."""

    class PrologDuringSqueue(SiteSlurm):
        def __call__(self, argv, **kw):
            out = super().__call__(argv, **kw)
            if list(argv) == ["squeue", "-w", self.node, "-h", "-o", "%A"] and not self.ran:
                assert held_locks(excl_node.state_dir) == [], "the prolog would wait for the health check"
                self.ran = True
                assert prolog_hook.main(excl_node.env(77, "1"), runner=no_scontrol) == 0
            return out

    slurm = PrologDuringSqueue("lab-excl01", "gpu:l40s:2")
    slurm.ran = False
    report, lines = run(excl_node, slurm)
    assert slurm.ran and excl_node.journals() == ["77.json"], lines
    assert report.findings.repaired == [] and report.decision == Leave("healthy")
    slurm.jobs[77] = "gres/gpu:1"  # the next run: squeue lists it
    run(excl_node, slurm)
    assert excl_node.journals() == ["77.json"]


# ---- the Slurm client's answers these rest on -----------------------------------------------------


def test_batch_jobs_started_keeps_only_batch_jobs_whose_batch_host_is_the_node():
    from slurm_gpushare.slurm.cli_backend import CliClient, SlurmClientError

    out = (
        "61|1000|lab-excl01|1\n"  # sbatch, its script runs here
        "62|1000|lab-excl01|0\n"  # salloc from lab-excl01: the submit host shows as batch host
        "63|1000|lab-mig01|1\n"  # a batch job whose script runs on another node of its allocation
        "\n"
    )

    def squeue(argv, **kw):
        assert argv == [
            "squeue",
            "-w",
            "lab-excl01",
            "-h",
            "-t",
            "RUNNING",
            "--Format",
            "JobID:|,StartTime:|,BatchHost:|,BatchFlag:",
        ]
        return Result(tuple(argv), 0, out, "")

    assert CliClient(squeue).batch_jobs_started("lab-excl01") == {61: 1000}
    out = "61 1000 lab-excl01\n"  # squeue's old -o '%A %S %B' shape
    with pytest.raises(SlurmClientError, match="batch flag 0 or 1"):
        CliClient(squeue).batch_jobs_started("lab-excl01")


def test_hook_programs_reads_prolog_and_epilog_from_show_config():
    from slurm_gpushare.slurm.cli_backend import CliClient

    text = (
        "Configuration data as of 2026-01-01T00:00:00\nPriorityType            = priority/multifactor\n"
        "Prolog[0]               = /usr/local/sbin/gpushare-prolog\nPrologEpilogTimeout     = 65534\n"
        "PrologFlags             = Alloc,Contain\nEpilog[0]               = /etc/slurm/site-epilog\n"
        "Epilog[1]               = /usr/local/sbin/gpushare-epilog\nEpilogMsgTime           = 2000 usec\n"
    )
    client = CliClient(lambda argv, **kw: Result(tuple(argv), 0, text, ""))
    assert client.hook_programs() == {
        "Prolog": ["/usr/local/sbin/gpushare-prolog"],
        "Epilog": ["/etc/slurm/site-epilog", "/usr/local/sbin/gpushare-epilog"],
    }
    text = "Prolog                  = (null)\nEpilog                  = /usr/local/sbin/gpushare-epilog\n"  # older form
    assert client.hook_programs() == {"Prolog": [], "Epilog": ["/usr/local/sbin/gpushare-epilog"]}


def test_an_unfinished_hook_recorded_is_read_back_at_once_and_kept_an_hour(tmp_path):
    """Times are written floored: one rounded up past the reading's clock would be dropped as in the future."""
    from slurm_gpushare.node.health import note_unfinished, unfinished_hooks

    path = tmp_path / "health-unfinished-hooks"
    note_unfinished(
        path, [Journal(52, 0, 0, "lab-excl01", "ending"), Journal(53, 0, 0, "lab-excl01", "ready")], now=1000.6
    )
    assert unfinished_hooks(path, now=1000.6) == [(1000.0, "epilog", 52)]  # a ready journal is no evidence
    assert unfinished_hooks(path, now=1000.0 + health_mod.HEAL_WINDOW_S) == []
    path.write_text("garbage\n1000 prolog x\n")
    assert unfinished_hooks(path, now=1000.6) == []
