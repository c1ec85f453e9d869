"""GPU-equivalents per job, clipping to a window, Slurm-style decay, and streaming aggregation."""

from __future__ import annotations

import itertools
import math
from datetime import UTC

import pytest

from slurm_gpushare.accounting.usage import (
    GpuConverter,
    UsageAggregator,
    aggregate,
    decay_factor,
    decayed_seconds,
)
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.slurm.sacct import JobRecord, open_records
from tests.conftest import ROOT, minimal_policy
from tests.unit.slurm_fakes import DATA

LAB = load_file(ROOT / "etc" / "small-lab.yaml")
T0 = 1740787200.0
DAY = 86400.0
HOUR = 3600.0


def job(tres, start=T0, end=T0 + HOUR, partition="batch", account="physics", user="alice", qos="normal"):
    elapsed = int(end - start) if start is not None and end is not None else 0
    return JobRecord("1", user, account, partition, "COMPLETED", start, end, elapsed, tres, "", qos)


def gpus(tres, partition="batch", site=LAB):
    return GpuConverter(site).convert(partition, tres)


def test_typed_request_counts_once():
    j = gpus("billing=1,cpu=2,gres/gpu:a100_40g_1g.5gb=1,gres/gpu=1,mem=1G,node=1")
    assert j.gpus == pytest.approx(1 / 7, abs=1e-9)
    assert j.kinds == (("gpu:a100_40g_1g.5gb", pytest.approx(1 / 7, abs=1e-9)),)
    assert j.billing == 1


def test_untyped_gpu_is_a_whole_gpu_where_the_partition_has_several_types():
    j = gpus("gres/gpu=2")
    assert j.gpus == 2.0 and j.kinds == (("gpu", 2.0),)


def test_untyped_gpu_is_the_only_type_where_there_is_one():
    raw = minimal_policy()
    raw["node_groups"][0]["sharing"] = [{"gpus": "0-3", "mode": "mig", "layout": "all-1g.5gb"}]
    site = build_site(raw, "mig-only")
    j = gpus("gres/gpu=1", site=site)
    assert j.kinds == (("gpu:a100_40g_1g.5gb", pytest.approx(1 / 7, abs=1e-9)),)


def test_untyped_remainder_beside_typed_ones():
    j = gpus("gres/gpu:l40s=1,gres/gpu=3")
    assert dict(j.kinds) == {"gpu:l40s": 1.0, "gpu": 2.0}


def test_shards_and_mps_units():
    assert gpus("gres/shard=2").gpus == 0.5  # 4 replicas
    assert gpus("gres/mps=25").gpus == pytest.approx(0.25)  # 100 units
    assert gpus("gres/shard:l40s=2,gres/shard=2").gpus == 0.5  # a typed shard request counts once too
    assert gpus("gres/shard:l40s=3").gpus == 0.75


def test_unknown_tres_are_reported():
    j = gpus("gres/gpu:h100=1,gres/gpu=1")
    assert j.unknown == ("gres/gpu:h100",) and j.gpus == 1.0
    raw = minimal_policy()  # has shards but no MPS
    j = gpus("gres/mps=10", site=build_site(raw, "t"))
    assert j.unknown == ("gres/mps",) and j.gpus == 0.0


def test_unknown_partition_uses_the_site_wide_fractions():
    assert gpus("gres/gpu:a100_40g_1g.5gb=7,gres/gpu=7", partition="gone").gpus == pytest.approx(1.0, abs=1e-8)


def test_conversion_is_cached_by_shape():
    conv = GpuConverter(LAB)
    assert conv.convert("batch", "gres/gpu=1") is conv.convert("batch", "gres/gpu=1")


def agg(records, since=T0, until=T0 + DAY, **kw):
    return aggregate(LAB, records, since, until, **kw)


def test_jobs_are_clipped_to_the_window():
    a = agg(
        [
            job("gres/gpu=1", T0 - HOUR, T0 + HOUR),
            job("gres/gpu=1", T0 + DAY - HOUR, T0 + DAY + 5 * HOUR),
            job("gres/gpu=1", T0 + 2 * DAY, T0 + 3 * DAY),
            job("gres/gpu=1", T0 + 10 * HOUR, None),
        ]
    )
    assert a.total.gpu_seconds == 2 * HOUR + 14 * HOUR  # two clipped hours, a running job counts to the end
    assert a.total.jobs == 3 and a.outside == 1


def test_jobs_that_never_started_are_outside():
    a = agg([job("", None, None), job("gres/gpu=1", T0, T0)])
    assert a.total.jobs == 0 and a.outside == 2


def test_recorded_day_by_user_and_account():
    recs = list(open_records(DATA / "sacct-small-lab.parsable2", tz=UTC))
    by_user = agg(recs, by="user")
    hours = {k: round(t.gpu_seconds / HOUR, 6) for k, t in by_user.groups.items()}
    # worked out by hand from the records (README): l40s 2h + untyped 2h clipped + a30 1h clipped, ...
    assert hours == {"alice": 5.0, "bob": round(4 / 7, 6), "carol": 0.5, "dave": 3.0}
    assert by_user.total.billing_seconds == 15 * HOUR and by_user.total.jobs == 8 and by_user.outside == 2
    by_account = agg(recs, by="account")
    assert {k: round(t.gpu_seconds / HOUR, 6) for k, t in by_account.groups.items()} == {
        "physics": round(5 + 4 / 7, 6),
        "biology": 0.5,
        "biology-imaging": 3.0,
    }


def test_recorded_day_by_gpu_kind_shares_billing():
    recs = list(open_records(DATA / "sacct-small-lab.v0.0.42.json"))
    a = agg(recs, by="gpu-kind")
    kinds = {k: round(t.gpu_seconds / HOUR, 6) for k, t in a.groups.items()}
    assert kinds == {
        "gpu:l40s": 3.0,
        "gpu:a100_40g_1g.5gb": round(4 / 7, 6),
        "shard": 0.5,
        "mps": 2.0,
        "gpu": 2.0,
        "gpu:a30": 1.0,
        "(none)": 0.0,
    }
    assert sum(t.billing_seconds for t in a.groups.values()) == pytest.approx(a.total.billing_seconds)


def test_grouping_by_partition_and_assoc():
    recs = list(open_records(DATA / "sacct-small-lab.parsable2", tz=UTC))
    assert set(agg(recs, by="partition").groups) == {"batch", "scavenger"}
    assert ("biology-imaging", "dave") in agg(recs, by="assoc").groups
    with pytest.raises(ValueError, match="cannot group by"):
        UsageAggregator(GpuConverter(LAB), T0, T0 + 1, by="node")
    with pytest.raises(ValueError, match="window is empty"):
        UsageAggregator(GpuConverter(LAB), T0, T0)


def test_qos_usage_factor_only_in_fair_share_usage():
    a = agg([job("gres/gpu=1", qos="scavenger"), job("gres/gpu=1", qos="normal")])
    assert a.total.gpu_seconds == 2 * HOUR
    assert a.total.fs_seconds == pytest.approx(1.1 * HOUR)  # scavenger's UsageFactor is 0.1


def test_decay_factor_is_slurms():
    assert decay_factor(604800) == 1 - 0.693 / 604800
    assert decay_factor(0) == 1.0


def test_decay_integral():
    hl = 7 * DAY
    d = decay_factor(hl)
    assert decayed_seconds(0, 100, 100, None) == 100
    # one second used one half-life ago counts ~(1 - 0.693/hl)^hl = e^-0.693 ~ 0.50007
    assert decayed_seconds(0, 1, hl + 1, hl) == pytest.approx(d**hl, rel=1e-5)
    numeric = sum(d ** (5 * DAY - (t + 0.5)) for t in range(0, int(DAY)))
    assert decayed_seconds(0, DAY, 5 * DAY, hl) == pytest.approx(numeric, rel=1e-9)


def test_decay_by_calc_period_matches_period_by_period_accrual():
    hl, p = 7 * DAY, 300.0
    d = decay_factor(hl)
    a, b, at = 1000.0, 1000.0 + 7 * 3600 + 123, 3 * DAY
    pieces = []  # Slurm: each period adds len * D^len at its end, then decays with the rest
    t = a
    while t < b:
        end = min(b, (math.floor(t / p) + 1) * p)
        pieces.append((end - t) * d ** (end - t) * d ** (at - end))
        t = end
    assert decayed_seconds(a, b, at, hl, calc_period=p) == pytest.approx(sum(pieces), rel=1e-12)
    assert decayed_seconds(a, b, at, hl, calc_period=1.0) == pytest.approx(decayed_seconds(a, b, at, hl), rel=1e-5)


def test_decayed_usage_in_the_aggregate():
    a = agg([job("gres/gpu=1", T0, T0 + HOUR)], half_life=7 * DAY)
    assert a.total.fs_seconds == pytest.approx(decayed_seconds(T0, T0 + HOUR, T0 + DAY, 7 * DAY))
    assert a.total.fs_seconds < a.total.gpu_seconds == HOUR


def test_streaming_a_large_input_keeps_one_total_per_group():
    shapes = itertools.cycle([job("gres/gpu=1", user=f"u{i}") for i in range(5)])
    a = agg(itertools.islice(shapes, 100_000), by="user")
    assert len(a.groups) == 5 and a.total.jobs == 100_000
