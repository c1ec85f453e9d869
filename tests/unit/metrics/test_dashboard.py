"""The shipped Grafana dashboard (slurm_gpushare/metrics/dashboard.json): its shape, datasource and metric names.

Whether every panel query runs and returns series is checked against a real
Prometheus in tests/cluster/test_metrics.py."""

from __future__ import annotations

import json
import re
from importlib import resources

from slurm_gpushare.metrics import collect

# The node textfile's metric names (metrics/textfile.py, written by the node hooks) and the exporter's own.
NODE_METRICS = {
    "gpushare_node_hook_runs_total",
    "gpushare_node_hook_failures_total",
    "gpushare_node_hook_last_duration_seconds",
    "gpushare_node_mps_daemons_running",
    "gpushare_node_journals_present",
    "gpushare_node_mig_layout_matches_policy",
    "gpushare_node_job_gpu_info",
}
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
    from slurm_gpushare.policy import load_file
    from tests.conftest import ROOT

    sm = collect.SiteMetrics(load_file(ROOT / "etc" / "small-lab.yaml"))
    snap = collect.SlurmRead(jobs=[], nodes=[], shares=[], associations=[], now=0.0)
    return {f.name + ("_total" if f.type == "counter" else "") for f in collect.families(sm, snap)}


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


def test_queries_name_only_metrics_that_exist():
    known = controller_metrics() | NODE_METRICS | EXPORTER_OWN
    assert {"gpushare_gpu_equivalents_allocated", "gpushare_stranded_units"} <= known
    d = dashboard()
    exprs = [t["expr"] for p in panels(d) for t in p["targets"]]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in re.findall(r"\bgpushare_[a-z_]+", e)}
    assert used - known == set(), f"dashboard queries name unknown metrics: {sorted(used - known)}"
    # every metric of the contract has a panel (the node_info state count included)
    assert known - used == set(), f"metrics without a panel: {sorted(known - used)}"
