"""Fair share and GPU accounting on real Slurm: the policy's accounts, a GRES quota, GPU-equivalent usage, Fair Tree.

What runs here, against the cluster's slurmctld/slurmdbd (Slurm 24.11):

- after `gpushare accounts apply` (the session fixture) slurmdbd holds the
  policy's accounts, users and tier QOS, and `accounts plan` has nothing to do;
- a tenant at its GrpTRES gres/gpu quota gets its next job held with
  Reason=AssocGrpGRES;
- a mix of exclusive, MIG, shard and MPS jobs (and a job array and a
  CPU-only job) under several users and accounts, with two extra accounts
  (a FairShare=parent sub-account, a FairShare=parent user, a user with 2
  shares) added with sacctmgr for a richer tree, gives GPU-equivalent hours in
  `gpushare usage` (live sacct inside slurmctld, and recorded files on the
  host) equal to a hand computation from ElapsedRaw and the fractions;
- after the priority calculation has run, `gpushare fairshare --check`
  recomputes every association's LevelFS and FairShare as sshare has them.

Slurm's Fair Tree figures (EffectvUsage, LevelFS, FairShare) are only
recomputed by slurmctld's decay thread, every PriorityCalcPeriod (5 minutes,
the rendered slurm.conf does not set it), while RawUsage grows as soon as a
job ends. The Fair Tree test appends `PriorityCalcPeriod=1` (minutes) to the
live slurm.conf and runs `scontrol reconfigure`; in 24.11 reconfigure
restarts slurmctld, whose decay thread runs once at start, so the figures are
usually fresh at once and at most a minute later. The test waits until the
time slurmctld stores in StateSaveLocation/priority_last_decay_ran is after
the last job ended, and restores slurm.conf afterwards.

With GPUSHARE_RECORD_DIR=DIR every Slurm output the tests look at is also
written to DIR (tests/data/slurm/recorded-24.11.5/ came from that; see its
README.md).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.accounting import fairtree
from slurm_gpushare.cli import main as gpushare_main
from slurm_gpushare.slurm import sacctmgr, sshare
from slurm_gpushare.slurm.sacct import FIELDS

POLICY_IN_CLUSTER = "/etc/gpushare/policy.yaml"
SLURM_CONF = "/etc/slurm/slurm.conf"
LAST_DECAY = "/var/spool/slurm/ctld/priority_last_decay_ran"  # StateSaveLocation of the rendered slurm.conf
FINAL = (
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
)
SACCT_FORMAT = ",".join(FIELDS)


@dataclass(frozen=True)
class Job:
    """One job of the mix, with what it holds in GPU-equivalents, worked out by hand."""

    user: str
    account: str
    gres: str | None
    seconds: int
    gpus: float  # 1g.5gb of an A100-40GB = 1/7, shard = 1/4, mps:N = N/100, a whole GPU = 1
    kind: str  # `gpushare usage --by gpu-kind` name
    partition: str | None = None
    array: str | None = None


MIX = (
    Job("alice", "physics", "gpu:l40s:1", 20, 1.0, "gpu:l40s"),
    Job("bob", "physics", "gpu:a100_40g_1g.5gb:1", 30, 1 / 7, "gpu:a100_40g_1g.5gb"),
    # physics is at its gres/gpu=2 quota while the two above run: this one waits for one of them.
    Job("alice", "physics", "gpu:a100_40g_1g.5gb:1", 10, 1 / 7, "gpu:a100_40g_1g.5gb", partition="scavenger"),
    Job("carol", "biology", "shard:1", 20, 1 / 4, "shard"),
    Job("carol", "biology", "shard:1", 25, 1 / 4, "shard"),
    Job("dave", "biology-imaging", "mps:25", 30, 25 / 100, "mps"),
    Job("dave", "biology-imaging", "gpu:a100_40g_1g.5gb:1", 15, 1 / 7, "gpu:a100_40g_1g.5gb"),
    Job("alice", "chem", "gpu:l40s:1", 15, 1.0, "gpu:l40s"),
    Job("carol", "chem", "shard:1", 10, 1 / 4, "shard", array="0-1"),
    Job("bob", "chem-sim", "mps:50", 20, 50 / 100, "mps"),
    Job("dave", "chem", None, 5, 0.0, "(none)"),
)

# Accounts beyond the policy's, for a tree with every Fair Tree case: a FairShare=parent account
# (chem-sim), a FairShare=parent user (chem/dave), a user with 2 shares (chem/alice).
EXTRA_ASSOCS = (
    (
        "add",
        "account",
        "chem",
        "cluster=lab",
        "parent=root",
        "fairshare=20",
        "description=test_accounting",
        "qos=normal,batch,scavenger",
    ),  # the tier QOS job_submit gives every job
    ("add", "account", "chem-sim", "cluster=lab", "parent=chem", "fairshare=parent", "description=test_accounting"),
    ("add", "user", "alice", "account=chem", "cluster=lab", "fairshare=2"),
    ("add", "user", "carol", "account=chem", "cluster=lab"),
    ("add", "user", "dave", "account=chem", "cluster=lab", "fairshare=parent"),
    ("add", "user", "bob", "account=chem-sim", "cluster=lab"),
)
EXTRA_ACCOUNTS = ("chem-sim", "chem")


# ---- helpers ------------------------------------------------------------------------------------


class Recorder:
    """Slurm output the tests read, kept in a temporary directory (and in $GPUSHARE_RECORD_DIR)."""

    def __init__(self, path: Path):
        self.path = path
        target = os.environ.get("GPUSHARE_RECORD_DIR")
        self.target = Path(target) if target else None

    def save(self, name: str, text: str) -> Path:
        out = self.path / name
        out.write_text(text)
        if self.target is not None:
            self.target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, self.target / name)
        return out


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Recorder:
    return Recorder(tmp_path_factory.mktemp("recorded"))


def utc_now(cluster) -> int:
    return int(cluster.slurm(["date", "+%s"]).stdout.strip())


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def wait_for(what: str, probe, timeout: float, interval: float = 2.0):
    """Call ``probe`` until it returns something true; fail with its last answer."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")


def squeue(cluster) -> list[dict]:
    out = cluster.slurm(["squeue", "-h", "-o", "%i|%u|%a|%T|%r"]).stdout
    return [
        dict(zip(("id", "user", "account", "state", "reason"), ln.split("|"), strict=False))
        for ln in out.splitlines()
        if ln
    ]


def wait_queue_empty(cluster, timeout: float = 300) -> None:
    """No job of another test may run while this file measures usage."""
    wait_for("squeue empty", lambda: not squeue(cluster) or None, timeout)


def sacct_text(cluster, ids, *, fmt: str = SACCT_FORMAT, header: bool = False) -> str:
    argv = ["env", "TZ=UTC", "sacct", "-a", "-X", "-P", "-j", ",".join(map(str, ids)), "-o", fmt]
    return cluster.slurm(argv if header else argv + ["--noheader"]).stdout


def sacct_json(cluster, ids) -> str:
    return cluster.slurm(["env", "TZ=UTC", "sacct", "-a", "-X", "-j", ",".join(map(str, ids)), "--json"]).stdout


def sacct_rows(text: str, fmt: str = SACCT_FORMAT) -> list[dict]:
    names = fmt.split(",")
    return [dict(zip(names, ln.split("|"), strict=False)) for ln in text.splitlines() if ln]


def gpushare_in_cluster(cluster, *args: str, check: bool = True):
    return cluster.slurm(["gpushare", *args], timeout=180, check=check)


def gpushare_here(*args: str):
    return CliRunner().invoke(gpushare_main, list(args), catch_exceptions=False)


def close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


# ---- the policy's accounts ----------------------------------------------------------------------


def test_policy_accounts_users_and_qos_exist(cluster, record):
    assoc_text = cluster.slurm(sacctmgr.assoc_argv("lab")).stdout
    qos_text = cluster.slurm(sacctmgr.qos_argv()).stdout
    record.save("sacctmgr-assoc-policy.parsable2", assoc_text)
    record.save("sacctmgr-qos.parsable2", qos_text)
    assocs = sacctmgr.parse_assocs(io.StringIO(assoc_text))
    accounts = {a.account: a for a in assocs if a.user is None}
    users = {(a.account, a.user) for a in assocs if a.user is not None}
    for tenant in cluster.site.policy.tenants:
        acct = accounts[tenant.name]
        assert (acct.parent, acct.fairshare) == (tenant.parent or "root", tenant.shares), acct
        want_tres = {f"gres/{k}": v for k, v in tenant.quota.model_dump().items() if v is not None}
        assert acct.grp_tres == want_tres, acct
        for user in tenant.users:
            assert (tenant.name, user) in users, f"{tenant.name}/{user} missing in sacctmgr show assoc"
    qos = {q.name: q for q in sacctmgr.parse_qos(io.StringIO(qos_text))}
    for tier in cluster.site.tiers:
        q = qos[tier.name]
        assert q.priority == tier.spec.priority and math.isclose(q.usage_factor, tier.spec.usage_factor), q
        # An unset (or "off") QOS PreemptMode reads back as "cluster".
        mode = tier.spec.preempt_mode.lower()
        assert q.preempt_mode == ("cluster" if mode == "off" else mode), q
    assert qos["batch"].preempt == {"scavenger"} and qos["scavenger"].preempt == frozenset()
    plan = gpushare_in_cluster(cluster, "accounts", "plan", POLICY_IN_CLUSTER).stdout
    assert "sacctmgr" not in plan and "nothing to do" in plan, plan


# ---- a GPU quota ---------------------------------------------------------------------------------


def test_jobs_beyond_the_gpu_quota_are_held_with_assoc_grp_gres(cluster, record):
    wait_queue_empty(cluster)
    physics = next(t for t in cluster.site.policy.tenants if t.name == "physics")
    quota = physics.quota.gpu
    assert quota == 2
    jobs = [
        cluster.sbatch("sleep 300\n", user="alice", account="physics", gres="gpu:1", output="/dev/null")
        for _ in range(quota + 1)
    ]
    try:

        def held():
            q = {int(r["id"]): r for r in squeue(cluster)}
            states = [q.get(j, {}).get("state") for j in jobs]
            ok = states == ["RUNNING"] * quota + ["PENDING"] and q[jobs[-1]]["reason"] == "AssocGrpGRES"
            return q if ok else None

        wait_for("two jobs running and the third held", held, 120)
        # scontrol shows the same reason; sacct's Reason column does not have it (it says None).
        assert cluster.job(jobs[-1])["Reason"] == "AssocGrpGRES"
        fmt = SACCT_FORMAT + ",Reason"
        text = sacct_text(cluster, jobs, fmt=fmt, header=True)
        record.save("sacct-quota-running.parsable2", text)
        record.save("sacct-quota-running.v0.0.42.json", sacct_json(cluster, jobs))
        rows = sacct_rows(text.split("\n", 1)[1], fmt)
        assert [r["State"] for r in rows] == ["RUNNING"] * quota + ["PENDING"], rows
        assert rows[-1]["Start"] == "Unknown" and rows[-1]["AllocTRES"] == ""
    finally:
        cluster.slurm(["scancel", *map(str, jobs)])
    wait_for(
        "quota jobs cancelled",
        lambda: all(r["State"].split()[0] in FINAL for r in sacct_rows(sacct_text(cluster, jobs))) or None,
        120,
    )
    text = sacct_text(cluster, jobs)
    record.save("sacct-quota-cancelled.parsable2", text)
    rows = sacct_rows(text)
    assert all(r["State"].startswith("CANCELLED") for r in rows), rows
    assert rows[-1]["Start"] == "None"  # cancelled while pending: never started
    wait_queue_empty(cluster, timeout=120)


# ---- the job mix -----------------------------------------------------------------------------------


@dataclass
class Mix:
    ids: list[int]
    records: list[dict]
    since: int
    until: int

    def spec(self, rec: dict) -> Job:
        return MIX[self.ids.index(int(rec["JobID"].split("_")[0]))]


def submit_all(cluster, jobs) -> list[int]:
    """One `sbatch --wrap` per job, all in one shell inside slurmctld (docker exec is the slow part)."""
    lines = ["set -e"]
    for job in jobs:
        opts = [f"--account={job.account}", "--output=/dev/null", f"--wrap='sleep {job.seconds}'"]
        opts += [f"--gres={job.gres}"] if job.gres else []
        opts += [f"--partition={job.partition}"] if job.partition else []
        opts += [f"--array={job.array}"] if job.array else []
        lines.append(f"runuser -u {job.user} -- sbatch --parsable {' '.join(opts)}")
    out = cluster.slurm(["bash", "-c", "\n".join(lines)], timeout=180).stdout
    return [int(ln.split(";")[0]) for ln in out.split()]


@pytest.fixture(scope="module")
def mix(cluster, record):
    wait_queue_empty(cluster)
    for argv in EXTRA_ASSOCS:
        cluster.slurm(["sacctmgr", "-i", *argv])
    try:
        since = utc_now(cluster)
        ids = submit_all(cluster, MIX)

        def done():
            recs = sacct_rows(sacct_text(cluster, ids))
            return recs if len(recs) == len(MIX) + 1 and all(r["State"].split()[0] in FINAL for r in recs) else None

        recs = wait_for("the job mix finished", done, 420, interval=3)
        until = max(int(datetime.fromisoformat(r["End"]).replace(tzinfo=UTC).timestamp()) for r in recs) + 2
        wait_for("the clock past the last job", lambda: utc_now(cluster) >= until or None, 30, interval=1)
        m = Mix(ids, recs, since, until)
        _record_mix(cluster, record, m)
        yield m
    finally:
        wait_queue_empty(cluster, timeout=300)
        for account in EXTRA_ACCOUNTS:
            cluster.slurm(["sacctmgr", "-i", "delete", "account", account], check=False)


def _record_mix(cluster, record, m: Mix) -> None:
    record.save("sacct-mix.parsable2", sacct_text(cluster, m.ids))
    record.save("sacct-mix.v0.0.42.json", sacct_json(cluster, m.ids))
    record.save("sacctmgr-assoc.parsable2", cluster.slurm(sacctmgr.assoc_argv("lab")).stdout)
    version = cluster.slurm(["sacct", "--version"]).stdout.split()[-1]
    meta = {
        "slurm": version,
        "cluster": "the dockerized test cluster (docker/), policy etc/small-lab.yaml, TZ=UTC",
        "window": {"since": iso(m.since), "until": iso(m.until)},
        "extra_associations": [" ".join(("sacctmgr", "-i", *a)) for a in EXTRA_ASSOCS],
        "jobs": [{"job_id": i, **asdict(j)} for i, j in zip(m.ids, MIX, strict=False)],
    }
    record.save("recorded.json", json.dumps(meta, indent=2) + "\n")


def test_mix_ran_where_expected(mix):
    for rec in mix.records:
        job = mix.spec(rec)
        assert rec["State"] == "COMPLETED", rec
        assert rec["Account"] == job.account and rec["User"] == job.user, rec
        assert job.seconds <= int(rec["ElapsedRaw"]) <= job.seconds + 60, rec  # 2 cores, other clusters
        if job.gres:
            name = job.gres.rsplit(":", 1)[0]
            assert f"gres/{name}=" in rec["AllocTRES"], rec
        else:
            assert "gres/" not in rec["AllocTRES"], rec
    assert sum(1 for r in mix.records if "_" in r["JobID"]) == 2  # the array's two tasks


def _expected(mix: Mix, key) -> dict[str, tuple[float, int]]:
    """GPU-equivalent hours and job count per group, by hand: ElapsedRaw x the job's fraction."""
    hours: dict[str, float] = defaultdict(float)
    jobs: dict[str, int] = defaultdict(int)
    for rec in mix.records:
        job = mix.spec(rec)
        k = key(job)
        hours[k] += int(rec["ElapsedRaw"]) * job.gpus / 3600
        jobs[k] += 1
    return {k: (hours[k], jobs[k]) for k in hours}


def _assert_usage(report: dict, by: str, want: dict[str, tuple[float, int]]) -> None:
    got = {row[by.replace("-", "_")]: (row["gpu_hours"], row["jobs"]) for row in report["rows"]}
    assert set(got) == set(want), (got, want)
    for k, (hours, n) in want.items():
        assert close(got[k][0], hours) and got[k][1] == n, f"{by} {k}: gpushare {got[k]}, by hand {(hours, n)}"
    assert close(report["total"]["gpu_hours"], sum(h for h, _ in want.values()))
    assert report["total"]["unknown_tres"] == {}


KEYS = {"account": lambda j: j.account, "user": lambda j: j.user, "gpu-kind": lambda j: j.kind}


@pytest.mark.parametrize("by", ["account", "user", "gpu-kind"])
def test_usage_live_in_the_cluster_matches_hand_computation(cluster, mix, by):
    res = gpushare_in_cluster(
        cluster,
        "usage",
        "--by",
        by,
        "--format",
        "json",
        "--since",
        iso(mix.since),
        "--until",
        iso(mix.until),
        "--tz",
        "UTC",
        "--policy",
        POLICY_IN_CLUSTER,
    )
    _assert_usage(json.loads(res.stdout), by, _expected(mix, KEYS[by]))


@pytest.mark.parametrize("name", ["sacct-mix.parsable2", "sacct-mix.v0.0.42.json"])
@pytest.mark.parametrize("by", ["account", "user"])
def test_usage_from_recorded_sacct_matches_hand_computation(cluster, mix, record, name, by):
    res = gpushare_here(
        "usage",
        "--by",
        by,
        "--format",
        "json",
        "--since",
        iso(mix.since),
        "--until",
        iso(mix.until),
        "--tz",
        "UTC",
        "--sacct-file",
        str(record.path / name),
        "--policy",
        str(cluster.policy),
    )
    assert res.exit_code == 0, res.output
    _assert_usage(json.loads(res.output), by, _expected(mix, KEYS[by]))


# ---- Fair Tree ------------------------------------------------------------------------------------


def _reconfigure(cluster, calc_period: str) -> None:
    cluster.scontrol("reconfigure")

    def up():
        res = cluster.slurm(["scontrol", "show", "config"], check=False)
        return res.returncode == 0 and any(
            ln.split("=", 1)[0].strip() == "PriorityCalcPeriod" and ln.split("=", 1)[1].strip() == calc_period
            for ln in res.stdout.splitlines()
            if "=" in ln
        )

    wait_for(f"slurmctld back with PriorityCalcPeriod={calc_period}", up, 120)


@contextmanager
def priority_calc_every_minute(cluster):
    add = f"grep -q '^PriorityCalcPeriod=' {SLURM_CONF} || echo PriorityCalcPeriod=1 >> {SLURM_CONF}"
    cluster.slurm(["bash", "-c", add])
    try:
        _reconfigure(cluster, "00:01:00")
        yield
    finally:
        cluster.slurm(["sed", "-i", "/^PriorityCalcPeriod=1$/d", SLURM_CONF])
        _reconfigure(cluster, "00:05:00")
        cluster.wait_idle(timeout=180)


def last_decay(cluster) -> int:
    """When slurmctld's decay thread last ran (the file's first 8 bytes: pack_time, big-endian)."""
    out = cluster.slurm(["od", "-An", "-tx1", "-N8", LAST_DECAY], check=False).stdout
    return int("".join(out.split()) or "0", 16)


@pytest.fixture(scope="module")
def shares(cluster, mix, record):
    """sshare as text and JSON, recorded once the Fair Tree figures include every job of the mix."""
    with priority_calc_every_minute(cluster):
        wait_for("a priority calculation after the mix", lambda: last_decay(cluster) >= mix.until or None, 150)
        text = cluster.slurm(["sshare", "-a", "-l", "--parsable2"]).stdout
        doc = cluster.slurm(["sshare", "-a", "-l", "--json"]).stdout
        live = {
            flag: gpushare_in_cluster(cluster, "fairshare", "--check", "--format", "json", *flag, check=False)
            for flag in ((), ("--json-sshare",))
        }
    return {
        "text": record.save("sshare.parsable2", text),
        "json": record.save("sshare.v0.0.42.json", doc),
        "live": live,
    }


def test_usage_reached_sshare(shares, mix):
    rows = {r.key: r for r in sshare.read(shares["json"])}
    for rec in mix.records:
        job = mix.spec(rec)
        if job.gres:
            row = rows[(job.account, job.user)]
            assert row.raw_usage > 0 and row.effective_usage > 0, row
    assert rows[("biology-imaging", "")].level_fs not in (None, 0.0, math.inf)


@pytest.mark.parametrize("flag", [(), ("--json-sshare",)], ids=["parsable2", "json"])
def test_fairshare_check_live_in_the_cluster(shares, flag):
    res = shares["live"][flag]
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["differ"] == [] and report["compared"] > 40, report


@pytest.mark.parametrize("kind", ["text", "json"])
def test_fairshare_check_on_recorded_sshare(shares, kind):
    res = gpushare_here("fairshare", "--check", "--format", "json", "--sshare-file", str(shares[kind]))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["differ"] == []


@pytest.mark.parametrize("kind", ["text", "json"])
def test_level_fs_and_fairshare_equal_sshare_for_every_association(shares, kind):
    rows = sshare.read(shares[kind])
    root = fairtree.tree_from_sshare(rows)
    ours = fairtree.compute(root)
    checks = {(c.key, c.field): c for c in fairtree.check_against(rows, root, ours)}
    keys = {r.key for r in rows}
    assert {("biology-imaging", ""), ("biology-imaging", "dave"), ("chem-sim", ""), ("chem", "dave")} <= keys
    for row in rows:
        if row.parent is None:
            continue
        mine = ours[row.key]
        if row.user is not None:
            if kind == "json":
                # FairShare is rank/N: the ranks agree exactly when the LevelFS do.
                assert abs(mine.fairshare - row.fairshare) <= 1e-6, (row, mine)
            else:
                # From integer RawUsage, siblings with nearly equal LevelFS can rank either way.
                assert checks[(row.key, "fairshare")].ok, checks[(row.key, "fairshare")]
        if row.level_fs is None:
            assert row.shares_parent, row  # only FairShare=parent associations have none
            continue
        if math.isinf(row.level_fs):
            assert math.isinf(mine.level_fs), (row, mine)
        elif kind == "json":
            # --json carries Slurm's own doubles: LevelFS to 1e-6 (relative above 1).
            assert abs(mine.level_fs - row.level_fs) <= 1e-6 * max(1.0, row.level_fs), (row, mine)
        else:
            # sshare -l prints RawUsage as an integer: LevelFS is only known to what that rounding allows.
            check = checks[(row.key, "level_fs")]
            assert check.ok, check


def test_jobs_run_under_their_tier_qos(cluster):
    """job_submit sets the tier's QOS, and the associations may use it: the tier's UsageFactor applies."""
    jobs = {
        part: cluster.sbatch("true\n", user="carol", account="biology", partition=part, output="/dev/null")
        for part in ("batch", "scavenger")
    }
    for part, job in jobs.items():
        assert cluster.wait(job)["State"] == "COMPLETED"
        qos = cluster.slurm(["sacct", "-X", "-n", "-P", "-j", str(job), "-o", "QOS"]).stdout.strip()
        assert qos == part, f"job {job} in {part} ran under QOS {qos!r}"
