"""The test cluster's generated compose file and Prometheus scrape configuration (testcluster/compose.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import Result
from slurm_gpushare.testcluster.cluster import ClusterError, TestCluster
from slurm_gpushare.testcluster.compose import (
    CGROUP_V1_CONTROLLERS,
    EXPORTER_PORT,
    NODE_EXPORTER_PORT,
    PROMETHEUS_IMAGE,
    nodes,
    nodes_compose,
    prometheus_config,
)
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


# ---- TestCluster.promql: Prometheus's HTTP API through `docker exec <prometheus container> wget` ----------


def _cluster_answering(stdout: str, returncode: int = 0, seen: list | None = None):
    def runner(argv, **_kw):
        if list(argv[:2]) == ["docker", "ps"]:  # the container's id, by compose's labels
            assert "label=com.docker.compose.service=prometheus" in argv, argv
            return Result(tuple(argv), 0, "c0ffee\n", "")
        if seen is not None:
            seen.append(list(argv))
        return Result(tuple(argv), returncode, stdout, "")

    return TestCluster(
        ROOT / "etc" / "small-lab.yaml", project="unit", workdir=Path("/nonexistent"), runner=runner, prometheus=True
    )


def test_promql_asks_prometheus_inside_its_container_and_returns_the_vector():
    seen: list = []
    body = (
        '{"status":"success","data":{"resultType":"vector",'
        '"result":[{"metric":{"tenant":"physics"},"value":[1,"0.5"]}]}}'
    )
    c = _cluster_answering(body, seen=seen)
    assert c.promql('sum by (tenant) (x{a="b c"})', at=12.5) == [{"metric": {"tenant": "physics"}, "value": [1, "0.5"]}]
    argv = seen[0]
    assert argv[:4] == ["docker", "exec", "-i", "c0ffee"]
    url = argv[-1]
    assert url.startswith("http://localhost:9090/api/v1/query?") and "time=12.500" in url
    assert "query=sum+by+%28tenant%29+%28x%7Ba%3D%22b+c%22%7D%29" in url  # URL-encoded


def test_promql_errors_name_the_query_and_prometheus_message():
    c = _cluster_answering('{"status":"error","errorType":"bad_data","error":"parse error"}', returncode=8)
    with pytest.raises(ClusterError, match=r"bad\{.*bad_data: parse error"):
        c.promql("bad{")
    c = _cluster_answering("", returncode=4)
    with pytest.raises(ClusterError, match="no JSON answer .wget exit 4"):
        c.promql("up")


def test_down_removes_the_clusters_cgroup_trees_and_leaves_other_trees_and_busy_dirs(tmp_path):
    from slurm_gpushare.testcluster.cluster import remove_cgroup_trees

    for ctl in ("cpuset", "memory"):
        (tmp_path / ctl / "gpushare-a" / "slurm_lab-mps01" / "uid_2003" / "job_211" / "step_batch").mkdir(parents=True)
        (tmp_path / ctl / "gpushare-b" / "slurm_lab-mps01" / "uid_1" / "job_1").mkdir(parents=True)
    busy = tmp_path / "memory" / "gpushare-a" / "slurm_lab-mps01" / "uid_2003" / "job_211" / "step_batch"
    (busy / "tasks").write_text("123\n")  # a file keeps rmdir from removing it, as a live task does
    left = remove_cgroup_trees(["gpushare-a"], root=tmp_path)
    assert not (tmp_path / "cpuset" / "gpushare-a").exists()
    assert busy.is_dir() and busy in left
    assert (tmp_path / "memory" / "gpushare-a").is_dir()  # its parents stay with it
    assert (tmp_path / "cpuset" / "gpushare-b" / "slurm_lab-mps01" / "uid_1" / "job_1").is_dir()  # another project's
    assert remove_cgroup_trees(["gpushare-x"], root=tmp_path / "absent") == []


def _v1_root(tmp_path) -> Path:
    for ctl in CGROUP_V1_CONTROLLERS:
        (tmp_path / "cgroup" / ctl).mkdir(parents=True)
    return tmp_path / "cgroup"


def test_on_a_cgroup_v1_host_each_project_mounts_its_own_cgroup_of_every_hierarchy_slurm_uses(tmp_path, monkeypatch):
    import slurm_gpushare.testcluster.cluster as tc

    monkeypatch.setattr(tc, "CGROUP_ROOT", _v1_root(tmp_path))
    monkeypatch.setattr(tc.cgroup_v1_host, "__defaults__", (tc.CGROUP_ROOT,))
    mounts = {}
    for project in ("one", "two"):
        c = TestCluster(ROOT / "etc" / "small-lab.yaml", project=project, workdir=tmp_path / "w")
        c.write_config()
        services = yaml.safe_load((c.workdir / "nodes.yml").read_text())["services"]
        node = services["lab-mps01"]
        assert "/sys/fs/cgroup:/sys/fs/cgroup:rw" not in node["volumes"]
        mounts[project] = {v for v in node["volumes"] if v.startswith("/sys/fs/cgroup/")}
        assert mounts[project] == {
            f"/sys/fs/cgroup/{ctl}/gpushare-{project}:/sys/fs/cgroup/{ctl}:rw" for ctl in CGROUP_V1_CONTROLLERS
        }
        assert node["environment"]["GPUSHARE_CGROUP_PARENT"] == f"gpushare-{project}"
        assert c.cgroup_tops() == [f"gpushare-{project}"]
    assert not {m.split(":")[0] for m in mounts["one"]} & {m.split(":")[0] for m in mounts["two"]}


def test_without_cgroup_v1_hierarchies_the_nodes_mount_the_whole_cgroup_tree(tmp_path, monkeypatch):
    import slurm_gpushare.testcluster.cluster as tc

    monkeypatch.setattr(tc.cgroup_v1_host, "__defaults__", (tmp_path / "v2-only",))
    c = TestCluster(ROOT / "etc" / "small-lab.yaml", project="one", workdir=tmp_path / "w")
    c.write_config()
    node = yaml.safe_load((c.workdir / "nodes.yml").read_text())["services"]["lab-mps01"]
    assert "/sys/fs/cgroup:/sys/fs/cgroup:rw" in node["volumes"] and "GPUSHARE_CGROUP_PARENT" not in node["environment"]
    assert c.cgroup_tops() == [f"slurm_{n}" for n in c.nodes()]


def test_images_are_built_once_per_process_for_each_suite_and_kind(tmp_path):
    seen: list = []

    def runner(argv, **_kw):
        seen.append(list(argv))
        return Result(tuple(argv), 0, "", "")

    def build(**kw):
        TestCluster(
            ROOT / "etc" / "small-lab.yaml",
            project="unit",
            workdir=tmp_path,
            runner=runner,
            docker_dir=tmp_path / "docker",
            **kw,
        ).build()

    build(suite="trixie")
    build(suite="trixie")
    build(suite="sid")
    build(suite="trixie", plain=True)
    assert [a[-1] for a in seen] == [f"{tmp_path}/docker/bootstrap.sh"] * 2 + ["--no-wheel"]  # trixie, sid, plain


def test_exporter_tls_scrapes_over_https_with_a_client_certificate_and_basic_auth():
    from slurm_gpushare.testcluster.compose import EXPORTER_TLS_DIR, PROMETHEUS_TLS_DIR

    job = {
        j["job_name"]: j
        for j in yaml.safe_load(prometheus_config(SITE, "slurmctld", exporter_tls=True))["scrape_configs"]
    }
    gpushare = job["gpushare"]
    assert gpushare["scheme"] == "https" and gpushare["tls_config"]["server_name"] == "slurmctld"
    assert gpushare["tls_config"]["ca_file"] == f"{PROMETHEUS_TLS_DIR}/ca.crt"
    assert gpushare["basic_auth"] == {"username": "prometheus", "password_file": f"{PROMETHEUS_TLS_DIR}/password"}
    assert "scheme" not in job["node"]  # node_exporter stays plain HTTP
    services = yaml.safe_load(nodes_compose(SITE, "/tmp/x/prometheus.yml", "/tmp/x/tls"))["services"]
    assert f"/tmp/x/tls/prometheus:{PROMETHEUS_TLS_DIR}:ro" in services["prometheus"]["volumes"]
    assert services["slurmctld"]["volumes"] == [f"/tmp/x/tls/exporter:{EXPORTER_TLS_DIR}:ro"]
    assert "scheme" not in {k for j in yaml.safe_load(prometheus_config(SITE))["scrape_configs"] for k in j}


def test_a_sites_nodes_outside_the_policy_get_a_service_without_the_node_setup():
    services = yaml.safe_load(nodes_compose(SITE, extra_nodes=("gpu-x01",)))["services"]
    plain = yaml.safe_load(nodes_compose(SITE))["services"]
    assert set(services) - set(plain) == {"gpu-x01"}
    assert services["gpu-x01"]["environment"]["GPUSHARE_NODE_SETUP"] == "0"
    assert services["gpu-x01"]["hostname"] == "gpu-x01"
    assert "gpu-x01" in services["slurmctld"]["depends_on"]
    assert all(services[n]["environment"]["GPUSHARE_NODE_SETUP"] == "1" for n in plain if n != "slurmctld")
