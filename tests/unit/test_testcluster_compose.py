"""The test cluster's generated compose file and Prometheus scrape configuration (testcluster/compose.py)."""

from __future__ import annotations

import yaml

from slurm_gpushare.policy import load_file
from slurm_gpushare.testcluster.compose import (EXPORTER_PORT, NODE_EXPORTER_PORT, PROMETHEUS_IMAGE, nodes,
                                                nodes_compose, prometheus_config)
from tests.conftest import ROOT

SITE = load_file(ROOT / "etc" / "small-lab.yaml")


def test_prometheus_scrapes_the_controller_exporter_and_every_node_of_the_policy():
    doc = yaml.safe_load(prometheus_config(SITE, "slurmctld"))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["gpushare"]["static_configs"] == [{"targets": [f"slurmctld:{EXPORTER_PORT}"]}]
    node_targets = {c["labels"]["node"]: c["targets"] for c in jobs["node"]["static_configs"]}
    assert node_targets == {n: [f"{n}:{NODE_EXPORTER_PORT}"] for n in nodes(SITE)}
    assert sorted(node_targets) == ["lab-excl01", "lab-mig01", "lab-mps01", "lab-shard01"]


def test_scrape_timeouts_fit_their_intervals():
    # Prometheus refuses a config whose scrape_timeout is longer than its scrape_interval.
    def seconds(v: str) -> float:
        return float(v.rstrip("s"))

    doc = yaml.safe_load(prometheus_config(SITE))
    glob = doc["global"]
    for job in doc["scrape_configs"]:
        interval = seconds(job.get("scrape_interval", glob["scrape_interval"]))
        timeout = seconds(job.get("scrape_timeout", glob["scrape_timeout"]))
        assert timeout <= interval, job["job_name"]


def test_prometheus_service_only_when_asked():
    without = yaml.safe_load(nodes_compose(SITE))["services"]
    assert "prometheus" not in without
    with_ = yaml.safe_load(nodes_compose(SITE, "/tmp/x/prometheus.yml"))["services"]
    prom = with_["prometheus"]
    assert prom["image"] == PROMETHEUS_IMAGE
    assert prom["volumes"] == ["/tmp/x/prometheus.yml:/etc/prometheus/prometheus.yml:ro"]
    assert prom["networks"] == ["cluster"] and "ports" not in prom  # never published on the host
    assert set(with_) - {"prometheus"} == set(without)
