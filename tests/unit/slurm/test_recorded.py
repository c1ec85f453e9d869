"""The parsers and the accounting on output recorded from real Slurm 24.11.5 (tests/data/slurm/recorded-24.11.5/).

The files came from tests/cluster/test_accounting.py on the dockerized test
cluster (GPUSHARE_RECORD_DIR); recorded.json lists the jobs that were run,
with the GPU-equivalents each holds, worked out by hand. Unlike the hand-made
samples next to them, nothing here was written by us: what the parsers must
cope with is what Slurm printed.
"""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from slurm_gpushare.accounting import fairtree
from slurm_gpushare.accounting.tenants import Current, plan, unmanaged
from slurm_gpushare.accounting.usage import aggregate
from slurm_gpushare.cli import main as gpushare
from slurm_gpushare.policy import load_file
from slurm_gpushare.slurm import sacctmgr, sshare
from slurm_gpushare.slurm.parsable import parse_tres
from slurm_gpushare.slurm.sacct import FIELDS, JobRecord, open_records
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "slurm" / "recorded-24.11.5"
POLICY = ROOT / "etc" / "small-lab.yaml"
META = json.loads((DATA / "recorded.json").read_text())
SACCT = DATA / "sacct-mix.parsable2"
SACCT_JSON = DATA / "sacct-mix.v0.0.42.json"
SSHARE = DATA / "sshare.parsable2"
SSHARE_JSON = DATA / "sshare.v0.0.42.json"
QUOTA_RUNNING = DATA / "sacct-quota-running.parsable2"
QUOTA_RUNNING_JSON = DATA / "sacct-quota-running.v0.0.42.json"
QUOTA_CANCELLED = DATA / "sacct-quota-cancelled.parsable2"
UTC = UTC


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


SINCE, UNTIL = ts(META["window"]["since"]), ts(META["window"]["until"])
JOBS = {j["job_id"]: j for j in META["jobs"]}


def mix(path=SACCT) -> list[JobRecord]:
    return list(open_records(path, tz=UTC))


def spec(job_id: str) -> dict:
    return JOBS[int(job_id.split("_")[0])]


def essence(r: JobRecord):
    return (
        r.job_id,
        r.user,
        r.account,
        r.partition,
        r.state.split()[0],
        r.start,
        r.end,
        r.elapsed,
        r.tres(),
        parse_tres(r.req_tres),
        r.qos,
    )


# ---- sacct ----------------------------------------------------------------------------------------


def test_recording_is_from_slurm_24_11_5():
    assert META["slurm"] == "24.11.5"
    doc = json.loads(SACCT_JSON.read_text())
    assert doc["meta"]["slurm"]["release"] == "24.11.5"
    assert doc["meta"]["plugin"]["data_parser"] == "data_parser/v0.0.42"
    assert json.loads(SSHARE_JSON.read_text())["meta"]["slurm"]["release"] == "24.11.5"


def test_sacct_parsable2_is_the_jobs_that_were_run():
    recs = mix()
    assert len(recs) == len(JOBS) + 1  # the array's two tasks are two records
    tasks = {f"{j}_{t}" for j, s in JOBS.items() if s["array"] for t in (0, 1)}
    assert {r.job_id for r in recs if "_" in r.job_id} == tasks
    for r in recs:
        job = spec(r.job_id)
        assert (r.user, r.account, r.state, r.qos) == (job["user"], job["account"], "COMPLETED", "normal")
        assert r.partition == (job["partition"] or "batch")
        assert r.end - r.start == r.elapsed >= job["seconds"]
        assert SINCE <= r.start and r.end <= UNTIL


def test_sacct_json_carries_the_same_jobs_as_parsable2():
    assert [essence(r) for r in mix(SACCT_JSON)] == [essence(r) for r in mix(SACCT)]


def test_sacct_json_drops_the_no_val_energy_count():
    # data_parser v0.0.42 lists TRES energy with count -2 (NO_VAL64 as int64); sacct -P does not print it.
    doc = json.loads(SACCT_JSON.read_text())
    assert any(t["type"] == "energy" and t["count"] < 0 for t in doc["jobs"][0]["tres"]["allocated"])
    assert all("energy" not in r.tres() for r in mix(SACCT_JSON))


def test_sacct_tres_shapes_of_each_kind_of_gpu():
    by_gres = {spec(r.job_id)["gres"]: r.tres() for r in mix()}
    # A typed request is recorded twice, typed and untyped; billing is a whole number (100 per whole GPU).
    assert by_gres["gpu:l40s:1"] == {
        "billing": 100,
        "cpu": 1,
        "gres/gpu:l40s": 1,
        "gres/gpu": 1,
        "mem": 2000,
        "node": 1,
    }
    mig = by_gres["gpu:a100_40g_1g.5gb:1"]
    assert mig["gres/gpu:a100_40g_1g.5gb"] == 1 and mig["gres/gpu"] == 1 and mig["billing"] == 14
    # Shards and MPS are recorded untyped only, although the node's Gres= types them (shard:l40s:4, mps:a30:100).
    assert by_gres["shard:1"] == {"billing": 25, "cpu": 1, "gres/shard": 1, "mem": 2000, "node": 1}
    assert by_gres["mps:25"]["gres/mps"] == 25 and by_gres["mps:25"]["billing"] == 12  # 12.5, truncated
    assert by_gres["mps:50"]["gres/mps"] == 50 and by_gres["mps:50"]["billing"] == 25
    assert by_gres[None] == {"cpu": 1, "mem": 2000, "node": 1}  # no billing item at all when it is 0


def test_sacct_running_and_pending_jobs():
    fields = (*FIELDS, "Reason")
    header = QUOTA_RUNNING.read_text().splitlines()[0]
    assert header == "|".join(fields)  # sacct -P without --noheader: the parser skips it
    recs = list(open_records(QUOTA_RUNNING, tz=UTC, fields=fields))
    assert [r.state for r in recs] == ["RUNNING", "RUNNING", "PENDING"]
    assert all(r.end is None for r in recs)  # End=Unknown
    assert recs[2].start is None and recs[2].alloc_tres == "" and recs[2].elapsed == 0
    # An untyped gpu:1 is billed at the untyped weight at submission (ReqTRES) and at the L40S's once placed.
    assert parse_tres(recs[0].req_tres)["billing"] == 14 and recs[0].tres()["billing"] == 100
    assert recs[0].tres()["gres/gpu:l40s"] == 1
    # sacct's Reason column says None for the job squeue/scontrol show held with AssocGrpGRES.
    assert all(line.endswith("|None") for line in QUOTA_RUNNING.read_text().splitlines()[1:])
    js = list(open_records(QUOTA_RUNNING_JSON))
    assert [(r.job_id, r.state, r.end) for r in js] == [(r.job_id, r.state, None) for r in recs]
    assert js[2].start is None and js[2].alloc_tres == ""
    assert [r.tres() for r in js] == [r.tres() for r in recs]


def test_running_job_counts_to_the_window_end_and_pending_not_at_all():
    site = load_file(POLICY)
    recs = list(open_records(QUOTA_RUNNING, tz=UTC, fields=(*FIELDS, "Reason")))
    until = max(r.start for r in recs if r.start) + 100
    agg = aggregate(site, recs, until - 3600, until, by="user")
    assert agg.outside == 1
    assert agg.groups["alice"].gpu_seconds == sum(until - r.start for r in recs if r.start)


def test_sacct_jobs_cancelled_before_they_started():
    recs = list(open_records(QUOTA_CANCELLED, tz=UTC))
    assert [r.state for r in recs] == ["CANCELLED by 0"] * 3
    assert recs[2].start is None and recs[2].end is not None  # Start=None (not Unknown) once cancelled
    assert all(r.end - r.start == r.elapsed for r in recs[:2])


# ---- usage ----------------------------------------------------------------------------------------


def by_hand(key: str) -> dict[str, float]:
    """GPU-equivalent seconds per group from the raw sacct lines and recorded.json's fractions."""
    out: dict[str, float] = defaultdict(float)
    for line in SACCT.read_text().splitlines():
        f = dict(zip(FIELDS, line.split("|"), strict=False))
        job = spec(f["JobID"])
        out[job[key]] += int(f["ElapsedRaw"]) * job["gpus"]
    return dict(out)


@pytest.mark.parametrize("path", [SACCT, SACCT_JSON], ids=["parsable2", "json"])
@pytest.mark.parametrize("by,key", [("account", "account"), ("user", "user"), ("gpu-kind", "kind")])
def test_gpu_equivalents_match_the_hand_computation(path, by, key):
    agg = aggregate(load_file(POLICY), mix(path), SINCE, UNTIL, by=by)
    want = by_hand(key)
    assert set(agg.groups) == set(want)
    for k, seconds in want.items():
        assert math.isclose(agg.groups[k].gpu_seconds, seconds, rel_tol=1e-6, abs_tol=1e-9), k
    assert agg.outside == 0 and not agg.unknown_tres


def test_usage_cli_gives_the_same_numbers_from_both_formats():
    def run(path):
        res = CliRunner().invoke(
            gpushare,
            [
                "usage",
                "--by",
                "account",
                "--format",
                "json",
                "--tz",
                "UTC",
                "--since",
                META["window"]["since"],
                "--until",
                META["window"]["until"],
                "--sacct-file",
                str(path),
                "--policy",
                str(POLICY),
            ],
        )
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    text, js = run(SACCT), run(SACCT_JSON)
    assert text == js
    physics = next(r for r in text["rows"] if r["account"] == "physics")
    assert math.isclose(physics["gpu_hours"] * 3600, by_hand("account")["physics"], rel_tol=1e-6)


# ---- sshare and Fair Tree --------------------------------------------------------------------------


def test_sshare_text_and_json_are_the_same_tree():
    text, js = sshare.read(SSHARE), sshare.read(SSHARE_JSON)
    assert [(r.key, r.parent, r.depth, r.raw_shares, r.shares_parent, r.raw_usage) for r in text] == [
        (r.key, r.parent, r.depth, r.raw_shares, r.shares_parent, r.raw_usage) for r in js
    ]
    for a, b in zip(text, js, strict=False):
        for field in ("norm_shares", "effective_usage", "fairshare"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and (y is None or a.parent is None)) or abs(x - y) <= 5e-7, (a.key, field, x, y)
        if a.parent is None:
            assert a.level_fs is None and b.level_fs is None  # root has none
        elif a.level_fs is None:
            # FairShare=parent: -l prints nothing; --json has a user's inf and an account's unset value.
            assert a.shares_parent and (b.level_fs is None) == (a.user is None), (a, b)
        elif math.isinf(a.level_fs):
            assert math.isinf(b.level_fs)
        else:
            assert abs(a.level_fs - b.level_fs) <= 5e-7 * max(1.0, a.level_fs), (a.key, a.level_fs, b.level_fs)


def test_sshare_rows_as_printed():
    rows = {r.key: r for r in sshare.read(SSHARE)}
    root, root_user = rows[("root", "")], rows[("root", "root")]
    assert root.parent is None and root.raw_shares is None and root.level_fs is None and root.effective_usage == 1.0
    assert root_user.parent == "root" and math.isinf(root_user.level_fs) and root_user.raw_usage == 0
    assert rows[("biology-imaging", "dave")].depth == 3 and rows[("biology-imaging", "")].parent == "biology"
    assert rows[("chem-sim", "")].shares_parent and rows[("chem-sim", "")].level_fs is None
    assert rows[("chem", "dave")].shares_parent and rows[("chem", "dave")].level_fs is None
    # A FairShare=parent association shows its fair-share parent's NormShares.
    assert rows[("chem-sim", "")].norm_shares == rows[("chem", "dave")].norm_shares == rows[("chem", "")].norm_shares
    assert rows[("chem", "alice")].raw_shares == 2
    assert all(r.fairshare is None for r in rows.values() if r.user is None)


def test_fair_tree_from_json_equals_slurmctld_to_1e_6():
    rows = sshare.read(SSHARE_JSON)
    ours = fairtree.compute(fairtree.tree_from_sshare(rows))
    assert sum(1 for r in rows if r.user) == 9
    for row in rows:
        if row.parent is None:
            continue
        mine = ours[row.key]
        if row.user is not None:
            assert abs(mine.fairshare - row.fairshare) <= 1e-6, (row.key, mine.fairshare, row.fairshare)
        if row.level_fs is None:
            assert row.shares_parent and row.user is None
        elif math.isinf(row.level_fs):
            assert math.isinf(mine.level_fs), row.key
        else:
            assert abs(mine.level_fs - row.level_fs) <= 1e-6 * max(1.0, row.level_fs), (row.key, mine.level_fs)


def test_fair_tree_from_integer_raw_usage_ranks_near_ties_either_way():
    """chem/carol and chem-sim/bob both show RawUsage 499 (Slurm's doubles differ in the 5th digit): from
    the text their LevelFS tie, so the check allows their FairShare to differ by the rank they could swap."""
    rows = sshare.read(SSHARE)
    root = fairtree.tree_from_sshare(rows)
    ours = fairtree.compute(root)
    checks = fairtree.check_against(rows, root, ours)
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    fs = {c.key: c for c in checks if c.field == "fairshare"}
    assert fs[("chem", "carol")].diff > 0.1 and fs[("chem", "carol")].allowed > fs[("chem", "carol")].diff
    assert all(c.diff <= 1e-6 for k, c in fs.items() if k not in {("chem", "carol"), ("chem-sim", "bob")})


@pytest.mark.parametrize("path", [SSHARE, SSHARE_JSON], ids=["parsable2", "json"])
def test_fairshare_check_cli_passes_on_recorded_sshare(path):
    res = CliRunner().invoke(gpushare, ["fairshare", "--check", "--format", "json", "--sshare-file", str(path)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["differ"] == [] and report["compared"] >= 49


# ---- sacctmgr --------------------------------------------------------------------------------------


def current(assoc_file: str) -> Current:
    assocs = sacctmgr.parse_assocs(io.StringIO((DATA / assoc_file).read_text()))
    qos = sacctmgr.parse_qos(io.StringIO((DATA / "sacctmgr-qos.parsable2").read_text()))
    return Current.from_rows(assocs, qos)


def test_sacctmgr_rows_as_printed():
    text = (DATA / "sacctmgr-assoc.parsable2").read_text()
    assocs = {(a.account, a.user): a for a in sacctmgr.parse_assocs(io.StringIO(text))}
    assert assocs[("root", None)].parent is None and assocs[("root", None)].fairshare == 1
    assert assocs[("physics", None)].grp_tres == {"gres/gpu": 2} and assocs[("physics", None)].fairshare == 60
    assert assocs[("biology-imaging", None)].parent == "biology"
    assert assocs[("chem-sim", None)].fairshare == "parent" and assocs[("chem", "dave")].fairshare == "parent"
    assert assocs[("physics", "alice")].parent is None  # ParentName is only printed on account rows
    qos = {q.name: q for q in sacctmgr.parse_qos(io.StringIO((DATA / "sacctmgr-qos.parsable2").read_text()))}
    assert (qos["batch"].priority, qos["batch"].preempt_mode, qos["batch"].preempt) == (10, "cluster", {"scavenger"})
    assert (qos["scavenger"].preempt_mode, qos["scavenger"].usage_factor) == ("requeue", 0.1)
    assert qos["normal"].preempt == frozenset()


@pytest.mark.parametrize("assoc_file", ["sacctmgr-assoc-policy.parsable2", "sacctmgr-assoc.parsable2"])
def test_accounts_plan_is_empty_after_apply(assoc_file):
    site = load_file(POLICY)
    now = current(assoc_file)
    assert plan(site, now) == []
    extra = ["account chem", "account chem-sim"] if assoc_file == "sacctmgr-assoc.parsable2" else []
    assert unmanaged(site, now) == extra
