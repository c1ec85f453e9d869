"""A site's own job_submit.lua chained before or after ours (policy submission.site_lua)."""

from __future__ import annotations

import pytest

from slurm_gpushare.render.jobsubmit import lua_data, render_body
from slurm_gpushare.submit import build_tables
from tests.conftest import ROOT
from tests.lua.harness import VERSIONS, Script
from tests.unit.submit_corpus import site_of

pytestmark = pytest.mark.lua

SITE_LUA = ROOT / "tests" / "unit" / "siteconf" / "site" / "job_submit.lua"
BAD_GPU = {"time_limit": 10, "tres_per_node": "gres/shard:2"}  # refused by ours (multi-slice)


def chained(version: str, order: str, path=SITE_LUA) -> Script:
    site = site_of()
    data = {**lua_data(build_tables(site)), "site_lua": {"path": str(path), "order": order}}
    return Script(version, render_body(site, data))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("order", ["before", "after"])
def test_the_site_rule_still_acts(version, order):
    script = chained(version, order)
    res = script.submit({"tres_per_node": "gres/shard:1"})  # no time limit: the site's rule refuses it
    assert res.rc == -1 and res.user == ["site rule: give your job a time limit (--time)"]
    ok = script.submit({"time_limit": 10, "tres_per_node": "gres/shard:1"})
    assert ok.rc == 0 and ok.job["comment"] == "site-rule-checked"


@pytest.mark.parametrize("version", VERSIONS)
def test_order_decides_who_answers_first(version):
    before = chained(version, "before").submit({"tres_per_node": "gres/shard:2"})
    assert before.user == ["site rule: give your job a time limit (--time)"]
    after = chained(version, "after").submit({"tres_per_node": "gres/shard:2"})
    assert after.rc != 0 and after.user[0].startswith("gpushare rejected")
    # ours refuses first: the site's rule never ran
    assert "comment" not in chained(version, "after").submit(BAD_GPU).job


@pytest.mark.parametrize("version", VERSIONS)
def test_an_error_in_the_site_module_rejects_the_job(version, tmp_path):
    broken = tmp_path / "job_submit_site.lua"
    broken.write_text("function slurm_job_submit(j, p, u) error('boom') end\nreturn slurm.SUCCESS\n")
    res = chained(version, "before", broken).submit({"time_limit": 10})
    assert res.rc == -1 and "site's own job submission rules failed" in res.user[0]
    assert "boom" in res.error[0] and str(broken) in res.error[0]
    # the site module defines no slurm_job_modify: ours alone answers a modify
    assert chained(version, "before", broken).modify({"time_limit": 10}, {}).rc == 0
