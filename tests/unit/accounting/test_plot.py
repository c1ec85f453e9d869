"""Usage over time (accounting/timeline.py) and the --plot charts of gpushare usage / fairness.

The buckets are filled in the same pass as the usage totals, so they must
sum to the figures the table prints; the charts are checked as PNG files
(signature, size, dimensions), and the errors a person meets (no
matplotlib, a bad path, a bad bucket) by their message and exit code.
"""

from __future__ import annotations

import json
import struct
import sys

import pytest

from slurm_gpushare.accounting.timeline import (
    BucketError,
    Timeline,
    bucket_edges,
    choose_bucket,
    label,
    parse_bucket,
)
from slurm_gpushare.accounting.usage import aggregate
from slurm_gpushare.policy import load_file
from slurm_gpushare.slurm.sacct import JobRecord
from tests.conftest import ROOT
from tests.unit.accounting.test_cli import LAB, run
from tests.unit.slurm_fakes import DATA

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is in the test extra")

SITE = load_file(ROOT / "etc" / "small-lab.yaml")
H = 3600.0
T0 = 1740787200.0  # 2025-03-01T00:00:00Z
PNG = b"\x89PNG\r\n\x1a\n"
MIX = str(DATA / "recorded-24.11.5" / "sacct-mix.parsable2")
MIX_WINDOW = ["--since", "2026-12-02T17:36:57", "--until", "2026-12-02T17:37:32", "--tz", "UTC", "--policy", LAB]


def rec(job_id, account, tres, start, end, partition="batch", user="alice"):
    elapsed = int((end or start) - start)
    return JobRecord(job_id, user, account, partition, "COMPLETED", start, end, elapsed, tres, "", "normal")


# Worked by hand, window T0 .. T0+6h in 1 h buckets:
#   1: physics, one L40S (1 GPU-eq) 00:30-02:30          -> 0.5, 1, 0.5 h in buckets 0, 1, 2
#   2: biology, 2 shards of 4 (0.5 GPU-eq) from the day before to 01:00, clipped -> 0.5 h in bucket 0
#   3: biology, mps:50 (0.5 GPU-eq) from 05:30, still running -> 0.25 h in bucket 5
#   4: physics, one 1g.5gb slice (1/7) 03:00-04:00       -> 1/7 h in bucket 3
#   5: physics, CPU only 01:00-02:00                    -> nothing
RECORDS = [
    rec("1", "physics", "billing=100,cpu=1,gres/gpu:l40s=1,gres/gpu=1", T0 + 0.5 * H, T0 + 2.5 * H),
    rec("2", "biology", "billing=50,cpu=1,gres/shard=2", T0 - 24 * H, T0 + 1 * H, user="carol"),
    rec("3", "biology", "billing=25,cpu=1,gres/mps=50", T0 + 5.5 * H, None, user="carol"),
    rec("4", "physics", "billing=14,cpu=1,gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1", T0 + 3 * H, T0 + 4 * H, user="bob"),
    rec("5", "physics", "cpu=4", T0 + 1 * H, T0 + 2 * H, user="bob"),
]


def hours(series):
    return [round(v / H, 9) for v in series]


def test_buckets_of_a_hand_checked_record_set():
    tl = Timeline.over(T0, T0 + 6 * H, 3600)
    agg = aggregate(SITE, RECORDS, T0, T0 + 6 * H, by="account", timeline=tl)
    assert tl.buckets == 6
    assert hours(tl.series["physics"]) == [0.5, 1.0, 0.5, round(1 / 7, 9), 0.0, 0.0]
    assert hours(tl.series["biology"]) == [0.5, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert agg.groups["physics"].gpu_seconds == pytest.approx((2 + 1 / 7) * H)
    for key, totals in agg.groups.items():
        assert tl.total(key) == pytest.approx(totals.gpu_seconds, rel=1e-12)


def test_buckets_by_gpu_kind_sum_to_the_kind_totals():
    tl = Timeline.over(T0, T0 + 6 * H, 1800)
    agg = aggregate(SITE, RECORDS, T0, T0 + 6 * H, by="gpu-kind", timeline=tl)
    assert set(tl.series) == set(agg.groups) == {"gpu:l40s", "shard", "mps", "gpu:a100_40g_1g.5gb", "(none)"}
    assert hours(tl.series["mps"])[-1] == 0.25 and sum(tl.series["(none)"]) == 0
    for key, totals in agg.groups.items():
        assert tl.total(key) == pytest.approx(totals.gpu_seconds, rel=1e-12)


def test_edges_fall_on_whole_buckets_of_the_zone():
    assert bucket_edges(T0 + 1800, T0 + 3 * H + 600, 3600) == (
        T0 + 1800,
        T0 + H,
        T0 + 2 * H,
        T0 + 3 * H,
        T0 + 3 * H + 600,
    )
    assert bucket_edges(T0, T0 + 2 * H, 3600) == (T0, T0 + H, T0 + 2 * H)
    edges = bucket_edges(T0, T0 + 3 * 86400, 86400, utc_offset=3600)  # CET, as Europe/Berlin in March
    assert edges[1] == T0 + 86400 - 3600  # midnight in Berlin, not in UTC
    week = bucket_edges(T0, T0 + 20 * 86400, 7 * 86400)
    assert week[1] == T0 + 2 * 86400  # 2025-03-01 is a Saturday: the next bucket starts on Monday 03-03


def test_auto_buckets_follow_the_window():
    assert choose_bucket(35) == 1
    assert choose_bucket(86400) == 30 * 60
    assert choose_bucket(7 * 86400) == 3 * H
    assert choose_bucket(30 * 86400) == 86400
    assert choose_bucket(3 * 365 * 86400) == 4 * 7 * 86400
    assert [label(b) for b in (1, 90, 900, 3 * H, 86400, 7 * 86400)] == ["1 s", "90 s", "15 min", "3 h", "1 d", "1 w"]


def test_bucket_options_and_their_errors():
    assert parse_bucket("auto") is None and parse_bucket("15m") == 900 and parse_bucket("1D") == 86400
    for bad in ("0h", "fortnight", "-1h", "1y"):
        with pytest.raises(BucketError, match="use auto or a positive duration"):
            parse_bucket(bad)
    with pytest.raises(BucketError, match="more than 2,000: use a bucket of at least 6 h"):
        bucket_edges(T0, T0 + 365 * 86400, 60)


def test_a_legend_keeps_the_largest_and_sums_the_rest():
    tl = Timeline.over(T0, T0 + 2 * H, 3600)
    for i, name in enumerate("abcde"):
        tl.add(name, T0, T0 + 2 * H, i + 1.0)
    top = tl.top(list("edcba"), 3)
    assert [n for n, _ in top] == ["e", "d", "(others: 3)"]
    assert hours(top[2][1]) == [6.0, 6.0]  # c + b + a = 3 + 2 + 1 GPUs for an hour each
    assert tl.top(list("ab"), 3) == [("a", tl.series["a"]), ("b", tl.series["b"])]


# ---- the commands ----------------------------------------------------------------------------------


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    return struct.unpack(">II", data[16:24])


def test_usage_plot_is_a_png_and_its_json_timeline_sums_to_the_rows(tmp_path):
    out = tmp_path / "usage.png"
    res = run("usage", *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert f"wrote {out} (usage by account, 35 buckets" in res.output
    assert png_size(out) == (900, 480) and out.stat().st_size > 10_000
    doc = json.loads(run("usage", *MIX_WINDOW, "--sacct-file", MIX, "--format", "json", "--bucket", "10s").output)
    tl = doc["timeline"]
    assert tl["bucket_seconds"] == 10 and tl["edges"][:2] == ["2026-12-02T17:36:57+00:00", "2026-12-02T17:37:00+00:00"]
    assert len(tl["edges"]) == 6 and tl["unit"] == "GPU-equivalent hours"
    for row in doc["rows"]:
        assert sum(tl["series"][row["account"]]) == pytest.approx(row["gpu_hours"], rel=1e-12)
    # physics, 17:37:00-17:37:10: alice's L40S (1 GPU) and bob's 1g.5gb slice (1/7) for the whole 10 s
    assert tl["series"]["physics"][1] == pytest.approx(10 * (1 + 1 / 7) / H)


def test_usage_json_without_plot_or_bucket_is_unchanged():
    doc = json.loads(run("usage", *MIX_WINDOW, "--sacct-file", MIX, "--format", "json").output)
    assert "timeline" not in doc


def test_usage_plot_of_an_empty_window_still_draws(tmp_path):
    out = tmp_path / "empty.png"
    res = run(
        "usage",
        "--since",
        "2020-01-01",
        "--until",
        "2020-01-02",
        "--tz",
        "UTC",
        "--sacct-file",
        MIX,
        "--plot",
        str(out),
        "--format",
        "json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["timeline"]["series"] == {}
    assert f"wrote {out}" in res.stderr and png_size(out) == (900, 480)


def test_fairness_plot_is_a_png(tmp_path):
    out = tmp_path / "fair.png"
    res = run("fairness", *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert f"wrote {out} (3 tenants" in res.output and "use/share" in res.output
    assert png_size(out) == (900, 480) and out.stat().st_size > 10_000


@pytest.mark.parametrize("command", ["usage", "fairness"])
def test_without_matplotlib_plot_names_the_extra(tmp_path, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "x.png"
    res = run(command, *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(out))
    assert res.exit_code == 2
    assert "--plot needs matplotlib" in res.stderr and "pip install 'slurm-gpushare[plot]'" in res.stderr
    assert res.stdout == "" and not out.exists()  # refused before any report was printed
    assert run(command, *MIX_WINDOW, "--sacct-file", MIX).exit_code == 0  # the text report needs no matplotlib


@pytest.mark.parametrize("command", ["usage", "fairness"])
def test_bad_plot_paths_are_named(tmp_path, command):
    res = run(command, *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(tmp_path / "no" / "such" / "u.png"))
    assert res.exit_code == 2
    assert f"directory {tmp_path / 'no' / 'such'} does not exist" in res.stderr and res.stdout == ""
    res = run(command, *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(tmp_path / "u.pdf"))
    assert res.exit_code == 2 and "give a file name ending in .png" in res.stderr
    (tmp_path / "d.png").mkdir()
    res = run(command, *MIX_WINDOW, "--sacct-file", MIX, "--plot", str(tmp_path / "d.png"))
    assert res.exit_code == 2 and "is a directory" in res.output


def test_bad_bucket_is_an_error(tmp_path):
    res = run("usage", *MIX_WINDOW, "--sacct-file", MIX, "--bucket", "1y", "--format", "json")
    assert res.exit_code == 2 and "--bucket: bucket '1y': use auto or a positive duration" in res.stderr
    res = run(
        "usage",
        "--since",
        "2025-01-01",
        "--until",
        "2026-01-01",
        "--tz",
        "UTC",
        "--sacct-file",
        MIX,
        "--bucket",
        "1m",
        "--plot",
        str(tmp_path / "u.png"),
    )
    assert res.exit_code == 2 and "use a bucket of at least 6 h" in res.stderr and not (tmp_path / "u.png").exists()
