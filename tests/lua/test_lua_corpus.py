"""tests/cases/submit.yaml through the generated job_submit.lua, on Lua 5.1 and 5.4.

For every case the script must reach the Python decision exactly: return
code, violation codes, the user message byte for byte, and the job fields it
leaves behind (partition, rewritten tres_per_*, qos).
"""

from __future__ import annotations

from functools import cache

import pytest

from slurm_gpushare.render.jobsubmit import job_submit_lua
from slurm_gpushare.submit import FIELDS
from tests.lua.harness import ESLURM_INVALID_GRES, VERSIONS, Script, codes_of
from tests.unit.submit_corpus import CASES, IDS, case_job, check_expectations, overrides, python_decision, site_of

pytestmark = pytest.mark.lua


@cache
def _script(version: str, policy: str, submission: tuple, slurm_version: str | None) -> Script:
    return Script(version, job_submit_lua(site_of(policy, submission, slurm_version)))


def script_for(case: dict, version: str) -> Script:
    key = (case.get("policy", "small-lab"), overrides(case), case.get("slurm_version"))
    return _script(version, *key)


def run_case(case: dict, version: str):
    job = case_job(case)
    script = script_for(case, version)
    if "modify" in case:
        return job, script.modify(job, case["modify"])
    return job, script.submit(job)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_lua_agrees_with_python(case, version):
    job, res = run_case(case, version)
    want = python_decision(case)
    assert res.rc == (0 if want.accepted else ESLURM_INVALID_GRES), (res.rc, res.user, res.error)
    assert res.error == []
    assert len(res.user) <= 1
    user = res.user[0] if res.user else None
    assert user == want.user_message
    expected_job = {
        **job,
        **({"partition": want.partition} if want.partition else {}),
        **want.fields,
        **({"qos": want.qos} if want.qos else {}),
        **({"extra": want.extra} if want.extra else {}),
    }
    assert res.job == expected_job
    routed = res.job.get("partition") if res.job.get("partition") != job.get("partition") else None
    rewritten = {k: v for k, v in res.job.items() if k in FIELDS and v != job.get(k)}
    qos = res.job.get("qos") if res.job.get("qos") != job.get("qos") else None
    record = res.job.get("extra") if res.job.get("extra") != job.get("extra") else None
    check_expectations(case, res.rc == 0, codes_of(user), user, routed, rewritten, qos, record)


@pytest.mark.parametrize("version", VERSIONS)
def test_rejections_are_logged_with_their_codes(version):
    rejected = [c for c in CASES if not c["expect"]["accept"]]
    for case in rejected:
        _job, res = run_case(case, version)
        assert any(line.endswith("rejected: " + "; ".join(codes_of(res.user[0]))) for line in res.info), case["id"]
        assert "uid 1000" in res.info[0]
