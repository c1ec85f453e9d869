"""What the cluster tests of docs/admins/install.md share (test_install_plain_slurm.py, test_install_existing_site.py).

A cluster started from gpushare-slurm:<suite>-plain (no package) with a site's own configuration gets:

1. the working tree's wheel and its dependencies (a wheelhouse built here) in its shared volume, where pip
   finds them (PIP_NO_INDEX, PIP_FIND_LINKS): the page's `pip install` runs as written;
2. stand-in GPUs on the policy's nodes: a fake NVML state per node, named by GPUSHARE_FAKE_NVML in the
   environment of the blocks run there (`node install` writes it into node.yaml for the hooks);
3. every `<!-- cluster-runnable node=ROLE -->` block of the page up to "Rolling back", as root with
   bash -euo pipefail, in page order, on every container of its role (extracted from the page now, not
   copied); a block that fails fails with its output. ``rollback`` runs the blocks after it.

Roles: controller (slurmctld), gpu (the policy's nodes), outside (the site's nodes the policy does not
describe: the cluster's extra_nodes), all (every one of them), mig (the policy's nodes with MIG GPUs).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from slurm_gpushare.gpu.fakenvml import FakeNvml
from slurm_gpushare.proc import run
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import slurmd_start_time, wait_for
from tests.conftest import ROOT
from tests.unit.docs_support import ClusterBlock, cluster_blocks

PAGE = ROOT / "docs" / "admins" / "install.md"
SWITCHING = ROOT / "docs" / "admins" / "switching.md"
FAKE_DIR = "/var/lib/fake-nvml"
FAKE = f"{FAKE_DIR}/state.json"
WHEELHOUSE = "/shared/wheelhouse"
DOCKER_LIB = "/usr/local/lib/gpushare-docker"  # the image's test-only helpers (docker/entrypoint-node.sh LIB)
# The start of both install tests' site slurm.conf: a Slurm site's daemons, paths and accounting as its admins
# wrote them (each test adds its GPUs, nodes and partitions).
SITE_HEADER = """\
# slurm.conf of the cluster "site", written by its admins (not by slurm-gpushare)
ClusterName=site
SlurmctldHost=slurmctld
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurm/ctld
SlurmdSpoolDir=/var/spool/slurm/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
# the containers have fewer CPUs than the nodes declare
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=slurmdbd
AccountingStorageEnforce=associations,limits,qos
"""
ENV_SCRIPT = "env | grep -E '^(CUDA_|SLURM_JOB_GPUS=|SLURM_JOB_NODELIST=)' | sort\n"


def page_blocks() -> tuple[list[ClusterBlock], list[ClusterBlock]]:
    """The page's cluster blocks before "## Rolling back", and from there on."""
    lines = PAGE.read_text().splitlines()
    rollback = lines.index("## Rolling back") + 1
    blocks = cluster_blocks(PAGE)
    return [b for b in blocks if b.line < rollback], [b for b in blocks if b.line > rollback]


def containers(c: TestCluster, role: str) -> list[str]:
    gpu = [n for n in c.nodes()]
    outside = [n for n in c.extra_nodes if n not in gpu]
    mig = [n for n in gpu if any(s.mode == "mig" for s in c.site.group_for_node(n).gpus)]
    roles = {"controller": ["slurmctld"], "gpu": gpu, "outside": outside, "all": ["slurmctld", *gpu, *outside]}
    return {**roles, "mig": mig}[role]


def run_block(c: TestCluster, block: ClusterBlock) -> list[str]:
    """Run ``block`` as written on every container of its role; the containers it ran on."""
    where = containers(c, block.node)
    for service in where:
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        if service != "slurmctld":
            env["GPUSHARE_FAKE_NVML"] = FAKE
        flags = [f"-e{k}={v}" for k, v in env.items()]
        done = c.compose(
            "exec", "-T", *flags, service, "bash", "-euo", "pipefail", "-c", block.script, timeout=600, check=False
        )
        assert done.returncode == 0, (
            f"{block.id} (node={block.node}) failed on {service}: exit {done.returncode}\n"
            f"$ {block.script}\n{done.stdout}\n{done.stderr}"
        )
    return where


def run_block_as_a_node_would(c: TestCluster, block: ClusterBlock) -> list[str]:
    """``run_block``; after a block that writes the nodes' gres include, the MIG capability device files it
    names are made on the MIG nodes (docker/fake_gpus.py), as the NVIDIA driver's nvidia-modprobe makes them
    on a real node: the fake NVML makes instances, not device files, and the image made its devices when the
    container started, from the site's gres.conf."""
    where = run_block(c, block)
    if "gpushare node gres-conf" in block.script:
        include = c.site.cluster.paths.gres_include
        for node in containers(c, "mig"):
            c.exec(node, ["python3", f"{DOCKER_LIB}/fake_gpus.py", "--gres-conf", include, "--node", node])
    return where


def wheelhouse(c: TestCluster, work: Path) -> Path:
    """The working tree's wheel and every wheel it needs with [nvml], for the image's Python (pip in a
    container of the plain image, on the host's network: as docker/bootstrap.sh builds the default image)."""
    out = work / "wheelhouse"
    out.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)], timeout=600)
    (wheel,) = out.glob("slurm_gpushare-*.whl")
    env = []
    ca = (
        os.environ.get("PIP_CERT")
        or run([sys.executable, "-m", "pip", "config", "get", "global.cert"], check=False, timeout=60).stdout.strip()
    )
    if ca and Path(ca).is_file():
        shutil.copy(ca, out / "pip-ca.pem")
        env = ["-e", "PIP_CERT=/wheels/pip-ca.pem"]
    script = (
        "python3 -m venv /tmp/v && /tmp/v/bin/pip wheel -q --disable-pip-version-check -w /wheels "
        f"'/wheels/{wheel.name}[nvml]'"
    )
    volume = ["-v", f"{out}:/wheels", *env]
    run(
        ["docker", "run", "--rm", "--network", "host", *volume, "--entrypoint", "bash", c.image, "-c", script],
        timeout=900,
    )
    (out / "pip-ca.pem").unlink(missing_ok=True)
    return out


def copy_wheelhouse(c: TestCluster, out: Path) -> None:
    cid = c.compose("ps", "-q", "slurmctld").stdout.strip()
    c.exec("slurmctld", ["mkdir", "-p", WHEELHOUSE])
    run(["docker", "cp", f"{out}/.", f"{cid}:{WHEELHOUSE}/"], timeout=300)
    c.exec("slurmctld", ["chmod", "-R", "a+rX", WHEELHOUSE])


def fake_gpus(c: TestCluster, work: Path) -> None:
    """Each policy node's stand-in GPUs: a fake NVML state of the policy's model and count, seeded by its name,
    MIG mode on where the policy lays out MIG (an A100 takes a GPU reset for it, which the site's admin made
    before the install: the page's `node mig apply` lays out instances, it cannot reset a GPU)."""
    for node in c.nodes():
        group = c.site.group_for_node(node)
        local = work / node / "state.json"
        local.parent.mkdir(parents=True)
        mig = [s.index for s in group.gpus if s.mode == "mig"]
        FakeNvml.build(local, model=group.model.name, count=len(group.gpus), mig_enabled=mig, seed=node)
        c.exec(node, ["mkdir", "-p", FAKE_DIR])
        for f in local.parent.iterdir():
            c.exec(node, ["bash", "-c", f"cat > {FAKE_DIR}/{shlex.quote(f.name)}"], input=f.read_text())


def install_as_the_page_says(c: TestCluster, registered) -> dict[str, list[str]]:
    """The product absent, then the wheelhouse, the fake GPUs and every install block of the page; then the
    nodes idle and ``registered(c)`` true (the policy's GRES registered). Block id -> containers it ran on."""
    for service in ("slurmctld", c.nodes()[0]):
        found = c.exec(
            service, ["bash", "-c", "command -v gpushare; ls -d /opt/gpushare /etc/gpushare/node.yaml"], check=False
        )
        assert found.returncode != 0 and "gpushare" not in found.stdout, (service, found.stdout)
    work = Path(tempfile.mkdtemp(prefix="gpushare-install-"))
    try:
        copy_wheelhouse(c, wheelhouse(c, work))
        fake_gpus(c, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    install, _rollback = page_blocks()
    ran = {b.id: run_block_as_a_node_would(c, b) for b in install}
    c.wait_idle(timeout=240)
    try:
        wait_for("the GPU nodes to register the policy's GRES", lambda: registered(c), 180)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {c.node_states()}\n{c.scontrol('show', 'node').stdout}") from None
    return ran


def rollback_as_the_page_says(c: TestCluster) -> None:
    _install, rollback = page_blocks()
    for b in rollback:
        run_block(c, b)


def show_config(c: TestCluster) -> dict[str, str]:
    """`scontrol show config` as a dict; 24.11 prints list keys indexed (Prolog[0]): the first is kept, unindexed."""
    config: dict[str, str] = {}
    for key, value in re.findall(r"^(\w+)(?:\[\d+\])?\s+= (.*)$", c.slurm(["scontrol", "show", "config"]).stdout, re.M):
        config.setdefault(key, value)
    return config


def show_config_lists(c: TestCluster) -> dict[str, list[str]]:
    """`scontrol show config`, every value of each key (Prolog[0], Prolog[1], ... in order)."""
    config: dict[str, list[str]] = {}
    for key, value in re.findall(r"^(\w+)(?:\[\d+\])?\s+= (.*)$", c.slurm(["scontrol", "show", "config"]).stdout, re.M):
        config.setdefault(key, []).append(value)
    return config


def restart_slurmds(c: TestCluster, nodes: list[str]) -> None:
    """SIGKILL every node's slurmd at once (a crash; the node's entrypoint starts it again, as
    slurmd.service's Restart=on-failure would, and running jobs' slurmstepd live on) and wait until each
    registered again. A slurmd younger than 10 s is left to age first: the entrypoint takes a slurmd that
    dies that young for a bad configuration and stops the node."""
    before = {n: slurmd_start_time(c, n) for n in nodes}
    ages = [c.exec(n, ["bash", "-c", 'ps -o etimes= -p "$(cat /run/slurmd.pid)"']).stdout for n in nodes]
    time.sleep(max(0, 11 - min(int(a) for a in ages)))
    for node in nodes:
        c.exec(node, ["bash", "-c", 'kill -9 "$(cat /run/slurmd.pid)"'])
    for node in nodes:
        wait_for(f"{node}'s slurmd to register again", lambda n=node: slurmd_start_time(c, n) > before[n], 120)
