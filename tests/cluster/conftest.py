"""The cluster tier: real slurmctld, slurmd, slurmdbd and MariaDB in docker, fake GPUs.

The session fixture builds the images (idempotent; installs the working
tree's wheel so the cluster runs the code under test), starts the compose
project through pytest-docker, waits until every node of the policy is idle
(failing with the nodes' Reason= if any drains), yields a ``TestCluster``
handle, and tears everything down (containers, network, volumes).

Without docker the tier skips with a one-line reason, unless
GPUSHARE_REQUIRE_CLUSTER=1 (set by .ci/run): then it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from slurm_gpushare.proc import CommandError, run
from slurm_gpushare.testcluster.cluster import TestCluster, remove_cgroup_trees
from tests.conftest import ROOT

POLICY = ROOT / "etc" / "small-lab.yaml"
# Under pytest-xdist the session cluster is per worker: its project ends in -gw0, -gw1, ...
PROJECT = os.environ.get("GPUSHARE_TEST_PROJECT", "gpusharetest") + (
    f"-{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else ""
)
# Appended to the compose project of every module's own cluster (own_cluster): two test runs side by side
# (.ci/run runs the Slurm 26.05 subset beside the 24.11 tier) then never share a project.
PROJECT_SUFFIX = os.environ.get("GPUSHARE_PROJECT_SUFFIX", "")
MIG_INCLUDE = "/etc/slurm/gres.d/gpushare-mig.conf"


def pytest_collection_modifyitems(items):
    """Mark the cluster tier and run it after the other tiers: the session cluster then comes up after them
    and is not left idle on the machine's CPUs while they run (and a run beside this one, CI's Slurm 26.05
    subset, shares the CPUs with them rather than with this tier's timed waits).

    Under pytest-xdist (``--dist loadfile``: a module's tests on one worker, so a module's own cluster is
    brought up once) the cluster modules go longest first (``LONGEST``), so that neither worker is left
    with a long one at the end; each worker that runs a test of the session cluster brings up its own
    (its project ends in the worker's name, see PROJECT)."""
    cluster = []
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            cluster.append(item)
    if not cluster:
        return
    chosen = set(map(id, cluster))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's collection: the scheduler keeps its order
        rank = {name: n for n, name in enumerate(LONGEST)}
        cluster.sort(key=lambda i: rank.get(Path(str(i.fspath)).name, len(rank)))  # stable within a module
    items[:] = [i for i in items if id(i) not in chosen] + cluster


# Cluster modules, longest first (their seconds in CI at c5f6a2a, setup included: .ci/run prints them): the order
# xdist hands them out in, so that the last module a worker starts is a short one. A module not listed goes last.
LONGEST = (
    "test_install_existing_site.py",
    "test_soak.py",
    "test_placement_fidelity.py",
    "test_per_job_mig.py",
    "test_pipe_dir_contents.py",
    "test_node_runtime.py",
    "test_metrics.py",
    "test_live_planner.py",
    "test_install_plain_slurm.py",
    "test_node_health.py",
    "test_accounting.py",
    "test_mig_growth.py",
    "test_small_lab.py",
    "test_live_apply_crash.py",
    "test_mps_tenants.py",
    "test_node_boot.py",
    "test_mps_control_link.py",
    "test_foreign_drain.py",
    "test_half_faked_node.py",
    "test_bad_journal.py",
    "test_mps_multiprocess.py",
    "test_proc_reads.py",
    "test_slurm_client.py",
    "test_policy_change.py",
    "test_interactive_drain.py",
    "test_hostile_text.py",
    "test_submission.py",
)


def _docker_problem() -> str | None:
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
    except CommandError as exc:
        return f"docker daemon not reachable ({exc})"
    return None


@pytest.fixture(scope="session")
def cluster_handle():
    """The session cluster's handle; its files are not under pytest's basetemp (see own_cluster). Torn down
    after pytest-docker's `down` (it is set up before docker_services): the project's cgroups go too."""
    problem = _docker_problem()
    if problem:
        message = f"cluster tier: {problem}"
        if os.environ.get("GPUSHARE_REQUIRE_CLUSTER") == "1":
            pytest.fail(message + " (GPUSHARE_REQUIRE_CLUSTER=1)", pytrace=False)
        pytest.skip(message)
    work = Path(tempfile.mkdtemp(prefix=f"gpushare-{PROJECT}-"))
    handle = TestCluster(POLICY, project=PROJECT, workdir=work)
    handle.build()
    handle.write_config()
    os.environ.update({k: handle.env[k] for k in ("GPUSHARE_CONF_DIR", "GPUSHARE_POLICY_FILE", "SLURM_SUITE")})
    yield handle
    remove_cgroup_trees(handle.cgroup_tops())
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    return "docker-compose"  # Debian's 1.29; the docker CLI here has no compose plugin


@pytest.fixture(scope="session")
def docker_compose_project_name(cluster_handle) -> str:
    return cluster_handle.project


@pytest.fixture(scope="session")
def docker_compose_file(cluster_handle) -> list[str]:
    return [str(f) for f in cluster_handle.compose_files]


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    return ["down -v --remove-orphans -t 5", "up -d"]  # a stale project from a killed run is cleared first


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down -v --remove-orphans -t 5"]


@pytest.fixture(scope="session")
def cluster(cluster_handle, docker_services) -> TestCluster:
    cluster_handle.wait_idle(timeout=240)
    setup_accounts(cluster_handle)
    return cluster_handle


def setup_accounts(c: TestCluster) -> None:
    """The policy's tenants, users and tier QOS, by `gpushare accounts apply` inside the cluster."""
    c.slurm(["gpushare", "accounts", "apply", "/etc/gpushare/policy.yaml"], timeout=120)
    again = c.slurm(["gpushare", "accounts", "plan", "/etc/gpushare/policy.yaml"]).stdout
    assert "sacctmgr" not in again, f"accounts plan not empty after apply:\n{again}"


def mig_uuids_by_index(c: TestCluster, node: str = "lab-mig01") -> list[str]:
    """The MIG UUID of each gpu record of the node's MIG include, in line order (= Slurm's index)."""
    text = c.exec(node, ["cat", MIG_INCLUDE]).stdout
    uuids, last = [], None
    for line in text.splitlines():
        m = re.match(r"# (MIG-[0-9a-f-]+):", line)
        if m:
            last = m[1]
        elif line.startswith("NodeName="):
            uuids.append(last)
    return uuids


def own_cluster(name: str, project: str, write_policy, keep_env: str | None = None, accounts: bool = True, **options):
    """A cluster in a compose project of its own, for a module that changes nodes or runs another policy.

    ``write_policy(work_dir) -> Path`` writes the policy file the cluster runs. The project is built,
    a stale one of the same name is cleared, it is brought up, waited idle and given the accounts;
    it is always taken down afterwards (unless ``keep_env`` names a variable set to 1, for debugging).
    ``accounts=False``: no `gpushare accounts apply` (a cluster whose image lacks the package, ``plain=True``).
    ``options`` go to TestCluster (``plain``, ``conf_files``, ``prometheus``, ...). The project name gets
    GPUSHARE_PROJECT_SUFFIX appended.
    Not under pytest's basetemp: concurrent pytest runs rotate those away while the cluster uses them.
    Without docker it skips, or fails under GPUSHARE_REQUIRE_CLUSTER=1. A generator: use it as the body
    of a module fixture (``yield from own_cluster(...)``).
    """
    problem = _docker_problem()
    if problem:
        if os.environ.get("GPUSHARE_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"cluster tier: {problem} (GPUSHARE_REQUIRE_CLUSTER=1)", pytrace=False)
        pytest.skip(f"cluster tier: {problem}")
    work = Path(tempfile.mkdtemp(prefix=f"gpushare-{name}-"))
    cluster = TestCluster(write_policy(work), project=project + PROJECT_SUFFIX, workdir=work, **options)
    try:
        cluster.build()
        cluster.write_config()
        cluster.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=180, check=False)
        cluster.up()
        cluster.wait_idle(timeout=300)
        if accounts:
            setup_accounts(cluster)
        yield cluster
    finally:
        if not (keep_env and os.environ.get(keep_env) == "1"):
            cluster.down()
            shutil.rmtree(work, ignore_errors=True)


def slurmd_start_time(c: TestCluster, node: str) -> int:
    """The node's SlurmdStartTime as slurmctld has it (epoch seconds; 0 when unknown)."""
    out = c.slurm(["scontrol", "show", "node", node, "--json"], check=False).stdout
    try:
        value = json.loads(out)["nodes"][0]["slurmd_start_time"]
    except (ValueError, KeyError, IndexError):
        return 0
    return int(value.get("number", 0) if isinstance(value, dict) else value or 0)


def wait_for(what: str, probe, timeout: float = 60, every: float = 1.0):
    """Poll ``probe`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
        value = probe()
    return value


def wait_quiet(c: TestCluster, timeout: float = 180) -> None:
    """No job of anyone left (earlier tests' epilogs included), every node idle and none still COMPLETING,
    and slurmdbd has recorded the end of every job the controller no longer has.

    A completing node gets a higher scheduling weight (cons_tres ``_set_sched_weight``) and keeps a
    COMPLETING flag, and a job end slurmdbd has not stored yet reads as still running: tests that
    compare placements, node states or usage records start from a quiet cluster."""
    deadline = time.monotonic() + timeout
    while True:
        queue = c.slurm(["squeue", "-h", "-o", "%i"]).stdout.strip()
        states = c.node_states()
        quiet = not queue and all(s["base"] == "IDLE" and "COMPLETING" not in s["state"] for s in states.values())
        unrecorded = unrecorded_ends(c) if quiet else []
        if quiet and not unrecorded:
            return
        assert time.monotonic() < deadline, (
            f"cluster not quiet after {timeout:.0f} s: queue {queue!r}, nodes {states}, ends not in slurmdbd "
            f"{unrecorded}"
        )
        time.sleep(1)


def unrecorded_ends(c: TestCluster, running: frozenset[int] = frozenset()) -> list[str]:
    """Jobs of the last day whose end slurmdbd has not stored (End=Unknown in sacct), but for ``running``."""
    out = c.slurm(["sacct", "-a", "-X", "-n", "-P", "-o", "JobID,End", "-S", "now-1days"]).stdout
    return [
        line
        for line in out.splitlines()
        if line.endswith("|Unknown") and int(line.split("|")[0].split("_")[0]) not in running
    ]


def ended_drain(c: TestCluster, node: str, since: str) -> dict | None:
    """slurmdbd's record of a drain of ``node`` after a prolog failure (``Prolog error``, or our prolog's
    ``gpushare-prolog:`` reason) that began at or after ``since`` (UTC) and has ended."""
    out = c.slurm(
        ["sacctmgr", "-n", "-P", "list", "event", f"nodes={node}", f"start={since}", "format=Start,End,State,Reason"],
        check=False,
    ).stdout
    for line in out.splitlines():
        start, end, st, reason = (line.split("|", 3) + ["", "", "", ""])[:4]
        prolog = reason == "Prolog error" or reason.startswith("gpushare-prolog:")
        if prolog and start >= since and end not in ("", "Unknown"):
            return {"Start": start, "End": end, "State": st, "Reason": reason}
    return None
