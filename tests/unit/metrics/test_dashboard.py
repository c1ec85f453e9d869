"""The shipped Grafana dashboard (slurm_gpushare/metrics/dashboard.json): its shape, datasource and metric names.

Whether every panel query runs and returns series is checked against a real
Prometheus in tests/cluster/test_metrics.py."""

from __future__ import annotations

import json
import re
from importlib import resources

from slurm_gpushare.metrics import collect, textfile

# The node textfile's metric names (metrics/textfile.py, written by the node hooks) and the exporter's own.
NODE_METRICS = {
    "gpushare_node_hook_runs_total",
    "gpushare_node_hook_failures_total",
    "gpushare_node_hook_last_duration_seconds",
    "gpushare_node_mps_daemons_running",
    "gpushare_node_journals_present",
    "gpushare_node_mig_layout_matches_policy",
    "gpushare_node_job_gpu_info",
    "gpushare_node_mig_per_job_slices",
    "gpushare_node_mig_per_job_free",
    "gpushare_node_mig_slice_create_seconds",
    "gpushare_node_mig_slice_refusals_total",
}
# Only a site with per-job MIG GPUs has these (the cluster tier's small lab has none: tests/cluster/test_metrics.py
# leaves the panels that name only these out of its every-query-returns-series check).
PER_JOB_METRICS = {"gpushare_per_job_mig_slices"} | {m for m in NODE_METRICS if "per_job" in m or "mig_slice" in m}
EXPORTER_OWN = {
    "gpushare_exporter_scrape_duration_seconds",
    "gpushare_exporter_scrape_errors_total",
    "gpushare_exporter_last_scrape_success",
}


def dashboard() -> dict:
    return json.loads(resources.files("slurm_gpushare.metrics").joinpath("dashboard.json").read_text())


def panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def controller_metrics() -> set[str]:
    """The exporter's families on the small lab and on a site with per-job MIG GPUs (which adds its own)."""
    from slurm_gpushare.policy import load_file
    from tests.conftest import ROOT

    snap = collect.SlurmRead(jobs=[], nodes=[], shares=[], associations=[], now=0.0)
    out: set[str] = set()
    for policy in (ROOT / "etc" / "small-lab.yaml", ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"):
        sm = collect.SiteMetrics(load_file(policy))
        out |= {f.name + ("_total" if f.type == "counter" else "") for f in collect.families(sm, snap)}
    return out


def node_textfile_metrics() -> set[str]:
    """Every family the node textfile writes (per-job MIG's included), as its # TYPE lines name them."""
    state = textfile.observed(
        textfile.empty_state(),
        textfile.NodeObservation(
            journals_present=0, mps_daemons_running=0, mig={0: True}, mig_slices={0: {"1g.5gb": 0}}, slice_seconds=1
        ),
    )
    return set(re.findall(r"^# TYPE (\S+) ", textfile.render(state), re.M))


def metric_names(expr: str) -> set[str]:
    """The metrics a query names; a histogram's _bucket, _sum and _count series as the histogram."""
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\bgpushare_[a-z_]+", expr)}


def test_datasource_is_a_variable_never_a_fixed_uid():
    d = dashboard()
    var = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert len(var) == 1 and var[0]["query"] == "prometheus"
    name = var[0]["name"]
    text = json.dumps(d)
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - {d["uid"]}
    assert uids == {f"${{{name}}}"}, uids
    for p in panels(d):
        assert p["datasource"]["uid"] == f"${{{name}}}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == f"${{{name}}}", (p["title"], t["refId"])


def test_panels_cover_what_the_issue_asks():
    titles = " | ".join(p["title"].lower() for p in panels(dashboard()))
    for words in (
        "by tenant",
        "free units vs pending",
        "stranded",
        "oldest pending",
        "drained",
        "hook failures",
        "journals",
        "mps",
        "mig layout",
        "per-job mig slices running",
        "held vs free",
        "creation time (p95)",
        "refusals by reason",
    ):
        assert words in titles, (words, titles)
    tenant = next(p for p in panels(dashboard()) if p["title"] == "GPU-equivalents by tenant")
    assert tenant["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


def test_every_panel_has_queries_and_a_layout_that_does_not_overlap():
    seen: set[tuple[int, int]] = set()
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & seen, f"panel {p['title']!r} overlaps another"
        seen |= cells
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_the_node_metrics_named_here_are_the_textfiles():
    assert NODE_METRICS - node_textfile_metrics() == set()
    assert PER_JOB_METRICS - (controller_metrics() | NODE_METRICS) == set() and len(PER_JOB_METRICS) == 5


def test_queries_name_only_metrics_that_exist():
    known = controller_metrics() | NODE_METRICS | EXPORTER_OWN
    assert {"gpushare_gpu_equivalents_allocated", "gpushare_stranded_units", "gpushare_per_job_mig_slices"} <= known
    d = dashboard()
    exprs = [t["expr"] for p in panels(d) for t in p["targets"]]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in metric_names(e)}
    assert used - known == set(), f"dashboard queries name unknown metrics: {sorted(used - known)}"
    # every metric of the contract has a panel (the node_info state count included)
    assert known - used == set(), f"metrics without a panel: {sorted(known - used)}"


def test_a_histogram_is_queried_by_its_buckets_and_a_counter_by_its_rate():
    exprs = {t["expr"] for p in panels(dashboard()) for t in p["targets"]}
    p95 = [e for e in exprs if "gpushare_node_mig_slice_create_seconds" in e]
    assert p95 and all(
        e.startswith("histogram_quantile(0.95,") and "rate(gpushare_node_mig_slice_create_seconds_bucket[" in e
        for e in p95
    ), p95
    refusals = [e for e in exprs if "gpushare_node_mig_slice_refusals_total" in e]
    assert refusals and all("rate(gpushare_node_mig_slice_refusals_total[" in e for e in refusals), refusals
