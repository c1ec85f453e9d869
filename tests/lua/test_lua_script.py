"""The generated job_submit.lua as a whole: loads on both Lua versions, fails closed, degrades safely."""

from __future__ import annotations

import pytest

from slurm_gpushare.render import header_ok
from slurm_gpushare.render.jobsubmit import lua_data, lua_string, render_body, to_lua
from slurm_gpushare.submit import build_tables
from tests.conftest import ROOT
from tests.lua.harness import ESLURM_INVALID_GRES, FAKE_SLURM, VERSIONS, Script, runtime
from tests.unit.submit_corpus import site_of

pytestmark = pytest.mark.lua

EXAMPLES = sorted(p.stem for p in (ROOT / "etc").glob("*.yaml"))
GPU_JOB = {"tres_per_node": "gres/shard:1"}
PLAIN_JOB = {"time_limit": 10}


def broken(version: str, fail_open: bool) -> Script:
    """A script whose policy tables are corrupted (fields is a number), as a bug in a table would be."""
    site = site_of()
    data = {**lua_data(build_tables(site)), "fields": 42, "fail_open": fail_open}
    return Script(version, render_body(site, data))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("job", [GPU_JOB, PLAIN_JOB], ids=["gpu-job", "plain-job"])
def test_internal_error_fails_closed(version, job):
    res = broken(version, fail_open=False).submit(job)
    assert res.rc == -1  # slurm.ERROR: a Lua error would otherwise let the job through
    assert len(res.user) == 1 and "internal error in gpushare's job_submit.lua" in res.user[0]
    assert "fail closed" in res.user[0] and "please tell your cluster admins" in res.user[0]
    assert "internal error in slurm_job_submit" in res.error[0] and "fail closed" in res.error[0]
    assert res.job == job


@pytest.mark.parametrize("version", VERSIONS)
def test_internal_error_in_modify_fails_closed(version):
    res = broken(version, fail_open=False).modify(GPU_JOB, {"partition": "batch"})
    assert res.rc == -1 and "internal error in slurm_job_modify" in res.error[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_internal_error_with_fail_open_logs_and_accepts(version):
    res = broken(version, fail_open=True).submit(GPU_JOB)
    assert res.rc == 0 and res.user == []
    assert "fail_open" in res.error[0] and "internal error in slurm_job_submit" in res.error[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failing_job_desc_accessor_fails_closed(version):
    """slurmctld's job_desc is a userdata whose __index can raise; that too must reject."""
    script = Script(version, render_body(site_of()))
    script.lua.execute(
        "function gpushare_bad_desc() return setmetatable({}, {__index = function(t, k) "
        "error('no field ' .. k) end}) end"
    )
    script.lua.execute("gpushare_test.user, gpushare_test.error = {}, {}")
    rc = script.g.slurm_job_submit(script.g.gpushare_bad_desc(), script.lua.table(), 1000)
    assert rc == -1 and "no field tres_per_node" in list(script.g.gpushare_test.error.values())[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_without_eslurm_invalid_gres_rejects_with_error(version):
    """Slurm before 23.02 exports only a few ESLURM_* constants; slurm.ERROR still rejects."""
    fake = FAKE_SLURM.replace(f"ESLURM_INVALID_GRES = {ESLURM_INVALID_GRES},", "")
    script = Script(version, render_body(site_of()), fake=fake)
    assert script.submit({"tres_per_node": "gres/shard:2"}).rc == -1
    assert script.submit(GPU_JOB).rc == 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("slurm", ["24.11", "26.05"])
def test_every_example_loads_and_passes_a_plain_job(version, example, slurm):
    from slurm_gpushare.policy import load_file
    from slurm_gpushare.render.jobsubmit import job_submit_lua

    text = job_submit_lua(load_file(ROOT / "etc" / f"{example}.yaml", slurm))
    assert header_ok(text, comment="--")
    assert f"for Slurm {slurm}" in text
    script = Script(version, text)
    tables = build_tables(load_file(ROOT / "etc" / f"{example}.yaml", slurm))
    every = ",".join(["normal", *(t.name for t in tables.tiers)])  # job_desc.assoc_qos of a managed association
    res = script.submit({**PLAIN_JOB, "assoc_qos": every})
    if not tables.routes:
        default = tables.default_tier.name
        # only the tier's QOS is set (set_qos if-allowed: the association may use it)
        assert res.rc == 0 and res.user == [] and res.job == {**PLAIN_JOB, "assoc_qos": every, "qos": default}
        # an association without it, or none known: the job keeps its (default) QOS
        for other in ({"assoc_qos": "normal"}, {}):
            res = script.submit({**PLAIN_JOB, **other})
            assert res.rc == 0 and res.user == [] and res.job == {**PLAIN_JOB, **other}
        return
    # a policy with class routes (planned-lab) may route a job without GPUs: as the Python decision does
    from slurm_gpushare.submit import decide

    d = decide(tables, {**PLAIN_JOB, "assoc_qos": every})
    assert res.rc == 0 and res.user == [d.user_message]
    assert res.job == {**PLAIN_JOB, "assoc_qos": every, "qos": d.qos, "partition": d.partition}


@pytest.mark.parametrize("version", VERSIONS)
def test_script_defines_only_the_two_entry_points(version):
    """Everything else is local: no globals that could clash with another plugin's or leak state."""
    lua = runtime(version)
    lua.execute(FAKE_SLURM)
    before = set(lua.globals().keys())
    lua.execute(render_body(site_of()))
    assert set(lua.globals().keys()) - before == {"slurm_job_submit", "slurm_job_modify"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "text", ["plain", 'q"uote', "back\\slash", "new\nline", "tab\tnul\0", "del\x7f", "ünï", "]]", "%s"]
)
def test_lua_string_literals_round_trip(version, text):
    assert runtime(version).eval(lua_string(text)) == text


@pytest.mark.parametrize("version", VERSIONS)
def test_to_lua_tables_read_back(version):
    data = {"a": [1, 2, 3], "": True, "end": {"x y": "z"}, "n": 4294967295, "nested": [{"k": False}]}
    lua = runtime(version)
    t = lua.eval(to_lua(data))
    assert list(t.a.values()) == [1, 2, 3] and t[""] is True and t["end"]["x y"] == "z"
    assert t.n == 4294967295 and t.nested[1].k is False


@pytest.mark.parametrize("version", VERSIONS)
def test_counts_print_as_integers_on_both_versions(version):
    """Lua 5.4 prints floats as '1024.0'; a rewritten count must stay '1024'-style on both."""
    # untyped_gpu names the type an untyped request gets (every GPU here is an MPS GPU: refused by default)
    script = Script(version, render_body(site_of("mps-inference", (("tiers.serve", "{untyped_gpu: l40s}\n"),))))
    res = script.submit({"tres_per_node": "gres/gpu:half:2"})
    assert res.job["tres_per_node"] == "gres/mps:100"
    res = script.submit({"tres_per_node": "gres/gpu:2k"})
    assert res.job["tres_per_node"] == "gres/gpu:l40s:2048"


@pytest.mark.parametrize("version", VERSIONS)
def test_state_does_not_leak_between_calls(version):
    script = Script(version, render_body(site_of("mixed-production")))
    first = script.submit({"tres_per_node": "gres/gpu:h100_3g.40gb:1"})
    second = script.submit({"tres_per_node": "gres/gpu:h100:1"})
    assert first.job["partition"] == "inference" and "partition" not in second.job


TOKENS = [
    "gres/",
    "gres:",
    "gpu",
    "shard",
    "mps",
    "nic",
    ":",
    ":",
    "=",
    ",",
    "l40s",
    "a30",
    "a100_40g_1g.5gb",
    "h100",
    "1",
    "2",
    "0",
    "-1",
    "1k",
    "150",
    "100",
    "cpu=4",
    "small",
    "half",
    "L40S",
    "1g.5gb",
    "$",
    " ",
    "%s",
    "none",
    "99999999999",
    "4194304k",
    "license/x:1",
    "gpu:",
    "shard:",
    "mps:",
    "gres/gpu:",
    "gres/shard:",
    "gres/mps:",
]
PARTITIONS = [None, "batch", "scavenger", "debug", "", "batch,scavenger", "training", "inference", "notebook", "serve"]


TYPES = [
    "l40s",
    "a30",
    "a100_40g_1g.5gb",
    "h100",
    "h100_3g.40gb",
    "h100_reserved",
    "small",
    "half",
    "inference",
    "notebook",
    "quarter",
    "L40S",
    "1g.5gb",
]
COUNTS = ["1", "1", "2", "3", "50", "100", "150", "400", "0", "1k"]


def random_entry(rng) -> str:
    """Mostly well-formed GRES entries (so every rule is reached), sometimes token soup (so the parser is)."""
    if rng.random() < 0.25:
        return "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 5)))
    entry = rng.choice(["gres/", "gres/", "gres:", ""]) + rng.choice(["gpu", "gpu", "gpu", "shard", "mps"])
    if rng.random() < 0.6:
        entry += ":" + rng.choice(TYPES)
    if rng.random() < 0.7:
        entry += rng.choice([":", ":", "="]) + rng.choice(COUNTS)
    return entry


def random_job(rng) -> tuple[dict, dict | None]:
    from slurm_gpushare.submit import FIELDS

    job = {}
    for name in rng.sample(FIELDS, rng.choice([1, 1, 2])):
        job[name] = ",".join(random_entry(rng) for _ in range(rng.choice([1, 1, 2, 3])))
    partition = rng.choice(PARTITIONS)
    if partition is not None:
        job["partition"] = partition
    if rng.random() < 0.2:
        job["qos"] = rng.choice(["", "normal", "batch", "scavenger"])
    modify = {"partition": rng.choice(["batch", "training", "inference", "serve"])} if rng.random() < 0.2 else None
    return job, modify


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_random_requests_get_the_same_answer_from_python_and_lua(version, example):
    """Seeded random request strings: the parser and rules must agree exactly, corner cases included."""
    import random

    from slurm_gpushare.submit import decide

    site = site_of(example)
    tables = build_tables(site)
    script = Script(version, render_body(site))
    rng = random.Random(f"{example}-2024")
    verdicts = set()
    for _ in range(1500):
        job, modify = random_job(rng)
        want = decide(tables, job, modify is not None, (modify or {}).get("partition"))
        res = script.modify(dict(job), modify) if modify else script.submit(dict(job))
        assert res.error == [], (job, res.error)
        assert res.rc == (0 if want.accepted else ESLURM_INVALID_GRES), (job, want, res.user)
        assert (res.user[0] if res.user else None) == want.user_message, job
        assert res.job == {
            **job,
            **({"partition": want.partition} if want.partition else {}),
            **want.fields,
            **({"qos": want.qos} if want.qos else {}),
        }, job
        verdicts.add(want.codes[0].split()[0] if want.codes else ("changed" if want.changes else "ok"))
    assert {"ok", "changed", "BAD_REQUEST", "UNKNOWN_TYPE", "SCOPE", "MIXED"} <= verdicts, verdicts
