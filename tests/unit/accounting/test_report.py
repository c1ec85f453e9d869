"""Report rows and their three renderings; Jain's index; fairness per level; ours beside sshare's."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from datetime import UTC

import pytest

from slurm_gpushare.accounting import fairtree, report
from slurm_gpushare.accounting.usage import aggregate
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.slurm import sshare
from slurm_gpushare.slurm.sacct import open_records
from tests.conftest import ROOT, minimal_policy
from tests.unit.slurm_fakes import DATA

LAB = load_file(ROOT / "etc" / "small-lab.yaml")
T0 = 1740787200.0


def day_by(by):
    recs = open_records(DATA / "sacct-small-lab.parsable2", tz=UTC)
    return aggregate(LAB, recs, T0, T0 + 86400, by=by)


def test_jain():
    assert report.jain([1, 1, 1]) == pytest.approx(1.0)
    assert report.jain([3, 0, 0]) == pytest.approx(1 / 3)
    assert report.jain([1, 2]) == pytest.approx(0.9)
    assert report.jain([]) is None and report.jain([0, 0]) is None


def test_usage_rows_sorted_with_shares_of_the_total():
    cols, rows, total = report.usage_rows(day_by("account"))
    assert [r["account"] for r in rows] == ["physics", "biology-imaging", "biology"]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert total["jobs"] == 8 and total["outside_window"] == 2
    assert [c.key for c in cols] == ["account", "gpu_hours", "billing_hours", "jobs", "share"]


@pytest.mark.parametrize("fmt", report.FORMATS)
def test_the_three_formats_carry_the_same_rows(fmt):
    cols, rows, total = report.usage_rows(day_by("user"))
    text = report.render(cols, rows, fmt, extra={"total": total})
    if fmt == "json":
        doc = json.loads(text)
        assert doc["rows"][0]["user"] == "alice" and doc["rows"][0]["gpu_hours"] == 5.0
        assert doc["total"]["jobs"] == 8
    elif fmt == "csv":
        got = list(csv.DictReader(io.StringIO(text)))
        assert got[0]["user"] == "alice" and float(got[0]["gpu_hours"]) == 5.0
    else:
        lines = text.splitlines()
        assert lines[0].split() == ["user", "GPU-eq", "h", "billing", "h", "jobs", "share"]
        assert lines[1].split() == ["alice", "5.00", "5.00", "3", "55.1%"]


def test_json_writes_infinity_as_text():
    text = report.render([report.Column("x", "x", "float")], [{"x": math.inf}], "json")
    assert json.loads(text)["rows"] == [{"x": "inf"}]
    with pytest.raises(ValueError, match="unknown format"):
        report.render([], [], "xml")


def test_fairness_per_level():
    cols, rows, index = report.fairness_rows(
        LAB, {"physics": 6 * 3600, "biology": 1 * 3600, "biology-imaging": 3 * 3600}
    )
    r = {x["tenant"]: x for x in rows}
    assert r["physics"]["level_usage"] == pytest.approx(0.6) and r["physics"]["ratio"] == pytest.approx(1.0)
    assert r["biology"]["gpu_hours"] == pytest.approx(4.0)  # its own plus biology-imaging's
    assert r["biology-imaging"]["level"] == "biology" and r["biology-imaging"]["global_share"] == pytest.approx(0.4)
    assert index["root"] == pytest.approx(1.0)  # exactly 60:40 against shares 60:40


def test_fairness_with_a_parent_tenant_and_no_use():
    raw = minimal_policy()
    raw["tenants"] = [
        {"name": "a", "shares": 3},
        {"name": "b", "shares": "parent"},
        {"name": "c", "shares": 1, "parent": "b"},
    ]
    site = build_site(raw, "t")
    _, rows, index = report.fairness_rows(site, {"a": 3600.0, "c": 3600.0})
    r = {x["tenant"]: x for x in rows}
    assert r["c"]["level"] == "root" and r["c"]["level_share"] == pytest.approx(0.25)  # lifted beside a
    assert r["b"]["ratio"] is None and r["b"]["level_share"] is None
    assert r["c"]["ratio"] == pytest.approx(2.0) and r["a"]["ratio"] == pytest.approx(0.5 / 0.75)
    _, _, none = report.fairness_rows(site, {})
    assert none["root"] is None


def test_fairshare_rows_flag_differences():
    rows = sshare.read(DATA / "sshare-small-lab.parsable2")
    bad = [dataclasses.replace(r, fairshare=0.5) if r.key == ("physics", "bob") else r for r in rows]
    root = fairtree.tree_from_sshare(bad)
    ours = fairtree.compute(root)
    checks = fairtree.check_against(bad, root, ours)
    cols, table = report.fairshare_rows(root, ours, checks, theirs={r.key: r for r in bad})
    by_user = {(t["account"].strip(), t["user"]): t for t in table}
    assert by_user[("physics", "bob")]["mismatch"] == "fairshare"
    assert by_user[("physics", "alice")]["mismatch"] == ""
    assert by_user[("root", "")]["level_fs"] is None and by_user[("root", "")]["shares"] == ""
    text = report.render(cols, table, "table")
    assert "  biology-imaging" in text and "fairshare" in text
