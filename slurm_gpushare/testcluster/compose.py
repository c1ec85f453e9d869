"""Compose services for the compute nodes, one per Slurm NodeName of the policy.

The base file (docker/docker-compose.yml) has munge, MariaDB, slurmdbd and
slurmctld; this second file adds every node of every node group, so node
names, GPU counts and GRES come from the policy and nowhere else, and, when
asked, a Prometheus server scraping the controller exporter and every node's
node_exporter (its scrape configuration is ``prometheus_config``). Pure.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..policy import Site
from ..slurm.commands import node_health_shell

IMAGE = "gpushare-slurm:${SLURM_SUITE:-trixie}"
# Built by docker/bootstrap.sh from debian:trixie-slim whatever the Slurm suite.
PROMETHEUS_IMAGE = "gpushare-prometheus:trixie"
PROMETHEUS_PORT = 9090
EXPORTER_PORT = 9877  # `gpushare exporter --web.listen-address :9877` in slurmctld
NODE_EXPORTER_PORT = 9100  # prometheus-node-exporter, started by docker/entrypoint-node.sh
# Short intervals so tests see a change within seconds. The controller exporter
# runs Slurm commands on each scrape: it gets a longer timeout.
NODE_SCRAPE_INTERVAL = "2s"
EXPORTER_SCRAPE_INTERVAL = "5s"
# With exporter TLS (``exporter_tls``), the directory of the throwaway files each side gets: Prometheus
# its CA, client certificate and key, and the basic-auth password (``prometheus/`` of the host directory);
# slurmctld the exporter's web configuration, server certificate and key (``exporter/``).
PROMETHEUS_TLS_DIR = "/etc/prometheus/gpushare"
EXPORTER_TLS_DIR = "/etc/gpushare/exporter"
EXPORTER_USER = "prometheus"
_HEALTH = node_health_shell('"$$(hostname -s)"')
# The cgroup v1 hierarchies Slurm's cgroup/v1 plugin uses (cgroup_v1.c g_cg_name); slurmd makes
# ``<hierarchy>/slurm_<NodeName>/uid_<U>/job_<J>`` in each, named after the node only.
CGROUP_V1_CONTROLLERS = ("cpuset", "memory", "devices", "freezer", "cpuacct")
CGROUP_PARENT_ENV = "GPUSHARE_CGROUP_PARENT"


def project_cgroup(project: str) -> str:
    """The host cgroup (in every v1 hierarchy) under which one compose project's nodes make theirs."""
    return f"gpushare-{project}"


def cgroup_volumes(parent: str | None) -> list[str]:
    """The node's cgroup mounts: with ``parent`` (a cgroup v1 host) that cgroup of each hierarchy Slurm uses,
    mounted where the hierarchy's root is expected, so two projects with the same node names never share a
    job's cgroup (docker makes the directory, a cgroup, at the first mount; docker/entrypoint-node.sh gives
    its cpuset the node's CPUs and memory nodes); without, the host's whole /sys/fs/cgroup (cgroup v2)."""
    if parent is None:
        return ["/sys/fs/cgroup:/sys/fs/cgroup:rw"]
    return [f"/sys/fs/cgroup/{c}/{parent}:/sys/fs/cgroup/{c}:rw" for c in CGROUP_V1_CONTROLLERS]


def node_service(
    node: str, cgroups: bool, cgroup_parent: str | None = None, state_dir: str = "/var/lib/gpushare"
) -> dict:
    service: dict[str, Any] = {
        "image": IMAGE,
        "init": True,
        "hostname": node,
        "networks": ["cluster"],
        # An unknown name costs 20 s in docker's DNS here; fail a lookup in 2 s.
        "dns_opt": ["timeout:1", "attempts:1"],
        "command": ["slurmd"],
        "volumes": [
            "munge-key:/etc/munge",
            "slurm-etc:/etc/slurm",
            "shared:/shared",
            "${GPUSHARE_POLICY_FILE:-/dev/null}:/etc/gpushare/policy.yaml:ro",
        ],
        # The per-node MIG include is written on the node: keep it off the shared volume.
        # The jobs' MPS pipe dirs on a size-capped tmpfs of their own, as docs/reference/node-files.md asks of
        # a site: a job that fills its pipe dir cannot fill the filesystem of the journals.
        "tmpfs": ["/etc/slurm/gres.d", f"{state_dir.rstrip('/')}/mps:size=64m,nr_inodes=16384,mode=0711"],
        "environment": {"GPUSHARE_FAKE_GPUS": "1", "GPUSHARE_NODE_SETUP": "1"},
        "depends_on": {
            "munge-key": {"condition": "service_completed_successfully"},
            "config": {"condition": "service_completed_successfully"},
        },
        "healthcheck": {"test": ["CMD-SHELL", _HEALTH], "interval": "3s", "timeout": "10s", "retries": 100},
    }
    if cgroups:
        # slurmd builds cgroups (read-write hierarchy), writes devices.allow
        # (CAP_SYS_ADMIN) and sets affinity (CAP_SYS_NICE); no --privileged.
        service["cap_add"] = ["SYS_ADMIN", "SYS_NICE"]
        service["volumes"] += cgroup_volumes(cgroup_parent)
        if cgroup_parent is not None:
            service["environment"][CGROUP_PARENT_ENV] = cgroup_parent
    return service


def nodes(site: Site) -> list[str]:
    return [n for g in site.groups for n in g.nodes]


def prometheus_config(site: Site, controller: str = "slurmctld", exporter_tls: bool = False) -> str:
    """prometheus.yml: the controller exporter (job ``gpushare``) and each node's node_exporter (job ``node``).

    Every node target carries a ``node`` label (the Slurm NodeName), so node
    metrics join the controller's ``node`` label without relabelling. With
    ``exporter_tls`` the exporter is scraped over HTTPS, verified against the
    test CA, with a client certificate and basic auth (files under
    PROMETHEUS_TLS_DIR)."""
    exporter: dict[str, Any] = {
        "job_name": "gpushare",
        "scrape_interval": EXPORTER_SCRAPE_INTERVAL,
        "scrape_timeout": EXPORTER_SCRAPE_INTERVAL,
        "static_configs": [{"targets": [f"{controller}:{EXPORTER_PORT}"]}],
    }
    if exporter_tls:
        exporter.update(
            {
                "scheme": "https",
                "tls_config": {
                    "ca_file": f"{PROMETHEUS_TLS_DIR}/ca.crt",
                    "cert_file": f"{PROMETHEUS_TLS_DIR}/client.crt",
                    "key_file": f"{PROMETHEUS_TLS_DIR}/client.key",
                    "server_name": controller,
                },
                "basic_auth": {"username": EXPORTER_USER, "password_file": f"{PROMETHEUS_TLS_DIR}/password"},
            }
        )
    doc = {
        "global": {
            "scrape_interval": NODE_SCRAPE_INTERVAL,
            "scrape_timeout": NODE_SCRAPE_INTERVAL,
            "evaluation_interval": NODE_SCRAPE_INTERVAL,
        },
        "scrape_configs": [
            exporter,
            {
                "job_name": "node",
                "static_configs": [
                    {"targets": [f"{n}:{NODE_EXPORTER_PORT}"], "labels": {"node": n}} for n in nodes(site)
                ],
            },
        ],
    }
    header = f"# Generated by gpushare testcluster from {site.source_name}: the test cluster's Prometheus.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def prometheus_service(config_path: str, tls_dir: str | None = None) -> dict:
    """The Prometheus server: on the cluster network only (tests query it inside its container)."""
    service: dict[str, Any] = {
        "image": PROMETHEUS_IMAGE,
        "init": True,
        "hostname": "prometheus",
        "networks": ["cluster"],
        "dns_opt": ["timeout:1", "attempts:1"],
        "volumes": [f"{config_path}:/etc/prometheus/prometheus.yml:ro"],
        "healthcheck": {
            "test": ["CMD", "wget", "-q", "-O", "/dev/null", f"http://localhost:{PROMETHEUS_PORT}/-/ready"],
            "interval": "2s",
            "timeout": "5s",
            "retries": 60,
        },
    }
    if tls_dir:
        service["volumes"].append(f"{tls_dir}/prometheus:{PROMETHEUS_TLS_DIR}:ro")
    return service


def nodes_compose(
    site: Site,
    prometheus_config_path: str | None = None,
    exporter_tls_dir: str | None = None,
    cgroup_parent: str | None = None,
    extra_nodes: tuple[str, ...] = (),
) -> str:
    """The second compose file: node services, and slurmctld waiting for all of them.

    slurmctld resolves every NodeName once at start (blocking for minutes on
    an unknown name), so the node containers must exist before it starts.
    With ``prometheus_config_path`` (a host path of ``prometheus_config``'s
    output) a ``prometheus`` service is added; with ``exporter_tls_dir`` (a
    host directory with ``prometheus/`` and ``exporter/``) each side mounts
    its part of the exporter's TLS files. With ``cgroup_parent`` the nodes' cgroups live under that
    cgroup of the host's v1 hierarchies (``cgroup_volumes``). ``extra_nodes``: nodes of a site's own
    slurm.conf that the policy does not describe, each the same service without the node setup.
    """
    names = nodes(site) + [n for n in extra_nodes if n not in nodes(site)]
    services = {n: node_service(n, site.cluster.cgroups, cgroup_parent, site.cluster.paths.state_dir) for n in names}
    for n in extra_nodes:
        services[n]["environment"]["GPUSHARE_NODE_SETUP"] = "0"
    services["slurmctld"] = {"depends_on": {n: {"condition": "service_started"} for n in names}}
    if prometheus_config_path:
        services["prometheus"] = prometheus_service(prometheus_config_path, exporter_tls_dir)
    if exporter_tls_dir:
        services["slurmctld"]["volumes"] = [f"{exporter_tls_dir}/exporter:{EXPORTER_TLS_DIR}:ro"]
    doc = {"version": "2.4", "services": services}
    header = f"# Generated by gpushare testcluster from {site.source_name}: one service per Slurm node.\n"
    return header + yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)
