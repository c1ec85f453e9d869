"""The Slurm client's job summaries (``squeue --Format``, for pollers) against ``squeue --json`` of the same
moment, both printed by real Slurm 24.11.5 (tests/data/slurm/recorded-24.11.5/summaries/: running whole-GPU,
MIG, shard and MPS jobs, a job running on two nodes, held arrays with a '|' in their name, a job without GRES,
pending jobs). The cluster tier compares the two reads live on 24.11 and 26.05 (test_slurm_client.py).

The recording was made with '|' after each field and the job name last; the client now asks for a delimiter no job
knows after every field and no name (``recorded``: the recording in that form)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_gpushare.proc import Result
from slurm_gpushare.slurm import commands
from slurm_gpushare.slurm.cli_backend import CliClient, SlurmClientError, job_from_json, job_from_summary
from slurm_gpushare.slurm.model import GresUse
from tests.unit.slurm_fakes import squeue_summaries, summaries_delimiter

REC = Path(__file__).resolve().parents[2] / "data" / "slurm" / "recorded-24.11.5" / "summaries"


N = len(commands.JOB_SUMMARY_FIELDS)


def without_indexes(job):
    alloc = {n: {k: GresUse(u.count, None) for k, u in use.items()} for n, use in job.gres_alloc.items()}
    return dataclasses.replace(job, gres_alloc=alloc, end_time=None, priority=None, name="")  # summaries read none


def recorded_fields() -> list[list[str]]:
    """The recorded summaries' fields, the name (last, after the 13th '|') left out."""
    return [line.split("|", N)[:N] for line in (REC / "squeue-summaries.txt").read_text().splitlines()]


def recorded(delim: str) -> str:
    return "".join("".join(f + delim for f in fields) + "\n" for fields in recorded_fields())


def runner(calls):
    def run(argv, **kw):
        calls.append((tuple(argv), kw.get("env")))
        delim = summaries_delimiter(argv)
        if delim is not None:
            return Result(tuple(argv), 0, recorded(delim), "")
        assert list(argv) == commands.jobs_json([12])
        return Result(tuple(argv), 0, (REC / "squeue-job-12.json").read_text(), "")

    return run


def test_summaries_are_the_json_jobs_without_device_indexes():
    import json

    calls = []
    summaries = {j.job_id: j for j in CliClient(runner(calls)).job_summaries()}
    full = [without_indexes(job_from_json(d)) for d in json.loads((REC / "squeue.json").read_text())["jobs"]]
    assert {k: without_indexes(j) for k, j in summaries.items()} == {j.job_id: j for j in full}
    # the one job on two nodes was read again with --json (squeue --Format prints only its total); its per-node
    # GRES are the JSON's, indexes included
    delim = summaries_delimiter(calls[0][0])
    assert [c[0] for c in calls] == [tuple(commands.job_summaries(delim)), tuple(commands.jobs_json([12]))]
    assert summaries[12].gres_alloc["lab-mig01"]["gpu:a100_40g_1g.5gb"].indexes is not None
    assert calls[0][1]["SLURM_TIME_FORMAT"] == "%s"


def test_summary_fields_by_hand():
    jobs = {j.job_id: j for j, _ in map(job_from_summary, recorded_fields())}
    mig, shard, held_array, bare = jobs[9], jobs[10], jobs[13], jobs[14]
    assert mig.gres_alloc == {"lab-mig01": {"gpu:a100_40g_1g.5gb": GresUse(1, None)}}  # typed entry, not gpu=1
    assert shard.gres_alloc == {"lab-shard01": {"shard": GresUse(1, None)}} and shard.gres_request == {"shard": 1}
    assert (held_array.name, held_array.array_job_id, held_array.array_task_id) == ("", 13, None)  # name not read
    assert (held_array.state, held_array.reason, held_array.gres_alloc) == ("PENDING", "JobHeldUser", {})
    assert bare.gres_request == {} and bare.submit_time == 1796301441


def test_reason_description_is_cut_to_the_reason():
    line = (
        "12|12|N/A|PENDING|ReqNodeNotAvail, UnavailableNodes:lab-excl01|dave|bio|batch|batch|gres/gpu:1|"
        "1796301441||cpu=2,mem=4000M,node=2,billing=28,gres/gpu=2"
    )
    job, nodes = job_from_summary(line.split("|"))
    assert (job.reason, nodes) == ("ReqNodeNotAvail", 2)


@pytest.mark.parametrize("line", ["", "12|12|N/A|RUNNING", "x|12|N/A|RUNNING|None|a|b|c|d|e|1|n|t"])
def test_bad_summary_line_names_the_fields(line):
    with pytest.raises(SlurmClientError, match="want 13 fields: JobID, ArrayJobID"):
        job_from_summary(line.split("|"))


def test_the_fake_prints_what_real_squeue_printed():
    """tests/unit/slurm_fakes.squeue_summaries (used where only --json was recorded) against real output."""
    real = sorted(recorded("|").splitlines())
    assert sorted(squeue_summaries((REC / "squeue.json").read_text()).splitlines()) == real
