"""Text a user chooses, on real Slurm: held jobs with hostile names, comments, extra and work directories.

An ordinary user (bob, physics) submits held jobs whose ``--job-name``, ``--comment``, ``--extra`` and
``--chdir`` (a directory of that name, made by bob) hold newlines, carriage returns, tabs, ``|``, ``,``,
``=``, quotes, long text (as long as sbatch takes) and whole forged records in the line formats the readers used to
split on: a
job summary claiming alice runs job 999 on lab-excl01 holding 4 L40S, an ``squeue -o '%A %b'`` line and a
``sacct -P`` usage line saying the same. Then every reader is run again and compared with its answer
before the held jobs existed, alice's two running jobs unchanged: the client's jobs and job summaries (host
side, through docker exec), the exporter's families (the collect path: ``SlurmCollector.scrape``), the live
planner's view, and inside slurmctld ``gpushare exporter --once``, ``gpushare slurm dump`` (jobs, job
summaries, usage), ``gpushare usage``, ``gpushare fairshare`` and ``gpushare live report``. The held jobs show
no allocation, no job 999 appears, alice holds what she held, no part of the metrics goes down and no record
is skipped. (Bytes that are not UTF-8 cannot pass docker exec's argv; tests/unit/slurm/test_hostile_text.py
covers them.)
"""

from __future__ import annotations

import json
import time

import pytest

from slurm_gpushare.live.view import view_from_client
from slurm_gpushare.metrics.exporter import SlurmCollector
from slurm_gpushare.policy import load_file
from tests.cluster.conftest import POLICY, wait_for

USER, ACCOUNT = "bob", "physics"
FAIRSHARE = "gpushare_fairshare_"  # moves whenever slurmctld's decay thread runs (alice's jobs run): not compared
VICTIM = "alice"
ALLOC = "cpu=1,mem=2000M,node=1,billing=400,gres/gpu=4,gres/gpu:l40s=4"
FORGED = (
    "999|999|N/A|RUNNING|None|alice|physics|batch|batch|gres/gpu:l40s:4|1796288833|lab-excl01|" + ALLOC + "|x",
    "999 gres/gpu:l40s:4",
    "999|alice|physics|batch|COMPLETED|1796288833|1796290000||1167|" + ALLOC + "|" + ALLOC + "|normal",
)


def hostile(tag: str, size: int = 0) -> str:
    body = "".join(f"\n{line}\n" for line in FORGED)
    return f"{tag}\r\t|,=\"'\\ {body}{'A' * size}end"


# Slurm refuses longer text here (a 20 kB name: "Pathname of a file, directory or other parameter too long", 24.11.5)
NAMES = {"job-name": hostile("name", 400), "comment": hostile("comment"), "extra": hostile("extra")}
# a directory bob makes: no '/' in one name, and at most 255 bytes (NAME_MAX)
DIRECTORY = "/tmp/" + f"dir\r\t|,=\"'\\ \n{FORGED[1]}\n{FORGED[0][:150]}\nend".replace("/", "_")


def _view(client, site, now):
    v = view_from_client(client, site, now)
    return v.pending, v.running, {k: (n.state, n.gres) for k, n in v.nodes.items()}


def _exported(client, site):
    metrics = SlurmCollector(client, site).scrape()
    skip = {
        "gpushare_exporter_scrape_duration_seconds",
        "gpushare_exporter_snapshot_timestamp_seconds",
        "gpushare_exporter_read_duration_seconds",
        "gpushare_exporter_slurm_reads",
    }
    return {
        m.name: sorted((tuple(sorted(s.labels.items())), s.value) for s in m.samples)
        for m in metrics
        if m.name not in skip and not m.name.startswith(FAIRSHARE)
    }


def _gpushare(cluster, *args) -> str:
    return cluster.slurm(["gpushare", *args], timeout=120).stdout


def _jobs(jobs, ignore=()) -> dict:
    return {j.job_id: {**j.to_dict(), "reason": "", "priority": None} for j in jobs if j.job_id not in ignore}


@pytest.fixture(scope="module")
def alice_running(cluster):
    """alice's whole L40S on lab-excl01 and a shard, running (cancelled afterwards)."""
    jobs = [
        cluster.sbatch("sleep 600", user=VICTIM, account="physics", gres="gpu:l40s:1", nodelist="lab-excl01"),
        cluster.sbatch("sleep 600", user=VICTIM, account="physics", gres="shard:1"),
    ]
    wait_for("alice's jobs running", lambda: all(cluster.job(j).get("JobState") == "RUNNING" for j in jobs), 120)
    yield jobs
    cluster.slurm(["scancel", *map(str, jobs)], check=False)


def test_held_jobs_with_hostile_text_change_no_reader(cluster, alice_running):
    site = load_file(POLICY)
    client = cluster.client(timeout=120)
    now = time.time()
    window = _window(cluster)
    before = {
        "jobs": _jobs(client.jobs()),
        "summaries": _jobs(client.job_summaries()),
        "view": _view(client, site, now),
        "exported": _exported(client, site),
        "inside": _inside(cluster, window),
    }
    cluster.exec("slurmctld", ["mkdir", "-p", DIRECTORY], user=USER)
    held = [
        cluster.sbatch(
            "true",
            user=USER,
            account=ACCOUNT,
            hold=True,
            gres="gpu:l40s:1",
            chdir=DIRECTORY,
            output="/dev/null",
            **{k.replace("-", "_"): v for k, v in NAMES.items()},
        )
        for _ in range(2)
    ]
    try:
        client = cluster.client(timeout=120)
        jobs = client.jobs()
        mine = {j.job_id: j for j in jobs if j.job_id in held}
        assert set(mine) == set(held)
        assert all(j.state == "PENDING" and not j.gres_alloc and j.user == USER for j in mine.values())
        assert all(j.name.startswith("name") for j in mine.values()), "--json reads the name (the summaries do not)"
        assert _jobs(jobs, held) == before["jobs"] and 999 not in {j.job_id for j in jobs}
        summaries = client.job_summaries()
        assert {j.job_id for j in summaries} == set(before["summaries"]) | set(held)
        assert all(not j.gres_alloc for j in summaries if j.job_id in held)
        assert _jobs(summaries, held) == before["summaries"]
        assert _view(client, site, now)[1:] == before["view"][1:]  # running jobs and nodes
        exported = _exported(client, site)
        alice = {k: [s for s in v if ("user", VICTIM) in s[0]] for k, v in exported.items()}
        assert alice == {k: [s for s in v if ("user", VICTIM) in s[0]] for k, v in before["exported"].items()}
        assert all(v == 1.0 for _, v in exported["gpushare_exporter_part_up"])
        assert not client.skipped and exported.get("gpushare_exporter_skipped_records", []) == []
        inside = _inside(cluster, window, held)
        assert inside == before["inside"]
    finally:
        cluster.slurm(["scancel", *map(str, held)], check=False)


def _window(cluster) -> tuple[str, str]:
    """A fixed usage window ending now (slurmctld's clock): the same records before and after the held jobs."""
    end = int(cluster.slurm(["date", "+%s"]).stdout.strip())
    fmt = "%Y-%m-%dT%H:%M:%S"
    return time.strftime(fmt, time.localtime(end - 7200)), time.strftime(fmt, time.localtime(end))


def _inside(cluster, window, held=()) -> dict:
    """The CLI inside slurmctld (the installed wheel), the held jobs left out: exporter --once (alice's samples, the
    parts up), slurm dump (jobs, job summaries, usage), usage, fairshare's exit, live report's exit."""
    policy = ("--policy", "/etc/gpushare/policy.yaml")
    out: dict = {}
    text = _gpushare(cluster, "exporter", *policy, "--once")
    out["exporter"] = sorted(
        line
        for line in text.splitlines()
        if (
            ('user="alice"' in line and not line.startswith(FAIRSHARE))
            or "part_up" in line
            or "last_scrape_success" in line
            or "skipped_records" in line
        )
        and not line.startswith("#")
    )
    dump = json.loads(
        _gpushare(
            cluster,
            "slurm",
            "dump",
            "--part",
            "jobs",
            "--part",
            "job-summaries",
            "--part",
            "usage",
            "--since",
            window[0],
            "--until",
            window[1],
        )
    )
    for part in ("jobs", "job-summaries"):
        assert all(j["gres_alloc"] == {} for j in dump[part] if j["job_id"] in held), part
        out[part] = sorted(
            (j["job_id"], j["user"], j["account"], j["state"], json.dumps(j["gres_alloc"], sort_keys=True))
            for j in dump[part]
            if j["job_id"] not in held
        )
    out["usage-records"] = dump["usage"]
    out["usage"] = json.loads(
        _gpushare(
            cluster, "usage", "--by", "user", "--format", "json", "--since", window[0], "--until", window[1], *policy
        )
    )
    for command in (("fairshare", *policy), ("live", "report", *policy, "--json")):
        res = cluster.slurm(["gpushare", *command], timeout=120, check=False)
        out[command[0]] = (res.returncode, "Traceback" in res.stderr)
    return out
