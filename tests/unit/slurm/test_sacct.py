"""sacct records: parsable2 and --json (data_parser v0.0.42) read one job at a time, and the live query."""

from __future__ import annotations

import io
import itertools
import json
import types
from datetime import UTC

import pytest

from slurm_gpushare.slurm.parsable import SlurmParseError
from slurm_gpushare.slurm.sacct import (
    FIELDS,
    FileSource,
    JobRecord,
    PyslurmSource,
    SacctSource,
    iter_json_array,
    open_records,
    parse_json,
    parse_parsable2,
    record_from_pyslurm,
    sacct_argv,
)
from tests.unit.slurm_fakes import DATA, FakeJob, FakeSlurm

PARSABLE = DATA / "sacct-small-lab.parsable2"
JSON = DATA / "sacct-small-lab.v0.0.42.json"
T0 = 1740787200  # 2025-03-01T00:00:00Z


def records(path=PARSABLE):
    return list(open_records(path, tz=UTC))


def test_recorded_parsable2_fields():
    recs = {r.job_id: r for r in records()}
    assert len(recs) == 10
    r = recs["1001"]
    assert (r.user, r.account, r.partition, r.state, r.qos) == ("alice", "physics", "batch", "COMPLETED", "normal")
    assert (r.start, r.end, r.elapsed) == (T0 + 3600, T0 + 3 * 3600, 7200)
    assert r.tres()["gres/gpu:l40s"] == 1 and r.tres()["mem"] == 8192
    assert recs["1004"].end is None and recs["1004"].state == "RUNNING"
    assert recs["1006"].start is None and recs["1006"].alloc_tres == ""
    assert recs["1007"].start is None and recs["1007"].state == "CANCELLED by 1003"
    assert "1005_1" in recs


def test_json_carries_the_same_jobs():
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
            r.qos,
        )

    assert [essence(r) for r in records(JSON)] == [essence(r) for r in records(PARSABLE)]


def test_parsers_are_generators_that_stream():
    def lines():
        yield PARSABLE.read_text().splitlines(keepends=True)[0]
        raise AssertionError("read past the first job")

    gen = parse_parsable2(lines(), tz=UTC)
    assert isinstance(gen, types.GeneratorType)
    assert next(gen).job_id == "1001"


class _Counting(io.BytesIO):
    def __init__(self, data):
        super().__init__(data)
        self.high = 0

    def read(self, n=-1):
        out = super().read(n)
        self.high = self.tell()
        return out


def test_json_reads_only_as_far_as_the_job_it_yields():
    data = JSON.read_bytes()
    stream = _Counting(data)
    gen = parse_json(stream, chunk_size=256)
    first = next(gen)
    assert first.job_id == "1001"
    assert stream.high < len(data) / 5


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_json_chunk_boundaries_do_not_matter(chunk):
    whole = [r.job_id for r in parse_json(io.BytesIO(JSON.read_bytes()))]
    assert [r.job_id for r in parse_json(io.BytesIO(JSON.read_bytes()), chunk_size=chunk)] == whole


def test_json_number_split_across_chunks():
    doc = '{"jobs": [{"job_id": 7, "time": {"elapsed": 123456789, "start": 1740787200, "end": 1740790800}}]}'
    for chunk in range(1, 20):
        rec = next(parse_json(io.StringIO(doc), chunk_size=chunk))
        assert rec.elapsed == 123456789 and rec.end == 1740790800.0


def test_json_jobs_anywhere_and_other_members_skipped():
    doc = {
        "warnings": [{"description": "x"}],
        "errors": [],
        "jobs": [{"job_id": 1}, {"job_id": 2}],
        "meta": {"a": [1, 2]},
    }
    assert [j["job_id"] for j in iter_json_array(io.StringIO(json.dumps(doc)), "jobs")] == [1, 2]
    assert list(iter_json_array(io.StringIO('{"jobs": []}'), "jobs")) == []
    assert list(iter_json_array(io.StringIO('{"meta": {}}'), "jobs")) == []


def test_json_older_shapes_and_odd_values():
    job = {
        "job_id": 5,
        "user": "u",
        "account": "a",
        "partition": "p",
        "qos": "normal",
        "state": {"current": "COMPLETED"},
        "array": {"job_id": 0, "task_id": {"set": False, "number": 0}},
        "time": {
            "start": {"set": True, "infinite": False, "number": 100},
            "end": {"set": False, "number": 0},
            "elapsed": 9,
        },
        "tres": {
            "allocated": [{"type": "gres", "name": "gpu:l40s", "count": 1}, {"type": "billing", "name": "", "count": 2}]
        },
    }
    rec = next(parse_json(io.StringIO(json.dumps({"jobs": [job]}))))
    assert (rec.job_id, rec.start, rec.end, rec.state) == ("5", 100.0, None, "COMPLETED")
    assert rec.tres() == {"gres/gpu:l40s": 1, "billing": 2}


@pytest.mark.parametrize("doc", ['{"jobs": [{"job_id": 1}', '{"jobs": [{"job_id": 1}}', "[1, 2]", '{"jobs" [] }'])
def test_bad_json_is_an_error(doc):
    with pytest.raises(SlurmParseError):
        list(parse_json(io.StringIO(doc)))


def test_header_line_and_other_field_orders():
    fields = ("JobID", "Account", "Partition", "Start", "End", "AllocTRES")
    lines = ["JobID|Account|Partition|Start|End|AllocTRES\n", "9|a|batch|1740787200|1740790800|gres/gpu=1\n"]
    (rec,) = parse_parsable2(lines, fields=fields)
    assert (rec.job_id, rec.user, rec.qos, rec.elapsed, rec.end) == ("9", "", "", 0, 1740790800.0)
    with pytest.raises(SlurmParseError, match="must include alloctres"):
        list(parse_parsable2([], fields=("JobID", "Account", "Partition", "Start", "End")))


def test_trailing_delimiter_of_parsable_is_accepted_and_wrong_counts_are_not():
    line = PARSABLE.read_text().splitlines()[0]
    assert next(parse_parsable2([line + "|\n"], tz=UTC)).job_id == "1001"
    with pytest.raises(SlurmParseError, match="line 1"):
        list(parse_parsable2(["1|2|3\n"]))


def test_argv_is_all_users_allocations_in_the_window():
    argv = sacct_argv(T0, T0 + 86400, delim="|x|")
    assert argv[:6] == ["sacct", "-a", "-X", "-p", "--noheader", "--delimiter=|x|"]
    assert argv[-2:] == ["-o", ",".join(FIELDS)]


def test_live_query_asks_day_by_day_and_counts_each_job_once():
    fake = FakeSlurm(
        jobs=[
            FakeJob("1", "alice", "physics", "batch", T0 + 3600, T0 + 2 * 86400, "gres/gpu=1"),  # spans three days
            FakeJob("2", "bob", "physics", "batch", T0 + 86400 + 10, T0 + 86400 + 20, "gres/gpu=1"),
            FakeJob("3", "bob", "physics", "batch", T0 - 3600, T0 + 60, "gres/gpu=1"),  # started before the window
            FakeJob("4", "carol", "biology", "batch", T0 + 2 * 86400 + 5, None, "gres/gpu=1", "RUNNING"),
        ]
    )
    got = list(SacctSource(fake).records(T0, T0 + 3 * 86400))
    assert sorted(r.job_id for r in got) == ["1", "2", "3", "4"]
    assert len(fake.calls) == 3
    assert all(env["SLURM_TIME_FORMAT"] == "%s" for env in fake.envs)
    running = next(r for r in got if r.job_id == "4")
    assert running.end is None and running.start == T0 + 2 * 86400 + 5


def test_file_source_ignores_the_window_for_clipping_downstream():
    recs = list(FileSource(PARSABLE, UTC).records(0, 1))
    assert len(recs) == 10


def test_pyslurm_is_optional_and_imported_lazily():
    import importlib.util

    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("pyslurm is installed here; the live source needs slurmdbd (tests/cluster/test_slurm_client.py)")
    with pytest.raises(ImportError):
        PyslurmSource()


def test_pyslurm_job_as_record():
    """pyslurm.db.Job's attributes (db/job.pyx, 24.11: no TRES); the TRES come from sacct, by job id.
    Run against real pyslurm by tests/cluster/test_slurm_client.py."""
    job = types.SimpleNamespace(
        id=42,
        array_id=None,
        array_task_id=None,
        user_name="alice",
        account="physics",
        partition="batch",
        state="COMPLETED",
        start_time=T0,
        end_time=T0 + 60,
        elapsed_time=60,
        qos="normal",
    )
    rec = record_from_pyslurm(job, {"42": ("billing=1,gres/gpu=1,gres/gpu:l40s=1", "gres/gpu=1")})
    assert rec.tres() == {"gres/gpu:l40s": 1, "gres/gpu": 1, "billing": 1}
    assert (rec.job_id, rec.start, rec.end, rec.req_tres) == ("42", float(T0), float(T0 + 60), "gres/gpu=1")
    task = types.SimpleNamespace(**{**vars(job), "id": 43, "array_id": 40, "array_task_id": 3, "end_time": 0})
    assert (record_from_pyslurm(task).job_id, record_from_pyslurm(task).end) == ("40_3", None)
    # the array's last task keeps the array's job id; sacct still prints it as 40_4, and its TRES join on that
    last = types.SimpleNamespace(**{**vars(job), "id": 40, "array_id": 40, "array_task_id": 4})
    rec = record_from_pyslurm(last, {"40_4": ("billing=1,gres/shard=1", "gres/shard=1")})
    assert (rec.job_id, rec.alloc_tres) == ("40_4", "billing=1,gres/shard=1")
    # task 0: pyslurm reads the 0 as "not set" (u32_parse), so array_task_id is None for a task that ran
    first = types.SimpleNamespace(**{**vars(job), "id": 41, "array_id": 40, "array_task_id": None})
    assert record_from_pyslurm(first).job_id == "40_0"


def test_many_records_stream_in_constant_memory():
    line = PARSABLE.read_text().splitlines(keepends=True)[0]
    gen = parse_parsable2(itertools.repeat(line, 10**9), tz=UTC)
    assert sum(1 for _ in itertools.islice(gen, 50000)) == 50000
