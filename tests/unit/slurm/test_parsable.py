"""The shared parsable2 pieces: field splitting, TRES strings, times and durations."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from slurm_gpushare.slurm.parsable import (
    SlurmParseError,
    fast_time_parser,
    format_tres,
    parse_duration,
    parse_float,
    parse_time,
    parse_tres,
    rows,
)


def test_rows_parsable2_and_parsable_and_blank_lines():
    out = list(rows(["a|b|c\n", "\n", "d||f|\n"], 3))
    assert out == [["a", "b", "c"], ["d", "", "f"]]


def test_rows_wrong_count_names_the_line():
    with pytest.raises(SlurmParseError, match="line 2: 2 fields, expected 3"):
        list(rows(["a|b|c", "a|b"], 3, "sacct"))


def test_parse_tres_counts_and_memory_units():
    tres = parse_tres("billing=3,cpu=2,gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1,mem=1G,node=1")
    assert tres == {"billing": 3, "cpu": 2, "gres/gpu:a100_40g_1g.5gb": 1, "gres/gpu": 1, "mem": 1024.0, "node": 1}
    assert parse_tres("mem=512M,fs/disk=2T")["fs/disk"] == 2 * 1024.0**2
    assert parse_tres("mem=1536K")["mem"] == 1.5
    assert parse_tres("") == {}
    with pytest.raises(SlurmParseError):
        parse_tres("billing")


def test_format_tres_round_trips_counts():
    text = "billing=1,cpu=4,gres/gpu=1,gres/gpu:l40s=1,mem=8192,node=1"
    assert format_tres(parse_tres(text)) == text


@pytest.mark.parametrize("text", ["Unknown", "None", "", "N/A"])
def test_no_time(text):
    assert parse_time(text) is None


def test_epoch_and_iso_times():
    assert parse_time("1740787200") == 1740787200.0
    assert parse_time("2025-03-01T00:00:00", UTC) == 1740787200.0
    assert parse_time("2025-03-01T01:00:00", timezone(timedelta(hours=1))) == 1740787200.0
    with pytest.raises(SlurmParseError, match="not a Slurm time"):
        parse_time("yesterday")


@pytest.mark.parametrize("tz", [UTC, timezone(timedelta(hours=-5)), ZoneInfo("Europe/Berlin")])
def test_fast_parser_matches_exact_one(tz):
    fast = fast_time_parser(tz)
    for text in ("2025-03-30T01:30:00", "2025-03-30T03:30:00", "2024-12-31T23:59:59", "Unknown", "1740787200"):
        assert fast(text) == parse_time(text, tz)


def test_local_fast_parser_is_this_hosts_zone():
    text = "2025-07-01T12:00:00"
    assert fast_time_parser(None)(text) == datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 1800),
        ("01:30", 90),
        ("00:00:02", 2),
        ("02:00:00", 7200),
        ("7-0", 7 * 86400),
        ("1-02", 93600),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("14-00:00:00", 14 * 86400),
    ],
)
def test_durations_as_slurm_reads_them(text, seconds):
    assert parse_duration(text) == seconds


def test_unlimited_duration_and_bad_one():
    assert math.isinf(parse_duration("UNLIMITED"))
    with pytest.raises(SlurmParseError, match="D-H:M:S"):
        parse_duration("a week")


def test_parse_float_inf_and_unset():
    assert parse_float("inf") == math.inf and parse_float("") is None and parse_float("0.500000") == 0.5
