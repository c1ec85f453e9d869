"""The Slurm client's contract on real Slurm: both backends read the same jobs, nodes, GRES and indexes,
partitions, associations and usage records.

Runs `gpushare slurm dump --slurm-backend cli|pyslurm` inside slurmctld (pyslurm can only run where
slurm.conf is) on one frozen moment of the shared cluster (running GPU, MIG, shard and MPS jobs that
sleep, and held pending ones), and compares the two documents. pyslurm is built into the 24.11 image
only (there is no pyslurm for 26.05): on sid the pyslurm half skips with that reason and the CLI half
still checks the view against what was submitted.

The unit tests' recordings of this moment (tests/data/slurm/recorded-*/ squeue/scontrol --json) are written by
tools/record_slurm_outputs.py, not by a test.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest

from tests.cluster.conftest import unrecorded_ends, wait_for, wait_quiet

RUNNING = {  # what: (sbatch options, the GRES the job's node must show it holding)
    "gpu": ({"gres": "gpu:l40s:1", "nodelist": "lab-excl01"}, "gpu:l40s"),
    # typed: an untyped request means a whole GPU, never a MIG slice (job_submit.lua would make it gpu:l40s:1,
    # which lab-mig01 does not have)
    "mig": ({"gres": "gpu:a100_40g_1g.5gb:1", "nodelist": "lab-mig01"}, "gpu:a100_40g_1g.5gb"),
    "shard": ({"gres": "shard:1", "nodelist": "lab-shard01"}, "shard"),  # a job's shard/mps detail is untyped
    "mps": ({"gres": "mps:25", "nodelist": "lab-mps01"}, "mps"),
}


def client_dump(c, backend: str, since: int) -> dict:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))  # the containers run in UTC
    out = c.slurm(["gpushare", "slurm", "dump", "--slurm-backend", backend, "--since", iso], timeout=120).stdout
    doc = json.loads(out)
    assert doc.pop("backend") == backend
    return doc


def _has_pyslurm(c) -> str | None:
    res = c.slurm(["/opt/gpushare/bin/python3", "-c", "import pyslurm; print(pyslurm.__version__)"], check=False)
    return res.stdout.strip() if res.returncode == 0 else None


@contextmanager
def frozen_moment(cluster):
    """Running GPU jobs of every kind and held pending ones, on a cluster quiet before; taken away afterwards,
    and the cluster quiet again (no node left COMPLETING for the next module). Yields (since, jobs, held).
    tools/record_slurm_outputs.py records Slurm's raw outputs at this same moment."""
    wait_quiet(cluster)
    since = int(cluster.slurm(["date", "+%s"]).stdout) - 60
    # a finished two-task array first: its last task keeps the array's job id, and sacct names it ARRAY_TASK;
    # both backends' usage records must carry it (pyslurm's reader once named it by the bare id and lost its TRES)
    array = cluster.sbatch(
        "sleep 2\n",
        user="alice",
        account="physics",
        output="/dev/null",
        gres="shard:1",
        array="0-1",
        nodelist="lab-shard01",
    )
    wait_for(
        "the array's two tasks to end in slurmdbd",
        lambda: len([r for r in cluster.sacct(array) if r["End"] not in ("", "Unknown")]) == 2,
        timeout=90,
    )
    jobs = {}
    for what, (opts, _) in RUNNING.items():
        jobs[what] = cluster.sbatch("sleep 600\n", user="alice", account="physics", output="/dev/null", **opts)
    held = [
        cluster.sbatch("true\n", user="bob", account="physics", gres="gpu:l40s:1", hold=True, output="/dev/null")
        for _ in range(3)
    ]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        states = {j.job_id: j.state for j in cluster.client().jobs()}
        if all(states.get(j) == "RUNNING" for j in jobs.values()):
            break
        time.sleep(1)
    time.sleep(3)  # let slurmdbd record the starts
    try:
        yield since, jobs, held
    finally:
        cluster.slurm(["scancel", *map(str, [*jobs.values(), *held])], check=False)
        wait_quiet(cluster)


@pytest.fixture(scope="module")
def frozen(cluster):
    with frozen_moment(cluster) as moment:
        yield moment


def test_cli_view_matches_what_was_submitted(cluster, frozen):
    since, jobs, held = frozen
    doc = client_dump(cluster, "cli", since)
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    for what, (opts, key) in RUNNING.items():
        job = by_id[jobs[what]]
        assert job["state"] == "RUNNING", job
        use = job["gres_alloc"][opts["nodelist"]]
        assert key in use, (what, use)
        if what in ("gpu", "mig"):
            assert use[key]["count"] == 1 and len(use[key]["indexes"]) == 1, use
    for j in held:
        assert by_id[j]["state"] == "PENDING" and by_id[j]["gres_request"] == {"gpu:l40s": 1}, by_id[j]
        assert by_id[j]["gres_alloc"] == {}
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["lab-excl01"]["gres"] == {"gpu:l40s": 2}
    assert nodes["lab-excl01"]["gres_alloc"].get("gpu:l40s") == 1
    assert nodes["lab-shard01"]["gres"] == {"gpu:l40s": 1, "shard:l40s": 4}
    assert {p["name"] for p in doc["partitions"]} >= {"batch"}
    accounts = {(a["account"], a["user"]) for a in doc["associations"]}
    assert ("physics", "alice") in accounts
    usage = {int(r["job_id"]) for r in doc["usage"]}
    assert set(jobs.values()) <= usage, (jobs, usage)


def test_both_backends_read_the_same(cluster, frozen):
    since, _, _ = frozen
    version = _has_pyslurm(cluster)
    if version is None:
        pytest.skip(f"no pyslurm in the {cluster.suite} image (built for Slurm 24.11 only: none exists for 26.05)")
    cli = client_dump(cluster, "cli", since)
    py = client_dump(cluster, "pyslurm", since)
    # pyslurm 24.11 does not unpack a job's resource layout (Job.get_resource_layout_per_node() is {} and
    # the deprecated API's cpus_allocated 0 on 24.11.5): a job's per-node GRES and GPU indexes are the CLI
    # backend's alone. Where pyslurm gives them, they must be the CLI's.
    for job in py["jobs"]:
        assert job["gres_alloc"] in ({}, next(j["gres_alloc"] for j in cli["jobs"] if j["job_id"] == job["job_id"]))
    no_alloc = lambda jobs: [{**j, "gres_alloc": None} for j in jobs]  # noqa: E731
    py["jobs"], cli["jobs"] = no_alloc(py["jobs"]), no_alloc(cli["jobs"])
    assert len(cli["usage"]) >= len(RUNNING) + 2
    tasks = [r for r in cli["usage"] if "_" in r["job_id"]]
    assert len(tasks) == 2 and all(any(k.startswith("shard") for k in r["gres"]) for r in tasks), tasks
    for part in ("jobs", "nodes", "partitions", "associations", "usage"):
        assert py[part] == cli[part], f"{part} differ between backends:\ncli:     {cli[part]}\npyslurm: {py[part]}"


def test_job_summaries_are_the_jobs_without_device_indexes(cluster, frozen):
    """squeue --Format (what the exporter polls) against squeue --json, on this Slurm version, same moment."""
    out = cluster.slurm(
        ["gpushare", "slurm", "dump", "--slurm-backend", "cli", "--part", "jobs", "--part", "job-summaries"],
        timeout=120,
    ).stdout
    doc = json.loads(out)

    # the summaries read neither device indexes nor EndTime and Priority (the live planner's, from --json), nor
    # the job's name (text its user chooses: docs/admins/slurm-client.md)
    def strip(jobs):
        return [
            {
                **j,
                "end_time": None,
                "priority": None,
                "name": None,
                "gres_alloc": {
                    n: {k: {**u, "indexes": None} for k, u in use.items()} for n, use in j["gres_alloc"].items()
                },
            }
            for j in jobs
        ]

    assert strip(doc["job-summaries"]) == strip(doc["jobs"])
    running = [j for j in doc["job-summaries"] if j["state"] == "RUNNING"]
    assert len(running) >= len(RUNNING) and all(j["gres_alloc"] for j in running), running


def _usage_window(cluster, frozen) -> tuple[str, str]:
    """From a day back to just before the frozen jobs were submitted, once slurmdbd has every earlier end."""
    since, jobs, held = frozen
    wait_for(
        "slurmdbd to store every ended job's end",
        lambda: not unrecorded_ends(cluster, frozenset([*jobs.values(), *held])),
        timeout=60,
    )
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    return stamp(since - 86400), stamp(since)


def test_usage_through_pyslurm_equals_the_cli(cluster, frozen):
    if _has_pyslurm(cluster) is None:
        pytest.skip(f"no pyslurm in the {cluster.suite} image")
    start, end = _usage_window(cluster, frozen)
    args = [
        "gpushare",
        "usage",
        "--since",
        start,
        "--until",
        end,
        "--tz",
        "UTC",
        "--format",
        "json",
        "--policy",
        "/etc/gpushare/policy.yaml",
    ]
    cli = json.loads(cluster.slurm([*args, "--slurm-backend", "cli"], timeout=120).stdout)
    py = json.loads(cluster.slurm([*args, "--slurm-backend", "pyslurm"], timeout=120).stdout)
    assert py == cli


def test_fairshare_through_pyslurm(cluster, frozen):
    if _has_pyslurm(cluster) is None:
        pytest.skip(f"no pyslurm in the {cluster.suite} image")
    _, end = _usage_window(cluster, frozen)
    fs = [
        "gpushare",
        "fairshare",
        "--gpu-usage",
        "--until",
        end,
        "--tz",
        "UTC",
        "--format",
        "json",
        "--policy",
        "/etc/gpushare/policy.yaml",
    ]
    out = cluster.slurm([*fs, "--slurm-backend", "pyslurm"], timeout=120)
    assert json.loads(out.stdout)
