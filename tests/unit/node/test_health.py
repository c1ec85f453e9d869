"""`gpushare node health` (node/health.py, hooks/health.py): the pure decision with data, then
whole runs against the fake NVML, the fake MPS control and a stateful fake Slurm (scontrol, squeue)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from slurm_gpushare.errors import GpushareError
from slurm_gpushare.hooks import health as health_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.health import (
    PREFIX,
    Drain,
    Findings,
    Leave,
    Resume,
    device_ok,
    drain_reason,
    plan_health,
)
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.policy import load_file
from slurm_gpushare.policy.model import Health
from slurm_gpushare.render import render_all
from tests.unit.hooks.test_repair import FakeSlurm
from tests.unit.hooks_support import ROOT, HookNode, no_scontrol

# ---- the decision (pure) -------------------------------------------------------------------

OURS = f"{PREFIX} device files missing: /dev/nvidia1"


@pytest.mark.parametrize(
    "state, reason, problems, expected",
    [
        (("IDLE",), "", [], Leave("healthy")),
        (("MIXED",), "", [], Leave("healthy")),
        (("IDLE", "DRAIN"), OURS, [], Resume(OURS)),
        (("MIXED", "DRAIN"), OURS, [], Resume(OURS)),
        (("IDLE", "DRAIN"), "admin", [], Leave("healthy; drained by someone else (admin), not resumed")),
        (("IDLE", "DRAIN"), "", [], Leave("healthy; drained by someone else (no reason), not resumed")),
        (("IDLE",), "", ["device files missing: /dev/nvidia1"], Drain(OURS)),
        (
            ("IDLE", "DRAIN"),
            "admin",
            ["device files missing: /dev/nvidia1"],
            Leave("drained by someone else (admin); left drained, reason kept"),
        ),
        (
            ("IDLE", "DRAIN"),
            OURS,
            ["device files missing: /dev/nvidia1"],
            Leave("already drained by the health check for the same reason"),
        ),
        (("IDLE", "DRAIN"), OURS, ["GPU layout: GPU 0: x"], Drain(f"{PREFIX} GPU layout: GPU 0: x")),
    ],
)
def test_plan_health(state, reason, problems, expected):
    assert plan_health(state, reason, problems) == expected


def test_drain_reason_is_printable_and_bounded():
    reason = drain_reason(["a\tb", "x" * 300])
    assert reason.startswith(f"{PREFIX} a?b; x") and len(reason) == 200 and reason.endswith("...")


def test_findings_problems_name_devices_layout_and_failed_repairs_but_not_notes():
    f = Findings(
        missing_devices=["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12"],
        layout=["GPU 0: have a, want b"],
        unrepaired=["MPS daemon k will not quit"],
        notes=["MPS daemon k2 does not answer"],
    )
    assert f.problems() == [
        "device files missing: /dev/nvidia1, /dev/nvidia-caps/nvidia-cap12",
        "GPU layout: GPU 0: have a, want b",
        "not repaired: MPS daemon k will not quit",
    ]


# ---- policy and render ---------------------------------------------------------------------


def test_health_policy_is_strict_and_off_by_default():
    assert Health().program is None and Health().node_state == ["ANY"]
    assert Health(program="/usr/local/sbin/gpushare-node-health", node_state=["IDLE", "MIXED", "CYCLE"]).interval == 300
    for bad, match in (
        ({"node_state": ["BUSY"]}, "NONDRAINED_IDLE"),
        ({"node_state": ["CYCLE"]}, "at least one"),
        ({"node_state": ["ANY", "IDLE"]}, "ANY already covers IDLE"),
        ({"interval": 0}, "greater"),
        ({"program": "relative/path"}, "pattern"),
        ({"every": 5}, "Extra"),
    ):
        with pytest.raises(ValidationError, match=match):
            Health(**bad)


def test_render_health_lines_only_when_on(tmp_path):
    raw = yaml.safe_load((ROOT / "etc" / "small-lab.yaml").read_text())
    del raw["cluster"]["health"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    off = "\n".join(render_all(load_file(path)).values())
    assert "HealthCheck" not in off
    raw["cluster"]["health"] = {
        "program": "/usr/local/sbin/gpushare-node-health",
        "interval": 120,
        "node_state": ["IDLE", "MIXED", "CYCLE"],
    }
    path.write_text(yaml.safe_dump(raw))
    on = "\n".join(render_all(load_file(path)).values())
    for line in (
        "HealthCheckProgram=/usr/local/sbin/gpushare-node-health",
        "HealthCheckInterval=120",
        "HealthCheckNodeState=IDLE,MIXED,CYCLE",
    ):
        assert f"\n{line}\n" in on


@pytest.mark.parametrize("example", ["small-lab", "mixed-production", "mps-inference"])
def test_bundled_policies_with_node_hooks_turn_the_health_check_on(example):
    """A newcomer's cluster heals a killed hook of ours without an admin: the examples with node hooks render
    HealthCheckProgram, at the path `gpushare node install` writes it (tests/unit/node/test_install.py)."""
    site = load_file(ROOT / "etc" / f"{example}.yaml")
    assert site.cluster.hooks.prolog and site.cluster.health.program == "/usr/local/sbin/gpushare-node-health"
    conf = render_all(site)["slurm-gpushare.conf"]
    assert f"\nHealthCheckProgram={site.cluster.health.program}\n" in conf
    assert f"\nHealthCheckInterval={site.cluster.health.interval}\n" in conf


# ---- whole runs ----------------------------------------------------------------------------


def all_devices(path: str) -> bool:
    return True


def run(node: HookNode, slurm: FakeSlurm, is_device=all_devices, mps=None):
    lines: list[str] = []
    report = health_hook.health(
        {"SLURMD_NODENAME": node.node, "GPUSHARE_NODE_CONFIG": str(node.config)},
        runner=slurm,
        mps=mps or node.mps,
        is_device=is_device,
        out=lines.append,
    )
    return report, lines


def updates(slurm: FakeSlurm) -> list[list[str]]:
    return [c for c in slurm.calls if c[:2] == ["scontrol", "update"]]


@pytest.fixture
def excl_node(tmp_path):
    return HookNode(tmp_path, "lab-excl01")


@pytest.fixture
def mig_node(tmp_path):
    return HookNode(tmp_path, "lab-mig01")


def test_healthy_node_is_left_alone(excl_node):
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    report, lines = run(excl_node, slurm)
    assert report.decision == Leave("healthy") and updates(slurm) == []
    assert lines == ["node lab-excl01: healthy"]


def test_missing_device_file_drains_naming_it_then_resumes_when_back(excl_node):
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    report, lines = run(excl_node, slurm, is_device=lambda p: p != "/dev/nvidia1")
    assert isinstance(report.decision, Drain) and "DRAIN" in slurm.flags
    assert slurm.reason == f"{PREFIX} device files missing: /dev/nvidia1"
    assert "node lab-excl01: PROBLEM: device files missing: /dev/nvidia1" in lines
    run(excl_node, slurm, is_device=lambda p: p != "/dev/nvidia1")  # still missing: no second update
    assert len(updates(slurm)) == 1
    report, _ = run(excl_node, slurm)  # the file is back
    assert report.decision == Resume(f"{PREFIX} device files missing: /dev/nvidia1")
    assert "DRAIN" not in slurm.flags and updates(slurm)[-1][-1] == "state=resume"


def test_admin_drain_is_never_resumed_nor_its_reason_replaced(excl_node):
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    slurm.flags.add("DRAIN")
    slurm.reason = "admin: new PSU"
    report, _ = run(excl_node, slurm)
    assert "not resumed" in str(report.decision) and updates(slurm) == []
    report, _ = run(excl_node, slurm, is_device=lambda p: p != "/dev/nvidia0")
    assert report.findings.missing_devices == ["/dev/nvidia0"]
    assert updates(slurm) == [] and slurm.reason == "admin: new PSU" and "DRAIN" in slurm.flags


def test_mig_drift_drains_naming_the_gpu_and_the_difference(mig_node):
    with mig_node.backend() as backend:
        gi = backend.gpu_instances(0)[0]
        for ci in backend.compute_instances(0, gi.id):
            backend.destroy_compute_instance(0, gi.id, ci.id)
        backend.destroy_gpu_instance(0, gi.id)
    slurm = FakeSlurm("lab-mig01", "gpu:a100_1g.5gb:7")
    report, _ = run(mig_node, slurm)
    assert isinstance(report.decision, Drain)
    assert slurm.reason == f"{PREFIX} GPU layout: GPU 0: have 1g.5gb x6, want 1g.5gb x7"


def test_orphan_journal_is_repaired_without_a_drain(excl_node):
    assert prolog_hook.main(excl_node.env(11, "1"), runner=no_scontrol) == 0
    assert prolog_hook.main(excl_node.env(12, "0"), runner=no_scontrol) == 0
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2", jobs={12: "gres/gpu:1"})  # job 11 ended, its epilog never ran
    report, lines = run(excl_node, slurm)
    assert excl_node.journals() == ["12.json"]
    assert report.decision == Leave("healthy") and updates(slurm) == []
    assert any(line.startswith("node lab-excl01: repaired: job 11 is not running here") for line in lines)


def test_a_job_with_a_slurmstepd_here_is_never_an_orphan_whatever_slurm_lists(excl_node, monkeypatch):
    """slurmctld SIGKILLed just after allocating a job recovers it as pending from its older saved state, while the
    job runs on the node: squeue does not list it here. Its slurmstepd does: its journal is kept. The repair of an
    ended job's journal is logged for the admin (health-repairs.log)."""
    from slurm_gpushare.node import health as health_mod

    assert prolog_hook.main(excl_node.env(31, "0"), runner=no_scontrol) == 0
    assert prolog_hook.main(excl_node.env(32, "1"), runner=no_scontrol) == 0
    monkeypatch.setattr(health_mod, "local_jobs", lambda: {31})  # job 31's steps run here; job 32's do not
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2", jobs={})  # Slurm lists neither
    report, _ = run(excl_node, slurm)
    assert excl_node.journals() == ["31.json"]
    assert [line.split(":")[0] for line in report.findings.repaired] == ["job 32 is not running here"]
    logged = (excl_node.state_dir / health_mod.REPAIRS).read_text().splitlines()
    assert len(logged) == 1 and logged[0].endswith(report.findings.repaired[0]) and logged[0][:2] == "20"


def test_jobs_with_steps_reads_every_steps_slurmstepd_title(tmp_path):
    from slurm_gpushare.node.health import jobs_with_steps

    fake_proc(tmp_path, [*STEPD_TITLES, b"slurmstepd: [469.interactive]\0"])
    assert jobs_with_steps(tmp_path, ("/usr/sbin/slurmstepd",)) == {466, 467, 468, 469}
    assert jobs_with_steps(tmp_path, ()) == set()  # no slurmstepd on this node: nothing known, nothing kept


def test_a_job_slurm_runs_is_never_an_orphan(excl_node):
    """A job Slurm lists (its prolog wrote the journal under the lock the health check takes) keeps it."""
    assert prolog_hook.main(excl_node.env(21, "0"), runner=no_scontrol) == 0
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2", jobs={21: "gres/gpu:1"})
    report, _ = run(excl_node, slurm)
    assert excl_node.journals() == ["21.json"] and report.findings.repaired == []


class FailingMps:
    def quit(self, daemon):
        raise GpushareError(f"MPS control daemon {daemon.key} (pipe {daemon.pipe_dir}) will not quit within 10 s")


def test_a_repair_that_fails_drains(excl_node):
    (excl_node.state_dir / "mps" / "g0-u9-p10" / "pipe").mkdir(parents=True)  # a daemon no journal names
    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    report, _ = run(excl_node, slurm, mps=FailingMps())
    assert isinstance(report.decision, Drain)
    assert (
        slurm.reason.startswith(f"{PREFIX} not repaired: MPS control daemon g0-u9-p10 ")
        and "will not quit" in slurm.reason
    )


def test_dead_mps_daemon_of_a_running_job_is_a_note_not_a_drain(mps_node):
    assert prolog_hook.main(mps_node.env(31, "0", 25), runner=no_scontrol, mps=mps_node.mps) == 0
    journal = JournalStore(mps_node.state_dir).read(31)
    mps_node.mps.quit(journal.mps)  # the daemon dies under the job
    slurm = FakeSlurm("lab-mps01", "gpu:a30:1,mps:a30:100", jobs={31: "gres/mps:25"})
    report, lines = run(mps_node, slurm)
    assert report.decision == Leave("healthy") and updates(slurm) == []
    assert any(f"note: MPS daemon {journal.mps.key} of job 31 does not answer" in line for line in lines)


def test_main_exits_1_with_one_line_when_slurm_cannot_be_asked(excl_node, capsys):
    def broken(argv, **kw):
        raise GpushareError("squeue: cannot reach slurmctld")

    code = health_hook.main(
        {"SLURMD_NODENAME": "lab-excl01", "GPUSHARE_NODE_CONFIG": str(excl_node.config)},
        runner=broken,
        is_device=all_devices,
    )
    assert code == 1 and "gpushare-node-health: " in capsys.readouterr().err


def test_cli_dry_run_prints_the_drain_it_would_do_and_changes_nothing(excl_node, monkeypatch):
    from click.testing import CliRunner

    import slurm_gpushare.proc
    from slurm_gpushare.cli.node import node as node_cli

    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2")
    monkeypatch.setattr(slurm_gpushare.proc, "run", slurm)
    result = CliRunner().invoke(
        node_cli,
        [
            "health",
            "--policy",
            str(excl_node.policy),
            "--node",
            "lab-excl01",
            "--fake-nvml",
            str(excl_node.state),
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    missing = [p for p in ("/dev/nvidia0", "/dev/nvidia1") if not device_ok(p)]  # this host's real /dev
    if missing:
        assert f"would: node lab-excl01: drain: {PREFIX} device files missing: {', '.join(missing)}\n" in result.output
    else:
        assert result.output.endswith("would: node lab-excl01: healthy\n")
    assert updates(slurm) == [] and "DRAIN" not in slurm.flags


# ---- slurmctld's own drains after a hook failure ------------------------------------------------


PROLOG_ERR, EPILOG_ERR = frozenset({"Prolog error"}), frozenset({"Epilog error"})
NOT_OURS = (
    "drained by Slurm (Prolog error), not attributed to the gpushare prolog: another Prolog script runs here "
    "and no journal shows ours unfinished; left drained for an admin"
)


@pytest.mark.parametrize(
    "reason, user, problems, heals, attributed, expected",
    [
        (
            "Prolog error",
            "slurm",
            [],
            0,
            PROLOG_ERR,
            Resume("Prolog error", by="Slurm after a hook failure, cleaned up since"),
        ),
        (
            "Epilog error",
            "slurm",
            [],
            2,
            EPILOG_ERR,
            Resume("Epilog error", by="Slurm after a hook failure, cleaned up since"),
        ),
        # a generic Prolog / Epilog error not attributed to our hooks: another script's failure, left alone
        ("Prolog error", "slurm", [], 0, frozenset(), Leave(NOT_OURS)),
        ("Prolog error", "slurm", [], 0, EPILOG_ERR, Leave(NOT_OURS)),
        (
            "Epilog error",
            "slurm",
            [],
            0,
            PROLOG_ERR,
            Leave(NOT_OURS.replace("Prolog", "Epilog").replace("prolog", "epilog")),
        ),
        ("Prolog error", "slurm", ["device files missing: /dev/nvidia1"], 0, frozenset(), Leave(NOT_OURS)),
        # launch failures, not a script's: healed as before
        (
            "batch job complete failure",
            "slurm",
            [],
            0,
            frozenset(),
            Resume("batch job complete failure", by="Slurm after a hook failure, cleaned up since"),
        ),
        (
            "Prolog error",
            "slurm",
            [],
            3,
            PROLOG_ERR,
            Leave(
                "healthy, but drained by Slurm (Prolog error) and resumed 3 times in the last hour: left drained for "
                "an admin"
            ),
        ),
        # an admin who typed the same words is still an admin
        (
            "Prolog error",
            "root",
            [],
            0,
            PROLOG_ERR,
            Leave("healthy; drained by someone else (Prolog error), not resumed"),
        ),
        (
            "Kill task failed",
            "slurm",
            [],
            0,
            frozenset(),
            Leave("healthy; drained by someone else (Kill task failed), not resumed"),
        ),
        (
            "Prolog error",
            "slurm",
            ["device files missing: /dev/nvidia1"],
            0,
            PROLOG_ERR,
            Leave("drained by someone else (Prolog error); left drained, reason kept"),
        ),
        # the reason our own root hooks set before failing (slurmctld keeps it when it drains the node)
        (
            "gpushare-prolog: MPS daemon g0-u5-p25: could not start",
            "root",
            [],
            0,
            frozenset(),
            Resume(
                "gpushare-prolog: MPS daemon g0-u5-p25: could not start", by="a failed gpushare hook, cleaned up since"
            ),
        ),
        (
            "gpushare-epilog: job 7: process 42 survived SIGKILL",
            "root",
            [],
            3,
            frozenset(),
            Leave(
                "healthy, but drained by Slurm (gpushare-epilog: job 7: process 42 survived SIGKILL) and resumed 3 "
                "times in the last hour: left drained for an admin"
            ),
        ),
        (
            "gpushare-prolog: x",
            "alice",
            [],
            0,
            frozenset(),
            Leave("healthy; drained by someone else (gpushare-prolog: x), not resumed"),
        ),
    ],
)
def test_plan_health_heals_our_hook_failure_drains_a_bounded_number_of_times(
    reason, user, problems, heals, attributed, expected
):
    assert plan_health(("IDLE", "DRAIN"), reason, problems, user, heals, attributed) == expected


def test_heal_log_keeps_the_last_hour_and_survives_a_bad_file(tmp_path):
    from slurm_gpushare.node.health import recent_heals, record_heal

    log = tmp_path / "health-heals"
    assert recent_heals(log) == []
    record_heal(log, [], now=1000.0)
    record_heal(log, recent_heals(log, now=2000.0), now=2000.0)
    assert recent_heals(log, now=2000.0) == [1000.0, 2000.0]
    assert recent_heals(log, now=4700.0) == [2000.0]  # 1000 is more than an hour before
    log.write_text("garbage\n")
    assert recent_heals(log, now=2000.0) == []


# ---- launches slurmd lost (killed between accepting a job and starting its slurmstepd) -------------------


def test_lost_jobs_are_the_old_running_ones_without_a_slurmstepd():
    from slurm_gpushare.node.health import lost_jobs

    started = {1: 1000, 2: 1000, 3: 1950}
    assert lost_jobs(started, stepds={2}, now=2000.0) == [1]  # 2 has its stepd, 3 is 50 s old
    assert lost_jobs(started, stepds=set(), now=2000.0) == [1, 2]


STEPD_TITLES = (
    b"slurmstepd: [466.batch]\0",
    b"slurmstepd: [467.extern]\0",
    b"/usr/bin/python3\0slurmstepd: [9.batch]\0",
    b"",
    b"slurmstepd: [468.0]\0",
)


def fake_proc(root, titles) -> None:
    """A /proc under ``root`` with one root-owned slurmstepd process per title (pids from 10 on)."""
    for pid, title in enumerate(titles, 10):
        (root / str(pid)).mkdir()
        (root / str(pid) / "cmdline").write_bytes(title)
        (root / str(pid) / "status").write_text("Uid:\t0\t0\t0\t0\n")  # root's (test_procscan: others')
        (root / str(pid) / "exe").symlink_to("/usr/sbin/slurmstepd")
    (root / "self").mkdir()


def test_stepd_jobs_reads_slurmstepd_titles(tmp_path):
    from slurm_gpushare.node.health import stepd_jobs

    fake_proc(tmp_path, STEPD_TITLES)
    # only batch steps: the extern step (PrologFlags=Contain) starts before the launch that can be lost
    assert stepd_jobs(tmp_path, ("/usr/sbin/slurmstepd",)) == {466}


def test_a_lost_launch_is_requeued_and_a_fresh_job_is_not(excl_node, monkeypatch):
    import time as _time

    from slurm_gpushare.node import health as health_mod

    monkeypatch.setattr(health_mod, "stepd_jobs", lambda: set())  # not this machine's /proc

    slurm = FakeSlurm("lab-excl01", "gpu:l40s:2", jobs={41: "gres/gpu:1", 42: "gres/gpu:1"})
    slurm.started = {41: int(_time.time()) - 600}  # 42 started just now: its launch may still be under way
    report, _ = run(excl_node, slurm)
    assert slurm.requeued == [41]
    assert any(
        line.startswith("job 41: running for Slurm since ") and "launch lost" in line
        for line in report.findings.repaired
    ), report.findings.repaired
    assert not isinstance(report.decision, Drain)
