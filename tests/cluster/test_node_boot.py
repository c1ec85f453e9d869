"""A node's reboot on real Slurm (issue 33, part 3): `gpushare node boot` (gpushare-node-boot.service on a real
node; docker/node-setup.sh at each container start here) puts back what a reboot takes before slurmd starts.

Two nodes of the small lab: lab-mig01 (an A100-40GB, all-1g.5gb) and lab-mps01 (an A30 shared with MPS in
compute mode exclusive_process). A restart of a node's container is its reboot: the fake NVML kept in the
container loses every MIG instance and its compute modes (`gpushare node fake-nvml reboot`; the A100 keeps MIG
mode), the gres include (a tmpfs) is gone. Checked for each node:

- it comes back IDLE, neither drained nor INVALID_REG (slurmd registered the GRES slurm.conf declares);
- lab-mig01: the same seven 1g.5gb slices in its gres include (the MIG UUIDs are new) and on its GPU, and a
  MIG job runs on one of them;
- lab-mps01: its GPU in EXCLUSIVE_PROCESS again, and an MPS job runs.

Own compose project (GPUSHARE_BOOT_PROJECT, default "nodeboot"); always taken down (GPUSHARE_BOOT_KEEP=1 keeps
it for debugging).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import MIG_INCLUDE, POLICY, mig_uuids_by_index, own_cluster, wait_for, wait_quiet

PROJECT = os.environ.get("GPUSHARE_BOOT_PROJECT", "nodeboot")
MIG_NODE, MPS_NODE = "lab-mig01", "lab-mps01"
FAKE = "/var/lib/gpushare/fake-nvml.json"

# Runs on a node with the image's python: what its fake GPUs look like now.
NODE_PY = r"""
import json, sys
from slurm_gpushare.gpu import open_backend
from slurm_gpushare.hardware import model_for_nvml_name
with open_backend(sys.argv[1]) as b:
    out = []
    for g in b.gpus():
        model = model_for_nvml_name(g.name)
        gis = b.gpu_instances(g.index) if g.mig_current else []
        names = sorted(model.profile_for_constant(i.profile_constant).name for i in gis)
        mode = b.compute_mode(g.index)
        out.append({"index": g.index, "mig": g.mig_current, "compute_mode": mode, "instances": names})
print(json.dumps(out))
"""


def write_policy(work: Path) -> Path:
    """The small lab's MIG and MPS groups only, the MPS GPU in exclusive_process (in a tier of its own, as
    ExclusiveUser=YES needs)."""
    raw = yaml.safe_load(POLICY.read_text())
    groups = {g["name"]: g for g in raw["node_groups"]}
    raw["node_groups"] = [groups["lab-mig"], groups["lab-mps"]]
    groups["lab-mps"]["sharing"] = [{"gpus": 0, "mode": "mps", "units": 100, "compute_mode": "exclusive_process"}]
    raw["tiers"] = [
        {"name": "batch", "default": True, "node_groups": ["lab-mig"], "priority": 10},
        {"name": "mps", "node_groups": ["lab-mps"], "priority": 10},
    ]
    raw["submission"] = {"aliases": {"small": "gpu:a100_40g_1g.5gb"}}
    raw["billing"]["gpu_weights"] = {"A100-SXM4-40GB": 100, "A30-24GB": 50}
    path = work / "node-boot.yaml"
    path.write_text("# node boot test cluster (tests/cluster/test_node_boot.py)\n" + yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def boot_cluster():
    yield from own_cluster("nodeboot", PROJECT, write_policy, "GPUSHARE_BOOT_KEEP")


# ---- helpers ----------------------------------------------------------------------------


def gpus(c: TestCluster, node: str) -> list[dict]:
    out = c.exec(node, ["/opt/gpushare/bin/python", "-", FAKE], input=NODE_PY).stdout
    return json.loads(out.strip().splitlines()[-1])


def include_types(c: TestCluster) -> list[str]:
    text = c.exec(MIG_NODE, ["cat", MIG_INCLUDE]).stdout
    return sorted(re.findall(r"^NodeName=\S+ Name=gpu Type=(\S+) ", text, flags=re.M))


def slurmd_started(c: TestCluster, node: str) -> str:
    out = c.scontrol("-o", "show", "node", node).stdout
    return next((f for f in out.split() if f.startswith("SlurmdStartTime=")), "")


def restart(c: TestCluster, node: str) -> dict:
    """Restart the node's container (its reboot) and wait until slurmd registered again; the node's state."""
    before = slurmd_started(c, node)
    c.compose("restart", "-t", "5", node, timeout=240)
    wait_for(f"{node}'s slurmd registered again", lambda: slurmd_started(c, node) != before, 180)
    states = wait_for(
        f"{node} idle",
        lambda: (s := c.node_states()[node])["base"] == "IDLE" and not s["flags"] & {"NOT_RESPONDING"} and s,
        120,
    )
    return states


def assert_in_service(state: dict, node: str) -> None:
    bad = {f for f in state["flags"] if f.startswith(("DRAIN", "INVAL", "FAIL", "DOWN"))}
    assert not bad and "INVALID_REG" not in state["state"], f"{node}: {state['state']} Reason={state['reason']}"


def run_job(c: TestCluster, gres: str, account: str, partition: str, user: str) -> tuple[dict, str]:
    log = f"/shared/nodeboot-{gres.replace(':', '_')}-%j.out"
    job = c.sbatch(
        "env | grep -E '^CUDA_VISIBLE_DEVICES=' || true\n",
        user=user,
        account=account,
        partition=partition,
        output=log,
        gres=gres,
    )
    rec = c.wait(job, timeout=180)
    text = c.exec("slurmctld", ["bash", "-c", f"cat {log.replace('%j', str(job))} 2>/dev/null || true"]).stdout
    return rec, text


# ---- the scenarios ------------------------------------------------------------------------


def test_a_rebooted_mig_node_comes_back_idle_with_the_same_slices(boot_cluster):
    c = boot_cluster
    wait_quiet(c)
    types, uuids = include_types(c), mig_uuids_by_index(c, MIG_NODE)
    assert types == ["a100_40g_1g.5gb"] * 7, types
    state = restart(c, MIG_NODE)
    assert_in_service(state, MIG_NODE)
    assert include_types(c) == types
    again = mig_uuids_by_index(c, MIG_NODE)
    assert len(again) == 7 and not set(again) & set(uuids)  # new instances: the old ones did not survive
    (gpu,) = gpus(c, MIG_NODE)
    assert gpu["mig"] and gpu["instances"] == ["1g.5gb"] * 7, gpu
    rec, text = run_job(c, "gpu:a100_40g_1g.5gb:1", "physics", "batch", "alice")
    assert rec["State"] == "COMPLETED" and "CUDA_VISIBLE_DEVICES=MIG-" in text, (rec, text)
    wait_quiet(c)
    assert_in_service(c.node_states()[MIG_NODE], MIG_NODE)
    print(f"\n{MIG_NODE} rebooted: {state['state']}, {len(again)} new MIG devices, a slice job {rec['State']}")


def test_a_rebooted_mps_node_gets_exclusive_process_back(boot_cluster):
    c = boot_cluster
    wait_quiet(c)
    assert [g["compute_mode"] for g in gpus(c, MPS_NODE)] == ["EXCLUSIVE_PROCESS"]
    state = restart(c, MPS_NODE)
    assert_in_service(state, MPS_NODE)
    assert [g["compute_mode"] for g in gpus(c, MPS_NODE)] == ["EXCLUSIVE_PROCESS"]
    rec, text = run_job(c, "mps:50", "biology", "mps", "carol")
    assert rec["State"] == "COMPLETED", (rec, text)
    wait_quiet(c)
    assert_in_service(c.node_states()[MPS_NODE], MPS_NODE)
    print(f"\n{MPS_NODE} rebooted: {state['state']}, compute mode EXCLUSIVE_PROCESS, an MPS job {rec['State']}")
