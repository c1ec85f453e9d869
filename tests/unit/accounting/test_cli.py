"""gpushare usage / fairness / fairshare / accounts: offline on recorded output, live through a fake Runner.

The commands are mounted here on the same error-translating group as the
real `gpushare` (registration in cli/__init__.py is the lead's), and get the
fake Runner and clock through click's ctx.obj, as the entry point would pass
the real ones.
"""

from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner

from slurm_gpushare.cli import accounts, usage
from slurm_gpushare.cli.errors import ErrorsToExitCodes
from tests.conftest import ROOT
from tests.unit.slurm_fakes import DATA, FakeJob, FakeSlurm

GPUSHARE = ErrorsToExitCodes("gpushare", commands={c.name: c for c in (accounts.accounts, *usage.COMMANDS)})
LAB = str(ROOT / "etc" / "small-lab.yaml")
SACCT = str(DATA / "sacct-small-lab.parsable2")
SACCT_JSON = str(DATA / "sacct-small-lab.v0.0.42.json")
SSHARE = str(DATA / "sshare-small-lab.parsable2")
DAY = ["--since", "2025-03-01T00:00:00", "--until", "2025-03-02T00:00:00", "--tz", "UTC"]
T0 = 1740787200


def run(*args, runner=None, clock=None):
    obj = {k: v for k, v in (("runner", runner), ("clock", clock)) if v is not None}
    return CliRunner().invoke(GPUSHARE, list(args), obj=obj, catch_exceptions=False)


def test_usage_table_from_a_recorded_file():
    res = run("usage", *DAY, "--sacct-file", SACCT, "--by", "user", "--policy", LAB)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "GPU-equivalent usage 2025-03-01T00:00:00+00:00 .. 2025-03-02T00:00:00+00:00, by user"
    assert lines[2].split() == ["alice", "5.00", "5.00", "3", "55.1%"]
    assert "total: 9.07 GPU-eq h, 15.00 billing h, 8 jobs (2 records outside the window)" in res.output


def test_usage_json_and_csv_from_json_sacct():
    doc = json.loads(run("usage", *DAY, "--sacct-file", SACCT_JSON, "--by", "gpu-kind", "--format", "json").output)
    assert {r["gpu_kind"]: round(r["gpu_hours"], 3) for r in doc["rows"]}["mps"] == 2.0
    assert doc["window"]["since"] == "2025-03-01T00:00:00+00:00" and doc["total"]["jobs"] == 8
    rows = list(
        csv.DictReader(
            io.StringIO(run("usage", *DAY, "--sacct-file", SACCT, "--format", "csv", "--half-life", "7-0").output)
        )
    )
    assert rows[0]["account"] == "physics" and float(rows[0]["fairshare_gpu_hours"]) < float(rows[0]["gpu_hours"])


def test_usage_live_through_the_runner_with_relative_times():
    fake = FakeSlurm(
        jobs=[FakeJob("1", "alice", "physics", "batch", T0 - 7200, T0 - 3600, "gres/gpu:l40s=1,gres/gpu=1")]
    )
    res = run("usage", "--since", "1d", "--format", "json", runner=fake, clock=lambda: T0)
    assert json.loads(res.output)["rows"][0]["gpu_hours"] == 1.0
    assert fake.calls and fake.calls[0][0] == "sacct"


def test_fairness_table_and_json():
    res = run("fairness", *DAY, "--sacct-file", SACCT)
    assert res.exit_code == 0 and "Jain's index among the tenants under root: 0.9991" in res.output
    doc = json.loads(run("fairness", *DAY, "--sacct-file", SACCT, "--format", "json").output)
    assert doc["jain"]["biology"] == 1.0
    assert {r["tenant"] for r in doc["rows"]} == {"physics", "biology", "biology-imaging"}


def test_fairshare_matches_the_recorded_sshare():
    res = run("fairshare", "--sshare-file", SSHARE, "--check")
    assert res.exit_code == 0, res.output
    assert "29 values compared with sshare, 0 differ by more than 1e-06" in res.output
    assert "  biology-imaging" in res.output


def test_fairshare_check_fails_on_a_difference(tmp_path):
    changed = tmp_path / "sshare.txt"
    changed.write_text(
        (DATA / "sshare-small-lab.parsable2").read_text().replace("|0.400000|2.000000|", "|0.200000|2.000000|")
    )
    res = run("fairshare", "--sshare-file", str(changed), "--check")
    assert res.exit_code == 1 and "physics/bob fairshare: ours 0.4 sshare 0.2" in res.output


def test_fairshare_live_and_what_if():
    fake = FakeSlurm.recorded()
    res = run("fairshare", "--add", "biology=1000", "--format", "json", runner=fake)
    doc = json.loads(res.output)
    rows = {(r["account"].strip(), r["user"]): r for r in doc["rows"]}
    assert rows[("biology", "carol")]["fairshare"] == 0.8 and rows[("biology", "carol")]["what_if_fairshare"] < 0.8
    assert doc["differ"] == [] and fake.calls == [("sshare", "-a", "-l", "--parsable2")]


def test_fairshare_gpu_usage_what_if():
    res = run("fairshare", "--sshare-file", SSHARE, "--gpu-usage", "--sacct-file", SACCT, *DAY, "--format", "json")
    rows = {(r["account"].strip(), r["user"]): r for r in json.loads(res.output)["rows"]}
    # in GPU-equivalents dave (3 h) outweighs bob (4/7 h): dave drops to the bottom, bob rises
    assert rows[("biology-imaging", "dave")]["what_if_fairshare"] == 0.2
    assert rows[("physics", "bob")]["what_if_fairshare"] == 0.8


def test_bad_options_are_clear_errors():
    res = CliRunner().invoke(GPUSHARE, ["fairshare", "--sshare-file", SSHARE, "--add", "nope=3"])
    assert res.exit_code == 2 and "account 'nope' is not in the tree" in res.output
    res = CliRunner().invoke(GPUSHARE, ["usage", "--since", "yesterday", "--sacct-file", SACCT])
    assert res.exit_code == 2 and "is not a time" in res.output
    res = CliRunner().invoke(GPUSHARE, ["usage", "--half-life", "0", "--sacct-file", SACCT])
    assert "positive" in res.output


def test_accounts_plan_offline_and_unmanaged():
    res = run(
        "accounts",
        "plan",
        LAB,
        "--assoc-file",
        str(DATA / "sacctmgr-assoc-small-lab.parsable2"),
        "--qos-file",
        str(DATA / "sacctmgr-qos-small-lab.parsable2"),
    )
    lines = res.output.splitlines()
    assert lines[0] == "sacctmgr -i add qos scavenger"  # QOS first: accounts are then given access to them
    assert "sacctmgr -i modify account where name=physics cluster=lab set GrpTRES=gres/gpu=2" in lines
    assert lines[-1] == "# unmanaged (left alone): account old-project"


def test_accounts_apply_converges_and_plan_is_then_empty():
    fake = FakeSlurm.recorded()
    res = run("accounts", "apply", LAB, runner=fake)
    assert res.exit_code == 0, res.output
    assert "applied 12 command(s); slurmdbd matches small-lab.yaml" in res.output
    res = run("accounts", "plan", LAB, runner=fake)
    assert "nothing to do" in res.output


def test_accounts_apply_stops_on_a_failing_command():
    fake = FakeSlurm.recorded()
    real_add = fake._add_qos

    def add_qos_raced(rest):  # someone else adds the QOS between our read and our add
        fake.qos.setdefault(rest[0], ["0", "cluster", "1.000000", ""])
        return real_add(rest)

    fake._add_qos = add_qos_raced
    res = CliRunner().invoke(GPUSHARE, ["accounts", "apply", LAB], obj={"runner": fake})
    assert res.exit_code == 1 and "Nothing new added" in res.output
    assert not any("name=scavenger" in " ".join(c) for c in fake.calls)  # nothing after the failure ran


def test_fairshare_compares_like_with_like_when_raw_usage_moved(tmp_path):
    """Jobs of physics/bob ended after the last PriorityCalcPeriod: RawUsage moved (bob, physics, root by 400000),
    EffectvUsage, LevelFS and FairShare did not. That is a snapshot lag, not a disagreement."""
    text = (DATA / "sshare-small-lab.parsable2").read_text()
    for old, new in (
        ("root|||0.000000|600000|", "root|||0.000000|1000000|"),
        (" physics||60|0.594059|400000|", " physics||60|0.594059|800000|"),
        ("  physics|bob|1|0.500000|100000|", "  physics|bob|1|0.500000|500000|"),
    ):
        assert old in text
        text = text.replace(old, new)
    moved = tmp_path / "sshare.txt"
    moved.write_text(text)
    res = run("fairshare", "--sshare-file", str(moved), "--check")
    assert res.exit_code == 0, res.output
    assert "0 differ by more than 1e-06" in res.output
    assert (
        "RawUsage values moved since slurmctld's last priority calculation" in res.output
        and "--json-sshare" in res.output
    )
    doc = json.loads(run("fairshare", "--sshare-file", str(moved), "--format", "json").stdout)
    assert doc["differ"] == [] and {d["user"] for d in doc["usage_moved_since_calculation"]} >= {"bob"}
    # a real difference is still one: bob's FairShare changed as well
    moved.write_text(text.replace("|0.400000|2.000000|", "|0.200000|2.000000|"))
    res = run("fairshare", "--sshare-file", str(moved), "--check")
    assert res.exit_code == 1 and "physics/bob fairshare: ours 0.4 sshare 0.2" in res.output
