"""The Slurm client's job summaries (``squeue --Format``, for pollers) against ``squeue --json`` of the same
moment, both printed by real Slurm 24.11.5 (tests/data/slurm/recorded-24.11.5/summaries/: running whole-GPU,
MIG, shard and MPS jobs, a job running on two nodes, held arrays with a '|' in their name, a job without GRES,
pending jobs). The cluster tier compares the two reads live on 24.11 and 26.05 (test_slurm_client.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_gpushare.proc import Result
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.cli_backend import CliClient, SlurmClientError, job_from_json, job_from_summary
from slurm_gpushare.slurm.model import GresUse
from tests.unit.slurm_fakes import squeue_summaries

REC = Path(__file__).resolve().parents[2] / "data" / "slurm" / "recorded-24.11.5" / "summaries"


def without_indexes(job):
    alloc = {n: {k: GresUse(u.count, None) for k, u in use.items()} for n, use in job.gres_alloc.items()}
    return dataclasses.replace(job, gres_alloc=alloc, end_time=None, priority=None)  # summaries read neither


def runner(calls):
    answers = {tuple(commands.JOB_SUMMARIES): (REC / "squeue-summaries.txt").read_text(),
               tuple(commands.jobs_json([12])): (REC / "squeue-job-12.json").read_text()}

    def run(argv, **kw):
        calls.append((tuple(argv), kw.get("env")))
        return Result(tuple(argv), 0, answers[tuple(argv)], "")

    return run


def test_summaries_are_the_json_jobs_without_device_indexes():
    import json

    calls = []
    summaries = {j.job_id: j for j in CliClient(runner(calls)).job_summaries()}
    full = [without_indexes(job_from_json(d)) for d in json.loads((REC / "squeue.json").read_text())["jobs"]]
    assert {k: without_indexes(j) for k, j in summaries.items()} == {j.job_id: j for j in full}
    # the one job on two nodes was read again with --json (squeue --Format prints only its total); its per-node
    # GRES are the JSON's, indexes included
    assert [c[0] for c in calls] == [tuple(commands.JOB_SUMMARIES), tuple(commands.jobs_json([12]))]
    assert summaries[12].gres_alloc["lab-mig01"]["gpu:a100_40g_1g.5gb"].indexes is not None
    assert calls[0][1]["SLURM_TIME_FORMAT"] == "%s"


def test_summary_fields_by_hand():
    text = (REC / "squeue-summaries.txt").read_text()
    jobs = {j.job_id: j for j, _ in map(job_from_summary, text.splitlines())}
    mig, shard, held_array, bare = jobs[9], jobs[10], jobs[13], jobs[14]
    assert mig.gres_alloc == {"lab-mig01": {"gpu:a100_40g_1g.5gb": GresUse(1, None)}}  # typed entry, not gpu=1
    assert shard.gres_alloc == {"lab-shard01": {"shard": GresUse(1, None)}} and shard.gres_request == {"shard": 1}
    assert (held_array.name, held_array.array_job_id, held_array.array_task_id) == ("we|ird name", 13, None)
    assert (held_array.state, held_array.reason, held_array.gres_alloc) == ("PENDING", "JobHeldUser", {})
    assert bare.gres_request == {} and bare.submit_time == 1796301441
    assert job_from_summary(text.splitlines()[0].replace("|wrap", "|wrap"))[1] in (1, 2)


def test_reason_description_is_cut_to_the_reason():
    line = ("12|12|N/A|PENDING|ReqNodeNotAvail, UnavailableNodes:lab-excl01|dave|bio|batch|batch|gres/gpu:1|"
            "1796301441||cpu=2,mem=4000M,node=2,billing=28,gres/gpu=2|wrap")
    job, nodes = job_from_summary(line)
    assert (job.reason, nodes) == ("ReqNodeNotAvail", 2)


@pytest.mark.parametrize("line", ["", "12|12|N/A|RUNNING", "x|12|N/A|RUNNING|None|a|b|c|d|e|1|n|t|name"])
def test_bad_summary_line_names_the_fields(line):
    with pytest.raises(SlurmClientError, match="want 14 fields: JobID, ArrayJobID"):
        job_from_summary(line)


def test_the_fake_prints_what_real_squeue_printed():
    """tests/unit/slurm_fakes.squeue_summaries (used where only --json was recorded) against real output."""
    real = sorted((REC / "squeue-summaries.txt").read_text().splitlines())
    assert sorted(squeue_summaries((REC / "squeue.json").read_text()).splitlines()) == real
