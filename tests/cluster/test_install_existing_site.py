"""docs/admins/install.md, as written, on a realistic existing site: does the site keep what it had?

tests/unit/siteconf/test_cluster_site.py uses its site files.

The project ("siteinstall") starts, like test_install_plain_slurm.py, from gpushare-slurm:<suite>-plain, but
its slurm.conf directory is a site's that has run Slurm for years:

- its own Prolog (a glob, /etc/slurm/site/prolog.d/*) and Epilog scripts, which leave a marker per job and
  node in /shared/site-markers, and a health program (HealthCheckProgram) that records each run there;
- a job_submit.lua with a rule of its own: a job without --time is refused, a checked one gets
  Comment=site-rule-checked (the policy chains it: submission.site_lua, run before ours);
- the GPU partition `batch` with AllowGroups (gpuusers: alice, bob, carol; not dave), a partition QOS
  (batchpart) and DefMemPerGPU; a licence (Licenses=matlab) in AccountingStorageTRES; a limit on the
  default QOS (normal: MaxWall 4 h, DenyOnLimit);
- a GPU node the policy does not describe (gpu-x01, 2 untyped GPUs, partition `legacy`) and an account the
  policy does not list (chemistry: dave). The merged slurm.conf runs the product's Prolog, Epilog, TaskProlog
  and HealthCheckProgram there too: the page's blocks for all nodes and for nodes outside the policy (the
  package, `gpushare node install --outside-policy`) run on it, so its jobs, the site's prolog and epilog
  markers and the site's health program go on as before, and nothing of the product's runs there.

A partition's QOS must exist in slurmdbd before slurmctld reads it (slurmctld stops otherwise), so the
cluster boots without `QOS=batchpart`; the site's setup makes the QOS, the group and the accounts, then
writes its real slurm.conf and reconfigures. The site's features are checked then, before the install
(all must hold: the fixture is right), and again after the page's install blocks (install_support.py runs
them as test_install_plain_slurm.py does), printing "kept N of M site features"; the product's GPU jobs
must work beside them. The page's rollback blocks run last: every file of /etc/slurm as before, byte for
byte (sha256), slurmctld up and staying up, the site's rules acting again, a job running.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpushare.testcluster.cluster import ClusterError, TestCluster
from tests.cluster.conftest import own_cluster, wait_for
from tests.cluster.install_support import (
    ENV_SCRIPT,
    SITE_HEADER,
    SWITCHING,
    install_as_the_page_says,
    page_blocks,
    restart_slurmds,
    rollback_as_the_page_says,
    run_block_as_a_node_would,
    show_config_lists,
)
from tests.unit.docs_support import cluster_blocks

PROJECT = os.environ.get("GPUSHARE_SITEINSTALL_PROJECT", "siteinstall")
MARKERS = "/shared/site-markers"
OUTSIDE = "gpu-x01"

POLICY = """\
# The GPU policy of the cluster "site" (tests/cluster/test_install_existing_site.py)
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
    site_program: /etc/slurm/site/health.sh
    interval: 60
    node_state: [ANY]
node_groups:
  - {name: whole, nodes: gpu-a01, gpu: {model: A100-SXM4-40GB, count: 2}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: 0, mode: exclusive}, {gpus: 1, mode: mig, layout: [3g.20gb, 3g.20gb]}]}
  - {name: shard, nodes: gpu-s01, gpu: {model: L40S, count: 1}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: 0, mode: shard, replicas: 4}]}
  - {name: mps, nodes: gpu-m01, gpu: {model: A30-24GB, count: 1}, cpus: 8, memory_mb: 16000,
     sharing: [{gpus: 0, mode: mps, units: 100}]}
tenants:
  - {name: physics, shares: 60, users: [alice, bob]}
  - {name: biology, shares: 40, users: [carol]}
tiers:
  - {name: batch, default: true, node_groups: [whole, shard, mps], priority: 10, max_time: "1-00:00:00"}
submission:
  site_lua: {path: /etc/slurm/job_submit_site.lua, order: before}
"""

SITE_SLURM_CONF = (
    SITE_HEADER
    + """\
# partition access (AllowGroups) checked when a job is submitted
EnforcePartLimits=ALL
# the site's licences, accounted
Licenses=matlab:2
AccountingStorageTRES=gres/gpu,license/matlab
# the site's own prolog, epilog, health program and submission rules
PrologFlags=Alloc
Prolog=/etc/slurm/site/prolog.d/*
Epilog=/etc/slurm/site/epilog.sh
HealthCheckProgram=/etc/slurm/site/health.sh
HealthCheckInterval=60
HealthCheckNodeState=ANY
JobSubmitPlugins=lua
# GPUs as the site had them: whole GPUs, untyped
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
NodeName=gpu-a01 CPUs=8 RealMemory=16000 Gres=gpu:2 State=UNKNOWN
NodeName=gpu-s01,gpu-m01 CPUs=8 RealMemory=16000 Gres=gpu:1 State=UNKNOWN
# a GPU node the GPU policy does not describe
NodeName=gpu-x01 CPUs=8 RealMemory=16000 Gres=gpu:2 State=UNKNOWN
PartitionName=batch Nodes=gpu-a01,gpu-s01,gpu-m01 Default=YES MaxTime=1-00:00:00 AllowGroups=gpuusers \
QOS=batchpart DefMemPerGPU=4000 State=UP
PartitionName=legacy Nodes=gpu-x01 MaxTime=12:00:00 State=UP
"""
)

SITE_JOB_SUBMIT = """\
-- The site's own job_submit.lua: every job needs a time limit; checked jobs say so in their comment.
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.time_limit == nil or job_desc.time_limit == slurm.NO_VAL then
    slurm.log_user("site rule: give your job a time limit (--time)")
    return slurm.ERROR
  end
  job_desc.comment = "site-rule-checked"
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
"""


def _marker_script(what: str) -> str:
    return (
        f"#!/bin/bash\n# The site's {what}: a marker per job and node\n"
        f"mkdir -p {MARKERS}\n"
        f'echo "$SLURM_JOB_USER" > "{MARKERS}/{what}-$SLURM_JOB_ID-$(hostname -s)"\n'
    )


SITE_FILES = {
    "slurm.conf": SITE_SLURM_CONF,
    "gres.conf": "AutoDetect=off\nNodeName=gpu-a01 Name=gpu File=/dev/nvidia[0-1]\n"
    "NodeName=gpu-s01,gpu-m01 Name=gpu File=/dev/nvidia0\nNodeName=gpu-x01 Name=gpu File=/dev/nvidia[0-1]\n",
    "cgroup.conf": "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n",
    "job_submit.lua": SITE_JOB_SUBMIT,
    # the config service makes *prolog*, *epilog* and *.sh executable
    "site/prolog.d/50-site-prolog.sh": _marker_script("prolog"),
    "site/epilog.sh": _marker_script("epilog"),
    "site/health.sh": (
        "#!/bin/bash\n# The site's health program (NHC's place): records each run\n"
        f'mkdir -p {MARKERS}\ndate +%s >> "{MARKERS}/health-$(hostname -s)"\nexit 0\n'
    ),
}
# slurmctld stops on a partition QOS that slurmdbd does not have yet: it boots without it (site_setup adds it)
BOOT_FILES = {**SITE_FILES, "slurm.conf": SITE_SLURM_CONF.replace(" QOS=batchpart", "")}

SITE_SETUP = f"""\
groupadd gpuusers
for u in alice bob carol; do usermod -aG gpuusers "$u"; done
sacctmgr -i add qos batchpart
sacctmgr -i modify qos where name=normal set MaxWall=04:00:00 Flags=DenyOnLimit
sacctmgr -i add account physics,biology,chemistry
sacctmgr -i add user alice,bob account=physics
sacctmgr -i add user carol account=biology
sacctmgr -i add user dave account=chemistry
mkdir -p {MARKERS} && chmod 0777 {MARKERS}
"""


@pytest.fixture(scope="module")
def site_cluster():
    yield from own_cluster(
        "siteinstall",
        PROJECT,
        lambda work: _write(work / "policy.yaml", POLICY),
        "GPUSHARE_SITEINSTALL_KEEP",
        accounts=False,
        plain=True,
        conf_files=BOOT_FILES,
        extra_nodes=(OUTSIDE,),
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def etc_slurm_sums(c: TestCluster) -> dict[str, str]:
    """sha256 of every file under the controller's /etc/slurm, by path."""
    out = c.exec("slurmctld", ["bash", "-c", "find /etc/slurm -type f -print0 | sort -z | xargs -0 sha256sum"])
    return {path: digest for digest, path in (line.split(None, 1) for line in out.stdout.splitlines())}


@pytest.fixture(scope="module")
def site(site_cluster):
    """The site as its admins run it: its QOS, group and accounts, its real slurm.conf; every site
    feature holding; the sha256 of every file of /etc/slurm."""
    c = site_cluster
    c.exec("slurmctld", ["bash", "-euo", "pipefail", "-c", SITE_SETUP], timeout=180)
    c.exec("slurmctld", ["bash", "-c", "cat > /etc/slurm/slurm.conf"], input=SITE_SLURM_CONF)
    c.scontrol("reconfigure")
    c.wait_idle(timeout=240)
    show = ["scontrol", "show", "partition", "batch"]
    wait_for("the site's partition QOS", lambda: "QoS=batchpart" in c.slurm(show, check=False).stdout, 120)
    kept, lost = site_features(c)
    assert not lost, f"the site itself does not hold these before the install: {lost}"
    return c, etc_slurm_sums(c), len(kept)


@pytest.fixture(scope="module")
def installed(site):
    c, sums, features = site
    ran = install_as_the_page_says(c, policy_gres_registered)
    return c, sums, features, ran


# ---- the site's features, each a check that returns what went wrong ("" when it holds) --------------


def submit(c: TestCluster, user: str, account: str, **opts) -> int:
    opts = {"time": "10:00", "output": "/shared/siteinstall-%j.out", **opts}
    return c.sbatch(ENV_SCRIPT, user=user, account=account, **opts)


def refused(c: TestCluster, user: str, options: list[str]) -> str:
    """sbatch's message for a job it should refuse; "" when it was accepted (the job is cancelled)."""
    argv = ["sbatch", "--parsable", "--output=/dev/null", *options]
    done = c.exec("slurmctld", argv, user=user, input="#!/bin/bash\ntrue\n", check=False)
    if done.returncode == 0:
        c.slurm(["scancel", done.stdout.strip().split(";")[0]], check=False)
        return ""
    return done.stderr.strip() or "(refused without a message)"


def ran_on(c: TestCluster, job: int, node: str | None = None, timeout: float = 240) -> str:
    """ "" when ``job`` completed (on ``node``); what happened otherwise (a job not done is cancelled)."""
    try:
        rec = c.wait(job, timeout=timeout)
    except ClusterError as exc:
        c.slurm(["scancel", str(job)], check=False)
        return str(exc)
    if rec["State"] != "COMPLETED" or (node and rec["NodeList"] != node):
        return f"job {job}: {rec['State']} on {rec['NodeList']} (wanted COMPLETED{' on ' + node if node else ''})"
    return ""


def markers(c: TestCluster, job: int, node: str) -> str:
    """The site's prolog and epilog both left their marker for ``job`` on ``node``."""
    names = [f"{MARKERS}/{what}-{job}-{node}" for what in ("prolog", "epilog")]

    def both():
        return c.exec("slurmctld", ["ls", *names], check=False).returncode == 0

    try:
        wait_for(f"the site's prolog and epilog markers of job {job}", both, 90)
    except AssertionError as exc:
        return f"{exc}: {c.exec('slurmctld', ['ls', MARKERS], check=False).stdout.split()}"
    return ""


def health_runs(c: TestCluster, nodes: list[str]) -> dict[str, str]:
    """The site's health program ran again on each node (HealthCheckInterval=60) since now."""

    def runs():
        out = c.exec("slurmctld", ["bash", "-c", f"wc -l {MARKERS}/health-* 2>/dev/null || true"]).stdout
        return {m[2]: int(m[1]) for m in re.finditer(r"(\d+) \S+/health-(\S+)", out)}

    before = runs()

    def all_ran():
        now = runs()
        return all(now.get(n, 0) > before.get(n, 0) for n in nodes)

    try:
        wait_for("the site's health program on " + ", ".join(nodes), all_ran, 150, every=5)
    except AssertionError:
        pass
    after = runs()
    return {n: "" if after.get(n, 0) > before.get(n, 0) else f"no run on {n} in 150 s" for n in nodes}


def gpu_job_features(c: TestCluster) -> dict[str, str]:
    job = submit(c, "alice", "physics", partition="batch", gres="gpu:1", licenses="matlab:1")
    problems = {"a GPU job of the site runs": ran_on(c, job)}
    rec = c.sacct(job)[0]
    node = rec["NodeList"]
    problems["the site's prolog and epilog leave their markers"] = markers(c, job, node)
    problems["DefMemPerGPU gives a GPU job its memory"] = "" if "mem=4000M" in rec["AllocTRES"] else rec["AllocTRES"]
    problems["the licence is requestable and accounted"] = (
        "" if "license/matlab=1" in rec["AllocTRES"] else f"no license/matlab=1 in {rec['AllocTRES']}"
    )
    return problems


def submit_rule_features(c: TestCluster) -> dict[str, str]:
    no_time = refused(c, "alice", ["--account=physics", "--partition=batch", "--gres=gpu:1"])
    job = submit(c, "bob", "physics", partition="batch", gres="gpu:1", hold=True)
    comment = c.job(job).get("Comment", "(none)")
    c.slurm(["scancel", str(job)])
    return {
        "the site's submit rule refuses a job without --time": (
            "" if "site rule: give your job a time limit" in no_time else f"refused with {no_time!r}"
        ),
        "the site's submit rule sets its comment": "" if comment == "site-rule-checked" else f"Comment={comment}",
    }


def partition_features(c: TestCluster) -> dict[str, str]:
    part = c.scontrol("show", "partition", "batch").stdout
    outside_group = refused(c, "dave", ["--account=chemistry", "--partition=batch", "--time=10", "--gres=gpu:1"])
    # the default QOS's MaxWall: for an association the policy does not list (dave, on the site's own partition)
    # and for a tenant's job that names the default QOS (a tenant's job that names none runs under its tier's
    # QOS once the policy's accounts are applied: docs/admins/switching.md)
    too_long = refused(c, "dave", ["--account=chemistry", "--partition=legacy", "--time=05:00:00", "--gres=gpu:1"])
    too_long_named = refused(
        c, "alice", ["--account=physics", "--partition=batch", "--qos=normal", "--time=05:00:00", "--gres=gpu:1"]
    )
    options = [o for o in ("AllowGroups=gpuusers", "QoS=batchpart", "DefMemPerGPU=4000") if o not in part]
    return {
        "batch keeps AllowGroups, its QOS and DefMemPerGPU": ", ".join(options) and f"missing {options}: {part}",
        "AllowGroups is enforced": ""
        if "not permitted to use this partition" in outside_group
        else repr(outside_group),
        "the default QOS limit (MaxWall) holds": "" if _over_limit(too_long) else repr(too_long),
        "the default QOS limit holds for a job naming it": "" if _over_limit(too_long_named) else repr(too_long_named),
    }


def _over_limit(message: str) -> bool:
    return "QOS" in message or "policy" in message


def outside_features(c: TestCluster) -> dict[str, str]:
    gres = c.node_states()[OUTSIDE]["gres"]
    job = submit(c, "dave", "chemistry", partition="legacy", gres="gpu:2")
    ran = ran_on(c, job, OUTSIDE, timeout=180)
    env = "" if ran else c.read_shared(f"siteinstall-{job}.out")
    sees = "the job did not run" if ran else "" if "CUDA_VISIBLE_DEVICES=0,1" in env else env
    return {
        "the node outside the policy keeps its 2 GPUs": "" if gres == "gpu:2" else f"{OUTSIDE} Gres={gres}",
        "the account outside the policy runs a job on it": ran,
        "the job there sees both GPUs": sees,
    }


FEATURES: tuple[Callable[[TestCluster], dict[str, str]], ...] = (
    gpu_job_features,
    submit_rule_features,
    partition_features,
    outside_features,
    lambda c: {f"the site's health program runs on {n}": p for n, p in health_runs(c, ["gpu-a01", OUTSIDE]).items()},
)


def site_features(c: TestCluster) -> tuple[list[str], dict[str, str]]:
    """The site features that hold, and those that do not with what went wrong."""
    problems: dict[str, str] = {}
    for check in FEATURES:
        problems.update(check(c))
    return [f for f, p in problems.items() if not p], {f: p for f, p in problems.items() if p}


# ---- after the install -----------------------------------------------------------------------------


def test_every_install_block_ran(installed):
    c, _sums, _features, ran = installed
    install, _rollback = page_blocks()
    assert all(ran[b.id] for b in install), ran  # every role has a node here, MIG too (gpu-a01's GPU 1)
    assert {n for b in install if b.node == "mig" for n in ran[b.id]} == {"gpu-a01"}, ran
    outside = [b.id for b in install if OUTSIDE in ran[b.id]]
    assert outside == [b.id for b in install if b.node in ("all", "outside")] and outside, (outside, ran)
    assert "outside" in {b.node for b in install}, "the page has no block for the nodes outside the policy"


def test_the_node_outside_the_policy_has_hooks_that_do_nothing_of_ours(installed):
    """`gpushare node install --outside-policy` as the page ran it: the hook scripts, a node.yaml saying so with
    the site's health program; no journal directory, no boot unit; `node boot` changes nothing; a GPU job there
    runs with the site's prolog and epilog, and the node is not drained."""
    c, *_ = installed
    config = c.exec(OUTSIDE, ["cat", "/etc/gpushare/node.yaml"]).stdout.splitlines()
    assert config[3:] == ["outside_policy: yes", "site_health_program: /etc/slurm/site/health.sh"], config
    scripts = "/usr/local/sbin/gpushare-prolog /usr/local/sbin/gpushare-epilog /usr/local/bin/gpushare-task-prolog"
    scripts += " /usr/local/sbin/gpushare-node-health"
    missing = c.exec(OUTSIDE, ["bash", "-c", f"for f in {scripts}; do test -x $f || echo $f; done"]).stdout
    assert not missing.strip(), f"not installed on {OUTSIDE}: {missing.split()}"
    absent = ["/var/lib/gpushare/jobs", "/etc/systemd/system/gpushare-node-boot.service"]
    assert c.exec(OUTSIDE, ["ls", "-d", *absent], check=False).returncode != 0
    boot = c.exec(OUTSIDE, ["gpushare", "node", "boot"]).stdout
    assert "outside the policy" in boot and "nothing to do at boot" in boot, boot
    job = submit(c, "dave", "chemistry", partition="legacy", gres="gpu:1")
    assert not ran_on(c, job, OUTSIDE), ran_on(c, job, OUTSIDE)
    assert markers(c, job, OUTSIDE) == ""
    state = c.node_states()[OUTSIDE]
    assert not any("DRAIN" in f for f in state["flags"]), state


def test_the_site_keeps_its_features(installed):
    c, _sums, features, _ran = installed
    kept, lost = site_features(c)
    print(f"kept {len(kept)} of {len(kept) + len(lost)} site features")
    assert len(kept) + len(lost) == features
    assert not lost, "\n".join(f"lost: {f}: {p}" for f, p in lost.items())


def test_the_site_scripts_run_beside_ours(installed):
    c, *_ = installed
    config = show_config_lists(c)
    assert config["Prolog"] == ["/etc/slurm/site/prolog.d/*", "/usr/local/sbin/gpushare-prolog"], config["Prolog"]
    assert config["Epilog"] == ["/usr/local/sbin/gpushare-epilog", "/etc/slurm/site/epilog.sh"], config["Epilog"]
    assert config["HealthCheckProgram"] == ["/usr/local/sbin/gpushare-node-health"]
    assert set(config["PrologFlags"][0].split(",")) >= {"Alloc", "Contain"}, config["PrologFlags"]
    assert "license/matlab" in config["AccountingStorageTRES"][0], config["AccountingStorageTRES"]


def policy_gres_registered(c: TestCluster) -> bool:
    """The policy's GRES registered: the MPS node's shares and the MIG GPU's two slices."""
    states = c.node_states()
    return "mps:a30:100" in states["gpu-m01"]["gres"] and "a100_40g_3g.20gb:2" in states["gpu-a01"]["gres"]


def test_the_products_gpu_jobs_work(installed):
    """A job of each mode: a whole GPU, a MIG slice (its own instance's UUID), a shard, an MPS share."""
    c, *_ = installed
    whole = submit(c, "alice", "physics", gres="gpu:a100_40g:1")
    assert not ran_on(c, whole, "gpu-a01"), ran_on(c, whole, "gpu-a01")
    assert "CUDA_VISIBLE_DEVICES=0" in c.read_shared(f"siteinstall-{whole}.out")
    mig = submit(c, "alice", "physics", gres="gpu:a100_40g_3g.20gb:1")
    assert not ran_on(c, mig, "gpu-a01"), ran_on(c, mig, "gpu-a01")
    assert "CUDA_VISIBLE_DEVICES=MIG-" in c.read_shared(f"siteinstall-{mig}.out"), c.read_shared(
        f"siteinstall-{mig}.out"
    )
    shard = submit(c, "bob", "physics", gres="shard:1")
    assert not ran_on(c, shard, "gpu-s01"), ran_on(c, shard, "gpu-s01")
    mps = submit(c, "carol", "biology", gres="mps:25")
    assert not ran_on(c, mps, "gpu-m01"), ran_on(c, mps, "gpu-m01")
    env = dict(line.split("=", 1) for line in c.read_shared(f"siteinstall-{mps}.out").splitlines() if "=" in line)
    assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25", env


def test_the_products_submit_rule_applies(installed):
    c, *_ = installed
    message = refused(c, "alice", ["--account=physics", "--time=10", "--gres=shard:2"])
    assert "2 shards are not 2 GPUs" in message and "--gres=shard:1" in message, message


def policy_nodes_idle(c: TestCluster) -> bool:
    """The policy's nodes idle and not drained (the node outside the policy may be anything)."""
    states = c.node_states()
    return all(states[n]["base"] == "IDLE" and not any("DRAIN" in f for f in states[n]["flags"]) for n in c.nodes())


# ---- rolling back (last: it takes the product out) --------------------------------------------------


def test_zz_rollback_gives_back_every_file_and_a_working_site(installed):
    c, before, _features, _ran = installed
    rollback_as_the_page_says(c)
    after = etc_slurm_sums(c)
    changed = {p: (d, after.get(p)) for p, d in before.items() if after.get(p) != d}
    extra = [p for p in after if p not in before and not p.startswith("/etc/slurm/.gpushare-backup/")]
    assert not changed and not extra, f"changed (before, after): {changed}; not there before: {extra}"
    up = c.slurm(["scontrol", "ping"], check=False).stdout
    wait_for("the policy's nodes idle after the rollback", lambda: policy_nodes_idle(c), 240)
    again = c.slurm(["scontrol", "ping"], check=False).stdout
    assert "is UP" in up and "is UP" in again, (up, again)
    config = show_config_lists(c)
    assert config["Prolog"] == ["/etc/slurm/site/prolog.d/*"] and config["Epilog"] == ["/etc/slurm/site/epilog.sh"]
    assert config["HealthCheckProgram"] == ["/etc/slurm/site/health.sh"], config["HealthCheckProgram"]
    message = refused(c, "alice", ["--account=physics", "--partition=batch", "--gres=gpu:1"])
    assert "site rule: give your job a time limit" in message, message
    job = submit(c, "alice", "physics", partition="batch", gres="gpu:1")
    assert not ran_on(c, job), ran_on(c, job)
    assert markers(c, job, c.sacct(job)[0]["NodeList"]) == ""


# ---- switching the live site (last: on the site as the rollback gave it back) -------------------------


def in_service_but(c: TestCluster, drained: set[str]) -> dict[str, str]:
    """Nodes drained, down or with an invalid registration, other than ``drained`` (node -> state and reason)."""
    bad = {}
    for node, s in c.node_states().items():
        flags = {f for f in s["flags"] if f.startswith(("DRAIN", "INVAL", "FAIL", "DOWN", "NOT_RESP"))}
        if node not in drained and (flags or s["base"] in ("DOWN", "FAIL") or "INVALID_REG" in s["state"]):
            bad[node] = f"{s['state']} Reason={s['reason']}"
    return bad


def test_zzz_switching_in_the_pages_order_survives_a_slurmd_restart_after_every_step(installed):
    """docs/admins/switching.md's steps as commands, on the site as the rollback gave it back (the package
    and the node hooks stay installed), with a job running on the node outside the policy, whose GRES do
    not change, and one on a node that changes when the drain starts. After every step every slurmd is
    killed and comes back: no node but the drained ones leaves service, the first job runs on untouched,
    the second ends on its own (the drain waits for it, nothing requeues it); after the last step every
    node is in service with the policy's GRES and the product's jobs run."""
    c, *_ = installed
    assert c.exec("slurmctld", ["cat", "/etc/slurm/slurm.conf"]).stdout == SITE_SLURM_CONF
    every = [*c.nodes(), OUTSIDE]
    steady = c.sbatch(
        "sleep 900\n",
        user="dave",
        account="chemistry",
        partition="legacy",
        gres="gpu:2",
        time="30:00",
        output="/dev/null",
    )
    wait_for("the outside node's job to run", lambda: running_on(c, steady) == OUTSIDE, 120)
    drained: set[str] = set()
    for block in cluster_blocks(SWITCHING):
        ending = None
        if "--gres-changes" in block.script:
            ending = c.sbatch(
                "sleep 40\n",
                user="alice",
                account="physics",
                partition="batch",
                gres="gpu:1",
                time=5,
                output="/dev/null",
            )
            wait_for("a job on a node that changes to run", lambda j=ending: running_on(c, j), 120)
        run_block_as_a_node_would(c, block)
        if ending is not None:
            drained = set(c.exec("slurmctld", ["cat", "/etc/gpushare/gres-changed"]).stdout.strip().split(","))
            assert drained == {"gpu-a01", "gpu-m01", "gpu-s01"}, drained
            rec = c.sacct(ending)[0]
            assert rec["State"] == "COMPLETED" and c.job(ending).get("Restarts", "0") == "0", rec
        if "state=resume" in block.script:
            drained = set()
            wait_for("the policy's nodes idle after the switch", lambda: policy_nodes_idle(c), 240)
        restart_slurmds(c, every)
        problems = in_service_but(c, drained)
        assert not problems, f"after {block.id} and a slurmd restart: {problems}"
        assert running_on(c, steady) == OUTSIDE, f"after {block.id}: {c.job(steady)}"
    assert policy_gres_registered(c), c.node_states()
    for gres, user, account, node in (
        ("shard:1", "bob", "physics", "gpu-s01"),
        ("mps:25", "carol", "biology", "gpu-m01"),
    ):
        job = submit(c, user, account, gres=gres)
        assert not ran_on(c, job, node), ran_on(c, job, node)
    assert c.job(steady).get("Restarts") == "0", c.job(steady)
    c.slurm(["scancel", str(steady)])


def running_on(c: TestCluster, job: int) -> str:
    """The node ``job`` runs on; "" while it does not run."""
    rec = c.job(job)
    return rec.get("NodeList", "") if rec.get("JobState") == "RUNNING" else ""
