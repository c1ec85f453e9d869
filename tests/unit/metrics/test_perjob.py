"""Per-job MIG in the controller exporter (metrics/collect.py): a running job's carrier shards are the slice of its
profile, counted as a fixed slice of that profile (kind mig); gpushare_per_job_mig_slices counts them per node and
profile. And every family the exporter and the node textfile write is listed in docs/reference/metrics.md."""

from __future__ import annotations

import re

import pytest

from slurm_gpushare.metrics import collect
from slurm_gpushare.policy import load_file
from slurm_gpushare.policy.billing import carried_slices
from slurm_gpushare.slurm.model import GresUse
from tests.conftest import ROOT
from tests.unit.metrics.test_dashboard import node_textfile_metrics
from tests.unit.metrics.test_exporter import _job, _node

SITE = load_file(ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml")
PROFILES = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")  # weights 2, 4, 7, 8, 14 of 15


def snapshot() -> collect.SlurmRead:
    jobs = [
        _job(1, "RUNNING", {"shard": 4}, gres_alloc={"lab-perjob01": {"shard": GresUse(4)}}, partition="perjob"),
        _job(2, "RUNNING", {"shard": 4}, gres_alloc={"lab-perjob01": {"shard": GresUse(4)}}, partition="perjob"),
        _job(3, "RUNNING", {"shard": 14}, nodes="lab-perjob[01-02]", partition="perjob"),  # no per-node detail
        _job(4, "PENDING", {"shard": 7}, partition="perjob", reason="Resources"),
        _job(5, "RUNNING", {"gpu:a100_40g_1g.5gb": 1}, gres_alloc={"lab-mig01": {"gpu:a100_40g_1g.5gb": GresUse(1)}}),
    ]
    perjob = {"gpu:a100_40g": 2, "shard": 30}
    nodes = [
        _node("lab-perjob01", perjob, {"gpu": 2, "gpu:a100_40g": 2, "shard": 22}, partitions=("perjob",)),
        _node("lab-perjob02", perjob, {"gpu": 1, "gpu:a100_40g": 1, "shard": 14}, partitions=("perjob",)),
        _node("lab-mig01", {"gpu:a100_40g_1g.5gb": 7}, {"gpu": 1, "gpu:a100_40g_1g.5gb": 1}),
    ]
    return collect.SlurmRead(jobs, nodes, None, None, 0.0)


def families(site=SITE) -> dict[str, collect.Family]:
    return {f.name: f for f in collect.families(collect.SiteMetrics(site), snapshot())}


def test_running_slices_per_node_and_profile():
    got = families()["gpushare_per_job_mig_slices"].samples
    want = {(n, p): 0.0 for n in ("lab-perjob01", "lab-perjob02") for p in PROFILES}
    want |= {("lab-perjob01", "2g.10gb"): 2.0, ("lab-perjob01", "7g.40gb"): 1.0, ("lab-perjob02", "7g.40gb"): 1.0}
    assert got == want  # the pending job and the fixed slice are not per-job slices


def test_a_per_job_slice_is_allocated_as_the_fixed_slice_of_its_profile():
    got = families()["gpushare_gpu_equivalents_allocated"].samples
    key = ("biology", "carol", "perjob", "mig")
    assert got[(*key, "a100_40g_2g.10gb")] == pytest.approx(2 * 2 / 7)
    assert got[(*key, "a100_40g_7g.40gb")] == pytest.approx(2.0)  # one 7g slice on each of two nodes
    assert got[("biology", "carol", "batch", "mig", "a100_40g_1g.5gb")] == pytest.approx(1 / 7)
    assert not [k for k in got if k[3] == "shard"]


def test_a_site_without_per_job_gpus_has_no_such_family():
    small = load_file(ROOT / "etc" / "small-lab.yaml")
    names = {f.name for f in collect.families(collect.SiteMetrics(small), snapshot())}
    assert "gpushare_per_job_mig_slices" not in names and "gpushare_gpu_equivalents_allocated" in names


def test_the_reference_lists_every_family():
    """docs/reference/metrics.md names each family the exporter computes and each the node textfile writes."""
    doc = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`(gpushare_[a-z_]+)`", doc))
    exporter = {f.name + ("_total" if f.type == "counter" else "") for f in families().values()}
    node = node_textfile_metrics()
    assert exporter - listed == set() and node - listed == set()


def test_a_pending_per_job_slice_is_labelled_as_the_slice_it_asks_for():
    """Job 4 pends on the per-job tier asking 7 carrier shards, the weight of 3g.20gb: it is counted under gpu and
    that profile's type, as a pending fixed 3g.20gb slice is, never as shards."""
    got = families()
    key = ("gpu", "a100_40g_3g.20gb", "Resources")
    assert got["gpushare_jobs_pending"].samples == {key: 1.0}
    slice_type, fraction = carried_slices(SITE.groups)[7]  # billing's: 7 shards carry a 3g.20gb, half an A100
    assert slice_type == "gpu:a100_40g_3g.20gb"
    assert got["gpushare_pending_gpu_equivalents"].samples == {key: pytest.approx(fraction)}
    assert set(got["gpushare_pending_oldest_age_seconds"].samples) <= {("gpu", "a100_40g_3g.20gb")}


def test_pending_shards_of_a_shard_tier_stay_shards():
    shard = _job(6, "PENDING", {"shard": 2}, partition="shared", reason="Priority")
    snap = collect.SlurmRead([shard], None, None, None, 0.0)
    fams = {f.name: f for f in collect.families(collect.SiteMetrics(SITE), snap)}
    assert fams["gpushare_jobs_pending"].samples == {("shard", "", "Priority"): 1.0}
