"""docs/admins/install.md, as written, on a Slurm cluster that never had slurm-gpushare.

The project ("install") starts from gpushare-slurm:<suite>-plain (docker/bootstrap.sh --no-wheel: Slurm,
munge, the test users and the fake GPU tools, no package), with the site's own slurm.conf, gres.conf and
cgroup.conf below (whole GPUs only, not rendered by the product). Then:

1. the working tree's wheel and its dependencies (a wheelhouse built here) go into the cluster's shared
   volume, and pip finds them there (PIP_NO_INDEX, PIP_FIND_LINKS): the page's `pip install` runs as written;
2. the GPU nodes get their stand-in GPUs: a fake NVML state per node, named by GPUSHARE_FAKE_NVML in the
   environment of the blocks run on them (the node commands read it; `node install` writes it into
   node.yaml for the hooks); their device files are made at start from the site's gres.conf;
3. every `<!-- cluster-runnable node=ROLE -->` block of the page up to "Rolling back" runs as root with
   bash -euo pipefail, in page order, on every container of its role (extracted from the page now, not
   copied here); a block that fails fails the fixture with its output;
4. the tests submit jobs: one job_submit.lua accepts and that lands where its GRES are, one it refuses with
   its message, an MPS job whose environment the node hooks set and whose node is clean after it; run the
   health check; start the installed systemd units' commands (their User=, Environment= and ExecStart=)
   and read the exporter's metrics and the live planner's first run;
5. the rollback blocks run last and give back the site's own slurm.conf, its GRES and a job without hooks.

The MIG block (node=mig) runs on no node here: this policy has no MIG GPU (test_node_runtime.py and
test_mig_growth.py cover MIG nodes).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from slurm_gpushare.siteconf.merge import END
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.install_support import (
    ENV_SCRIPT,
    SITE_HEADER,
    containers,
    install_as_the_page_says,
    page_blocks,
    rollback_as_the_page_says,
    show_config,
)

PROJECT = os.environ.get("GPUSHARE_INSTALL_PROJECT", "install")
NODES = ("gpu-a01", "gpu-s01", "gpu-m01")

POLICY = """\
# The GPU policy of the cluster "site" (tests/cluster/test_install_plain_slurm.py)
version: 1
cluster:
  name: site
  slurm_version: "24.11"
  controller: slurmctld
  accounting: {host: slurmdbd}
  slurmd_config_overrides: true
  hooks:
    prolog: /usr/local/sbin/gpushare-prolog
    epilog: /usr/local/sbin/gpushare-epilog
    task_prolog: /usr/local/bin/gpushare-task-prolog
    job_submit_lua: true
  health:
    program: /usr/local/sbin/gpushare-node-health
    interval: 60
    node_state: [ANY]
node_groups:
  - {name: whole, nodes: gpu-a01, gpu: {model: L40S, count: 2}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: "0-1", mode: exclusive}]}
  - {name: shard, nodes: gpu-s01, gpu: {model: L40S, count: 1}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: 0, mode: shard, replicas: 4}]}
  - {name: mps, nodes: gpu-m01, gpu: {model: A30-24GB, count: 1}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: 0, mode: mps, units: 100}]}
tenants:
  - {name: physics, shares: 60, users: [alice, bob]}
  - {name: biology, shares: 40, users: [carol]}
tiers:
  - {name: batch, default: true, node_groups: [whole, shard, mps], priority: 10, max_time: "1-00:00:00"}
live:
  enabled: true
"""

SITE_SLURM_CONF = (
    SITE_HEADER
    + """\
# GPUs as the site had them: whole GPUs, untyped
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
NodeName=gpu-a01 CPUs=8 RealMemory=16000 Gres=gpu:2 State=UNKNOWN
NodeName=gpu-s01 CPUs=8 RealMemory=16000 Gres=gpu:1 State=UNKNOWN
NodeName=gpu-m01 CPUs=8 RealMemory=16000 Gres=gpu:1 State=UNKNOWN
PartitionName=batch Nodes=gpu-a01,gpu-s01,gpu-m01 Default=YES MaxTime=1-00:00:00 State=UP
"""
)

SITE_FILES = {
    "slurm.conf": SITE_SLURM_CONF,
    "gres.conf": "AutoDetect=off\nNodeName=gpu-a01 Name=gpu File=/dev/nvidia[0-1]\n"
    "NodeName=gpu-s01 Name=gpu File=/dev/nvidia0\nNodeName=gpu-m01 Name=gpu File=/dev/nvidia0\n",
    "cgroup.conf": "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n",
}


@pytest.fixture(scope="module")
def plain_cluster():
    yield from own_cluster(
        "install",
        PROJECT,
        lambda work: _write(work / "policy.yaml", POLICY),
        "GPUSHARE_INSTALL_KEEP",
        accounts=False,
        plain=True,
        conf_files=SITE_FILES,
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def installed(plain_cluster):
    c = plain_cluster
    ran = install_as_the_page_says(c, lambda c: "mps:a30:100" in c.node_states()["gpu-m01"]["gres"])
    return c, ran


# ---- the install --------------------------------------------------------------------------


def test_every_block_ran_where_the_page_says(installed):
    c, ran = installed
    install, rollback = page_blocks()
    roles = {b.node for b in install}
    assert {"controller", "gpu", "all"} <= roles and rollback, roles
    for b in install:
        expected = [] if b.node == "mig" else containers(c, b.node)  # no MIG node, no node outside the policy here
        assert ran[b.id] == expected and (expected or b.node in ("mig", "outside")), (b.id, ran[b.id])


def test_slurm_runs_the_site_conf_with_the_gpu_part_included(installed):
    c, _ = installed
    conf = c.exec("slurmctld", ["cat", "/etc/slurm/slurm.conf"]).stdout
    assert conf.rstrip().endswith(f"Include slurm-gpushare.conf\n{END}"), conf[-300:]  # gpushare install's block
    assert "#gpushare# NodeName=gpu-a01 CPUs=8 RealMemory=16000 Gres=gpu:2" in conf
    assert "\nGresTypes=gpu\n" not in conf and "#gpushare# GresTypes=gpu\n" in conf
    config = show_config(c)
    assert config["JobSubmitPlugins"] == "lua", config.get("JobSubmitPlugins")
    assert config["HealthCheckProgram"] == "/usr/local/sbin/gpushare-node-health"
    assert config["Prolog"] == "/usr/local/sbin/gpushare-prolog", config
    assert config["TaskProlog"] == "/usr/local/bin/gpushare-task-prolog", config
    assert set(config["GresTypes"].split(",")) == {"gpu", "mps", "shard"}
    gres = {n: set(s["gres"].split(",")) for n, s in c.node_states().items()}
    assert gres == {
        "gpu-a01": {"gpu:l40s:2"},
        "gpu-s01": {"gpu:l40s:1", "shard:l40s:4"},
        "gpu-m01": {"gpu:a30:1", "mps:a30:100"},
    }, gres


def submit(c: TestCluster, script: str, user: str, account: str, gres: str) -> int:
    return c.sbatch(script, user=user, account=account, gres=gres, output="/shared/install-%j.out")


def test_a_job_job_submit_accepts_lands_where_its_gres_are(installed):
    c, _ = installed
    job = submit(c, ENV_SCRIPT, "alice", "physics", "gpu:l40s:2")
    rec = c.wait(job, timeout=240)
    assert rec["State"] == "COMPLETED" and rec["NodeList"] == "gpu-a01", rec
    out = c.read_shared(f"install-{job}.out")
    assert "CUDA_VISIBLE_DEVICES=" in out, out
    shard = submit(c, ENV_SCRIPT, "bob", "physics", "shard:1")
    rec = c.wait(shard, timeout=240)
    assert rec["State"] == "COMPLETED" and rec["NodeList"] == "gpu-s01", rec


def test_a_job_job_submit_refuses_gets_its_message(installed):
    c, _ = installed
    done = c.exec(
        "slurmctld",
        ["sbatch", "--account=physics", "--gres=shard:2", "--output=/dev/null"],
        user="alice",
        input="#!/bin/bash\ntrue\n",
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "2 shards are not 2 GPUs" in done.stderr and "--gres=shard:1" in done.stderr, done.stderr


def test_an_mps_job_gets_its_share_from_the_node_hooks(installed):
    c, _ = installed
    job = submit(
        c,
        ENV_SCRIPT + "pgrep -c -f '[n]vidia-cuda-mps-control -d' | sed 's/^/DAEMONS=/'\n",
        "carol",
        "biology",
        "mps:25",
    )
    rec = c.wait(job, timeout=240)
    assert rec["State"] == "COMPLETED" and rec["NodeList"] == "gpu-m01", rec
    env = dict(line.split("=", 1) for line in c.read_shared(f"install-{job}.out").splitlines() if "=" in line)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25", env
    assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith("/var/lib/gpushare/mps/"), env
    assert env["DAEMONS"] == "1", env

    def clean():
        left = c.exec(
            "gpu-m01", ["bash", "-c", "ls /var/lib/gpushare/jobs; pgrep -f '[n]vidia-cuda-mps-control -d'"], check=False
        ).stdout.split()
        return not left

    wait_for("gpu-m01 without journals or MPS daemons after the job", clean, 90)


def test_the_installed_health_check_finds_the_nodes_healthy(installed):
    c, _ = installed
    for node in NODES:
        done = c.exec(node, ["/usr/local/sbin/gpushare-node-health"], check=False)
        assert done.returncode == 0, (node, done.stdout, done.stderr)
    assert all("DRAIN" not in s["state"] for s in c.node_states().values()), c.node_states()


# ---- the services, as their units run them ----------------------------------------------------------


def unit(c: TestCluster, name: str) -> dict[str, list[str]]:
    text = c.exec("slurmctld", ["cat", f"/etc/systemd/system/{name}"]).stdout
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    return keys


def start_unit(c: TestCluster, name: str, log: str) -> None:
    """Its ExecStart, as its User=, with its Environment=, in the background; pid in /tmp/<name>.pid."""
    keys = unit(c, name)
    (command,) = keys["ExecStart"]
    user = keys.get("User", ["root"])[0]
    env = " ".join(shlex.quote(e) for e in keys.get("Environment", []))
    c.exec("slurmctld", ["bash", "-c", f"install -m 0644 -o {user} /dev/null {log}"])
    c.compose(
        "exec",
        "-d",
        "-T",
        "-u",
        user,
        "slurmctld",
        "bash",
        "-c",
        f"echo $$ > /tmp/{name}.pid; exec env {env} {command} >>{log} 2>&1",
        timeout=60,
    )


def stop_unit(c: TestCluster, name: str, log: str) -> str:
    """SIGTERM to the process started for ``name`` (by its pid); its log once it has ended."""
    pid = c.exec("slurmctld", ["cat", f"/tmp/{name}.pid"]).stdout.strip()
    c.exec("slurmctld", ["kill", "-TERM", pid], check=False)
    wait_for(
        f"{name} (pid {pid}) to end", lambda: c.exec("slurmctld", ["kill", "-0", pid], check=False).returncode != 0, 120
    )
    return c.exec("slurmctld", ["cat", log]).stdout


def metrics(c: TestCluster) -> str:
    code = (
        "import urllib.request; "
        "print(urllib.request.urlopen('http://127.0.0.1:9877/metrics', timeout=20).read().decode())"
    )
    done = c.exec("slurmctld", ["python3", "-c", code], check=False)
    return done.stdout if done.returncode == 0 else ""


def test_the_exporter_unit_serves_the_clusters_gpus(installed):
    c, _ = installed
    log = "/var/log/gpushare-exporter.log"
    start_unit(c, "gpushare-exporter.service", log)
    try:
        text = wait_for("the exporter's /metrics", lambda: metrics(c), 120)
        line = next(
            (
                line
                for line in text.splitlines()
                if line.startswith("gpushare_gres_configured{") and 'node="gpu-m01"' in line and 'gres="mps"' in line
            ),
            None,
        )
        assert line is not None and line.endswith(" 100.0"), text[:2000]
        assert re.search(r"^gpushare_exporter_last_scrape_success 1\.0$", text, re.M), text[:2000]
    finally:
        out = stop_unit(c, "gpushare-exporter.service", log)
    assert "Traceback" not in out, out


def test_the_live_planner_unit_runs_and_stops_between_runs(installed):
    c, _ = installed
    log = "/var/log/gpushare-live.log"
    start_unit(c, "gpushare-live.service", log)
    try:
        wait_for("the live planner's first run", lambda: "apply: " in c.exec("slurmctld", ["cat", log]).stdout, 180)
    finally:
        out = stop_unit(c, "gpushare-live.service", log)
    assert "apply: nothing to do" in out and "this run failed" not in out, out
    assert out.rstrip().endswith("gpushare live apply: stopped"), out


# ---- rolling back (last: it takes the product out) --------------------------------------------------


def test_zz_rollback_gives_back_the_sites_own_cluster(installed):
    c, _ = installed
    rollback_as_the_page_says(c)
    assert c.exec("slurmctld", ["cat", "/etc/slurm/slurm.conf"]).stdout == SITE_SLURM_CONF
    assert c.exec("slurmctld", ["cat", "/etc/slurm/gres.conf"]).stdout == SITE_FILES["gres.conf"]
    c.wait_idle(timeout=240)

    def as_the_site_had_them():
        gres = {n: s["gres"] for n, s in c.node_states().items()}
        return all("gpu:" in g and "mps" not in g and "shard" not in g and "l40s" not in g for g in gres.values())

    wait_for("the nodes' GRES as the site had them (untyped gpu only)", as_the_site_had_them, 180)
    config = show_config(c)
    assert config.get("JobSubmitPlugins", "(null)") == "(null)" and config.get("Prolog", "(null)") == "(null)", config
    assert config.get("HealthCheckProgram", "(null)") == "(null)", config
    job = submit(c, ENV_SCRIPT, "alice", "physics", "gpu:1")
    rec = c.wait(job, timeout=240)
    assert rec["State"] == "COMPLETED", rec
    assert "CUDA_MPS" not in c.read_shared(f"install-{job}.out")
