"""The node hooks on real Slurm: MIG UUIDs, MPS daemons, clean nodes, drains, reconcile, relayout.

Runs its own compose project ("hooks") on a copy of etc/small-lab.yaml with
the hooks switched on (Prolog/Epilog/TaskProlog = the installed entry
points), so the shared cluster of the other cluster tests keeps its
configuration. The module fixture builds the images, brings the project up
and always takes it down (containers, network, volumes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.node.relayout import parse_node_gres
from slurm_gpushare.policy import load_file
from slurm_gpushare.testcluster.cluster import TestCluster
from tests.cluster.conftest import POLICY, mig_uuids_by_index, own_cluster, slurmd_start_time, wait_for
from tests.cluster.tuning import FAST_REQUEUE, tuned

PROJECT = os.environ.get("GPUSHARE_HOOKS_PROJECT", "hooks")
HOOKS = {
    "prolog": "/usr/local/sbin/gpushare-prolog",
    "epilog": "/usr/local/sbin/gpushare-epilog",
    "task_prolog": "/usr/local/bin/gpushare-task-prolog",
}
STATE = "/var/lib/gpushare"
FAKE = f"{STATE}/fake-nvml.json"
ENV_SCRIPT = "env | grep -E '^(CUDA_|SLURM_JOB_GPUS=|SLURM_STEP_GPUS=|GPU_DEVICE_ORDINAL=)' | sort\n"
NODES = ("lab-excl01", "lab-shard01", "lab-mig01", "lab-mps01")


def hooks_policy(path: Path) -> Path:
    """etc/small-lab.yaml with the three node hooks set to the installed entry points.

    GPUSHARE_HOOKS_JOB_SUBMIT=0 leaves job_submit.lua out, to tell a node-side
    failure from a submission-side one (these tests submit only valid requests)."""
    raw = yaml.safe_load(POLICY.read_text())
    raw["cluster"]["hooks"].update(HOOKS)
    # the bundled policy runs the health check every minute; slurmd runs it here only at its start and hourly, so
    # it cannot race the scenarios that leave a node in a state for `gpushare node reconcile` (or the test) to see
    raw["cluster"]["health"]["interval"] = 3600
    if os.environ.get("GPUSHARE_HOOKS_JOB_SUBMIT") == "0":
        raw["cluster"]["hooks"]["job_submit_lua"] = False
    path.write_text(
        "# small-lab.yaml with the node hooks on (tests/cluster/test_node_runtime.py)\n"
        + yaml.safe_dump(raw, sort_keys=False)
    )
    return path


@pytest.fixture(scope="module")
def hooks_cluster():
    # AuthInfo=cred_expire=30: the preempted job starts again 31 s after its requeue, not Slurm's default 121 s
    write, files = tuned(lambda work: hooks_policy(work / "small-lab-hooks.yaml"), FAST_REQUEUE)
    yield from own_cluster("hooks", PROJECT, write, "GPUSHARE_HOOKS_KEEP", conf_files=files)


# ---- helpers ----------------------------------------------------------------------------


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def submit(c: TestCluster, script: str, user: str = "carol", account: str = "biology", **opts) -> int:
    return c.sbatch(script, user=user, account=account, output="/shared/hooks-%j.out", **opts)


def finished(c: TestCluster, job: int, timeout: float = 240) -> tuple[dict, str]:
    rec = c.wait(job, timeout=timeout)
    assert rec["State"] == "COMPLETED", (rec, c.job(job))
    return rec, c.read_shared(f"hooks-{job}.out")


def node_shell(c: TestCluster, node: str, script: str, check: bool = True):
    return c.exec(node, ["bash", "-c", script], check=check)


def journals(c: TestCluster, node: str) -> list[str]:
    out = node_shell(c, node, f"ls {STATE}/jobs 2>/dev/null || true").stdout
    return [n for n in out.split() if n.endswith(".json")]


def mps_daemons(c: TestCluster, node: str = "lab-mps01") -> list[str]:
    out = node_shell(c, node, "pgrep -a -f '[n]vidia-cuda-mps-control -d' || true").stdout
    return [line for line in out.splitlines() if line.strip()]


def wait_clean(c: TestCluster, node: str, timeout: float = 90) -> None:
    """The epilog may still run after sacct says COMPLETED: wait until no journal is left."""
    wait_for(f"no journal on {node}", lambda: not journals(c, node), timeout)


def slurmd_pid(c: TestCluster, node: str) -> str:
    return node_shell(c, node, "cat /run/slurmd.pid 2>/dev/null || true").stdout.strip()


def kill_slurmd(c: TestCluster, node: str) -> None:
    """SIGKILL slurmd; the node's entrypoint starts it again (as slurmd.service's Restart=on-failure would) and
    its jobs' slurmstepd processes live on (KillMode=process)."""
    before, started = slurmd_pid(c, node), slurmd_start_time(c, node)
    node_shell(c, node, f"kill -9 {before}")
    wait_for(f"a new slurmd on {node}", lambda: slurmd_pid(c, node) not in ("", before), 60)
    # and registered with slurmctld (a job's cancel sent before then reaches no slurmd)
    wait_for(f"the new slurmd of {node} to register", lambda: slurmd_start_time(c, node) > started, 120)


def running(c: TestCluster, job: int) -> bool:
    return c.job(job).get("JobState") == "RUNNING"


# ---- MIG -------------------------------------------------------------------------------


def test_mig_job_sees_exactly_its_instance_uuid(hooks_cluster):
    c = hooks_cluster
    mig_type = c.site.group("lab-mig").gpus[0].mig_types()[0]
    _rec, out = finished(c, submit(c, ENV_SCRIPT + "nvidia-smi -L\n", gres=f"gpu:{mig_type}:1"))
    env = env_of(out)
    uuids = mig_uuids_by_index(c)
    assert len(uuids) == 7 and all(uuids)
    index = int(env["SLURM_JOB_GPUS"])
    assert env["CUDA_VISIBLE_DEVICES"] == uuids[index], f"index {index}: {env} vs {uuids}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert f"(UUID: {uuids[index]})" in out  # the fake nvidia-smi lists the same device
    wait_clean(c, "lab-mig01")


def test_two_concurrent_mig_jobs_see_different_uuids(hooks_cluster):
    c = hooks_cluster
    mig_type = c.site.group("lab-mig").gpus[0].mig_types()[0]
    script = ENV_SCRIPT + "sleep 12\n"
    jobs = [
        submit(c, script, user=u, account=a, gres=f"gpu:{mig_type}:1")
        for u, a in (("carol", "biology"), ("dave", "biology-imaging"))
    ]
    results = [finished(c, j) for j in jobs]
    (s1, e1), (s2, e2) = [(r["Start"], r["End"]) for r, _ in results]
    assert max(s1, s2) < min(e1, e2), f"the MIG jobs did not overlap: {s1}-{e1}, {s2}-{e2}"
    envs = [env_of(out) for _, out in results]
    uuids = mig_uuids_by_index(c)
    seen = [e["CUDA_VISIBLE_DEVICES"] for e in envs]
    assert seen[0] != seen[1] and all(s.startswith("MIG-") for s in seen), seen
    assert seen == [uuids[int(e["SLURM_JOB_GPUS"])] for e in envs]
    wait_clean(c, "lab-mig01")


# ---- MPS ---------------------------------------------------------------------------------


MPS_SCRIPT = (
    ENV_SCRIPT
    + """echo "PIPE_OWNER=$(stat -c %U "$CUDA_MPS_PIPE_DIRECTORY")"
echo "PIPE_MODE=$(stat -c %a "$CUDA_MPS_PIPE_DIRECTORY")"
echo "SERVERS=$(echo get_server_list | nvidia-cuda-mps-control | tr '\\n' ' ')"
echo "DAEMONS=$(pgrep -c -f '[n]vidia-cuda-mps-control -d')"
[ -r "$CUDA_MPS_LOG_DIRECTORY/control.log" ] && echo LOG_READABLE=1 || echo LOG_READABLE=0
"""
    + "HOLD=${HOLD:-0}\n"
    + "\n".join(
        [
            'if [ -n "${GO:-}" ]; then',  # held until the test makes the file $GO (HOLD s at most)
            '  end=$((SECONDS + HOLD)); while [ ! -e "$GO" ] && [ $SECONDS -lt $end ]; do sleep 0.2; done',
            "else sleep $HOLD; fi",
            "",
        ]
    )
)


def held(go: str, most: int = 120) -> str:
    """A job script that runs until the test makes the file ``go`` (in /shared), ``most`` seconds at most."""
    return f"end=$((SECONDS + {most}))\nwhile [ ! -e {go} ] && [ $SECONDS -lt $end ]; do sleep 0.2; done\n"


def release(c: TestCluster, go: str) -> None:
    c.exec("slurmctld", ["touch", go])


def test_mps_job_sees_pipe_dir_percentage_and_memory_limit(hooks_cluster):
    c = hooks_cluster
    _rec, out = finished(c, submit(c, MPS_SCRIPT, gres="mps:25"))
    env = env_of(out)
    memory = c.site.group("lab-mps").model.memory_mib
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory * 25 // 100}MB"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{STATE}/mps/g0-u2003-p25/pipe"
    assert env["CUDA_MPS_LOG_DIRECTORY"].endswith("/gpushare-mps/g0-u2003-p25")
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")  # Slurm sets none for mps jobs here
    assert env["PIPE_OWNER"] == "carol" and env["PIPE_MODE"] == "700"
    assert env["SERVERS"].split() and env["DAEMONS"] == "1"
    assert env["LOG_READABLE"] == "0"  # the daemon's logs are root's only (docs/admins/mps-security.md)
    logged = node_shell(
        c,
        "lab-mps01",
        f"grep -c 'Cmd:set_default_active_thread_percentage' {env['CUDA_MPS_LOG_DIRECTORY']}/control.log",
    ).stdout.strip()
    assert int(logged) >= 1, logged
    wait_clean(c, "lab-mps01")
    assert mps_daemons(c) == []
    assert node_shell(c, "lab-mps01", f"ls {STATE}/mps").stdout.split() == []


def test_mps_daemon_lives_until_the_last_job_on_the_gpu_ends(hooks_cluster):
    c = hooks_cluster
    go = "/shared/hooks-go-long"
    c.exec("slurmctld", ["rm", "-f", go])
    short = submit(c, "HOLD=2\n" + MPS_SCRIPT, gres="mps:25")
    long = submit(c, f"HOLD=120 GO={go}\n" + MPS_SCRIPT, gres="mps:25")  # runs until released below
    finished(c, short)
    assert running(c, long), c.job(long)
    wait_for("the short job's journal to go", lambda: len(journals(c, "lab-mps01")) == 1, 60)
    assert len(mps_daemons(c)) == 1, "the daemon stopped while a job still used it"
    release(c, go)
    _rec, out = finished(c, long)
    assert env_of(out)["DAEMONS"] == "1"  # both jobs shared one daemon
    wait_clean(c, "lab-mps01")
    assert mps_daemons(c) == []


def test_killed_mps_daemon_is_replaced_by_the_next_job_without_a_drain(hooks_cluster):
    """The MPS control daemon dies (SIGKILL, as the OOM killer does) while its job runs. The next job of the same
    user and share starts a fresh daemon (no drain, no hold), both jobs end, and nothing is left."""
    c = hooks_cluster
    go = "/shared/hooks-go-first"
    c.exec("slurmctld", ["rm", "-f", go])
    first = submit(c, held(go), gres="mps:25")  # runs until released below
    wait_for("the first MPS job to run", lambda: running(c, first), 120)
    wait_for("its daemon", lambda: len(mps_daemons(c)) == 1, 30)
    node_shell(c, "lab-mps01", "pkill -9 -f '[n]vidia-cuda-mps-control -d'")
    wait_for("the daemon to be gone", lambda: mps_daemons(c) == [], 10)
    second_rec, out = finished(c, submit(c, "HOLD=2\n" + MPS_SCRIPT, gres="mps:25"))
    assert env_of(out)["DAEMONS"] == "1", out  # a fresh daemon served it
    release(c, go)
    finished(c, first)
    wait_clean(c, "lab-mps01")
    assert mps_daemons(c) == []
    # nor the killed daemon's server, which outlived it (the fake's do, as real ones can)
    assert node_shell(c, "lab-mps01", "pgrep -a -f '[n]vidia-cuda-mps' || true").stdout.strip() == ""
    node = c.client().node("lab-mps01")
    assert "DRAIN" not in node.state, (node.state, node.reason)


# ---- preemption with a grace period ----------------------------------------------------

# A checkpointing scavenger job as the README tells users to write one: the work runs in a step (srun), which
# is what Slurm signals at preemption; it traps SIGTERM, writes its checkpoint and ends. With --requeue and
# preempt_mode requeue, Slurm 24.11 counts a job that ends while signalled for its grace time as preempted and
# requeues it (slurmctld proc_req.c, GRACE_PREEMPT), freeing the GPU at once. On its restart
# (SLURM_RESTART_COUNT=1) it resumes from the checkpoint.
CHECKPOINTING = r"""#SBATCH --requeue
log=/shared/preempt-$SLURM_JOB_ID.log ck=/shared/preempt-$SLURM_JOB_ID.ckpt
echo "start restart=${SLURM_RESTART_COUNT:-0} resume=$(cat $ck 2>/dev/null || echo none) \
daemons=$(pgrep -c -f '[n]vidia-cuda-mps-control -d')" >> $log
[ -f $ck ] && exit 0
srun bash -c "trap 'echo step=7 > $ck; echo term-at=\$(date +%s) >> $log; exit 0' TERM; \
echo armed >> $log; sleep 600 & wait"
"""


def test_preempted_job_checkpoints_in_its_grace_time_is_requeued_and_resumes(hooks_cluster):
    """A scavenger MPS job holding the whole GPU is preempted by a batch-tier MPS job: SIGTERM, 15 s grace
    (the small lab's scavenger grace_time), requeue; the batch job runs; the scavenger job restarts with
    SLURM_RESTART_COUNT=1, resumes from its checkpoint and completes; nothing of its first run is left."""
    c = hooks_cluster
    grace = c.site.tiers[[t.name for t in c.site.tiers].index("scavenger")].spec.grace_time
    assert grace == 15
    low = submit(c, CHECKPOINTING, user="alice", account="physics", gres="mps:100", partition="scavenger")
    log = f"preempt-{low}.log"
    wait_for(
        "the scavenger job's step to run",
        lambda: (
            running(c, low) and "start restart=0" in c.exec("slurmctld", ["cat", f"/shared/{log}"], check=False).stdout
        ),
        90,
    )
    wait_for("the scavenger job's MPS daemon", lambda: len(mps_daemons(c)) == 1, 30)
    wait_for(
        "the step's trap to be set",
        lambda: "armed" in c.exec("slurmctld", ["cat", f"/shared/{log}"]).stdout.split(),
        60,
        every=0.5,
    )
    high = submit(c, "sleep 5\n", user="bob", account="physics", gres="mps:50", partition="batch")
    wait_for(
        "the checkpoint",
        lambda: c.exec("slurmctld", ["cat", f"/shared/preempt-{low}.ckpt"], check=False).stdout.strip() == "step=7",
        60,
    )
    finished(c, high, timeout=180)
    rec = c.wait(low, timeout=400)  # the requeued job waits for its new begin time (cred_expire + 1 s), then runs again
    assert rec["State"] == "COMPLETED", (rec, c.job(low))
    lines = c.read_shared(log).splitlines()
    starts = [line for line in lines if line.startswith("start ")]
    assert starts[0].startswith("start restart=0 resume=none") and starts[1].startswith(
        "start restart=1 resume=step=7"
    ), lines
    assert any(line.startswith("term-at=") for line in lines), lines
    runs = c.sacct(low, extra=["-D"])
    assert [r["State"].split()[0] for r in runs] in (["REQUEUED", "COMPLETED"], ["PREEMPTED", "COMPLETED"]), runs
    wait_clean(c, "lab-mps01")
    assert mps_daemons(c) == []


# ---- exclusive and failures -------------------------------------------------------------


def test_exclusive_job_env_unchanged_but_device_order(hooks_cluster):
    c = hooks_cluster
    script = ENV_SCRIPT + "/usr/local/bin/gpushare-task-prolog | sed 's/^/TASKPROLOG: /'\n"
    _rec, out = finished(c, submit(c, script, gres="gpu:l40s:1", nodelist="lab-excl01"))
    # The task prolog, run again inside the job, changes one thing only.
    assert [line for line in out.splitlines() if line.startswith("TASKPROLOG: ")] == [
        "TASKPROLOG: export CUDA_DEVICE_ORDER=PCI_BUS_ID"
    ], out
    env = env_of("\n".join(line for line in out.splitlines() if not line.startswith("TASKPROLOG: ")))
    # What Slurm sets for an exclusive GPU (seen with the hooks off), plus CUDA_DEVICE_ORDER only.
    assert set(env) == {"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_JOB_GPUS", "CUDA_DEVICE_ORDER"}, env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["GPU_DEVICE_ORDINAL"] == "0"
    assert env["SLURM_JOB_GPUS"] in ("0", "1") and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    wait_clean(c, "lab-excl01")


def test_forced_prolog_failure_drains_with_readable_reason(hooks_cluster):
    c = hooks_cluster
    fake = ["gpushare", "node", "fake-nvml"]
    for gpu in (0, 1):  # a stranger's CUDA process on both GPUs: the prolog must refuse
        c.exec("lab-excl01", fake + ["add-process", "--state", FAKE, "--gpu", str(gpu), "--pid", str(4240 + gpu)])
    job = submit(c, "true\n", gres="gpu:l40s:1", nodelist="lab-excl01")

    def drained():
        state = c.node_states()["lab-excl01"]
        return state if "DRAIN" in state["flags"] else None

    try:
        reason = wait_for("lab-excl01 to drain", drained, 120)["reason"]
        assert re.match(
            rf"gpushare-prolog: job {job} on lab-excl01: GPU [01] \(GPU-[0-9a-f-]+\) is busy before the job "
            r"starts: processes 424[01]",
            reason,
        ), reason
    finally:
        for gpu in (0, 1):
            c.exec("lab-excl01", fake + ["remove-process", "--state", FAKE, "--pid", str(4240 + gpu)], check=False)
        c.slurm(["scancel", str(job)], check=False)
        c.scontrol("update", "nodename=lab-excl01", "state=resume")
    c.wait_idle(timeout=120)
    assert journals(c, "lab-excl01") == []


# ---- crashes: reconcile ------------------------------------------------------------------------


def reconcile(c: TestCluster, node: str, *extra: str):
    return c.exec(
        node,
        ["gpushare", "node", "reconcile", "--policy", "/etc/gpushare/policy.yaml", "--fake-nvml", FAKE, *extra],
        check=False,
        timeout=120,
    )


def test_killed_slurmd_mid_job_then_reconcile_leaves_the_node_clean(hooks_cluster):
    c = hooks_cluster
    job = submit(c, "sleep 600\n", gres="mps:25")
    wait_for("the MPS job to run", lambda: running(c, job), 120)
    wait_for("its daemon", lambda: mps_daemons(c), 30)
    assert journals(c, "lab-mps01") == [f"{job}.json"]
    # slurmd dies (SIGKILL, by its pid file) and is started again; the job's slurmstepd lives on, as on a real node
    kill_slurmd(c, "lab-mps01")
    assert running(c, job), c.job(job)  # its slurmstepd lived on
    c.slurm(["scancel", str(job)], check=False)
    c.wait_idle(timeout=240)
    wait_clean(c, "lab-mps01")  # the epilog ran (the new slurmd knew the job)
    res = reconcile(c, "lab-mps01")
    assert res.returncode == 0, res.stdout + res.stderr
    assert journals(c, "lab-mps01") == [] and mps_daemons(c) == []
    # the root-only .aside (where a stopped daemon's dir is moved before its removal) stays, empty
    assert node_shell(c, "lab-mps01", f"ls -A {STATE}/mps {STATE}/mps/.aside").stdout.split() == [
        f"{STATE}/mps:",
        ".aside",
        f"{STATE}/mps/.aside:",
    ]


def test_reconcile_cleans_what_an_interrupted_prolog_left(hooks_cluster):
    """A prolog whose slurmd died right after it ran leaves a journal and a daemon for a job Slurm does not run."""
    c = hooks_cluster
    env = [
        "env",
        "-i",
        "SLURM_JOB_ID=999999",
        "SLURM_JOB_UID=2003",
        "SLURM_JOB_GID=2000",
        "SLURMD_NODENAME=lab-mps01",
        "SLURM_JOB_GPUS=0",
        "CUDA_VISIBLE_DEVICES=0",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
    ]
    c.exec("lab-mps01", env + [HOOKS["prolog"]])
    assert journals(c, "lab-mps01") == ["999999.json"] and len(mps_daemons(c)) == 1
    dry = reconcile(c, "lab-mps01", "--dry-run")
    assert dry.returncode == 0 and "would: node lab-mps01: job 999999 is not running here" in dry.stdout, dry.stdout
    assert "stop MPS daemon g0-u2003-p40 (last job using it)" in dry.stdout
    assert journals(c, "lab-mps01") == ["999999.json"] and len(mps_daemons(c)) == 1  # a dry run changes nothing
    res = reconcile(c, "lab-mps01")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node lab-mps01: job 999999 is not running here" in res.stdout
    assert journals(c, "lab-mps01") == [] and mps_daemons(c) == []
    assert reconcile(c, "lab-mps01").stdout.strip().endswith("nothing to reconcile")


# ---- relayout (last: it changes the MIG node's layout) ----------------------------------------

# What the driver (nvidia-modprobe) provides on a real node: a device file for every GI and CI access
# capability of GPU 0 in mig-minors, so the new instances' files exist when slurmd re-reads gres.conf.
MAKE_CAPS = f"""
import os, re, stat
major = os.major(os.stat('/dev/nvidia-caps/nvidia-cap66').st_rdev)
for line in open('{FAKE}.mig-minors'):
    m = re.fullmatch(r'gpu0/gi\\d+(/ci\\d+)?/access (\\d+)', line.strip())
    path = m and f'/dev/nvidia-caps/nvidia-cap{{m[2]}}'
    if path and not os.path.exists(path):
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, int(m[2])))
"""


def test_relayout_changes_the_mig_layout_and_the_node_returns_with_new_counts(hooks_cluster):
    c = hooks_cluster
    raw = yaml.safe_load(c.policy.read_text())
    for group in raw["node_groups"]:
        if group["name"] == "lab-mig":
            group["sharing"][0]["layout"] = "all-3g.20gb"
    raw["submission"]["aliases"].pop("small", None)  # it names the old layout's type
    new_policy = c.workdir / "small-lab-relayout.yaml"
    new_policy.write_text(yaml.safe_dump(raw, sort_keys=False))
    new = load_file(new_policy)
    want = new.group("lab-mig").gres
    # the new slurm.conf goes out first (not yet read: relayout's reconfigure makes Slurm read it)
    c.write_config(new)
    c.compose("run", "--rm", "--no-deps", "config", timeout=120)
    c.exec("slurmctld", ["tee", "/shared/relayout-policy.yaml"], input=new_policy.read_text())
    c.exec("lab-mig01", ["python3", "-c", MAKE_CAPS])
    res = c.exec(
        "lab-mig01",
        [
            "gpushare",
            "node",
            "relayout",
            "--policy",
            "/shared/relayout-policy.yaml",
            "--fake-nvml",
            FAKE,
            "--timeout",
            "300",
        ],
        check=False,
        timeout=700,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node lab-mig01: resumed" in res.stdout
    state = c.node_states()["lab-mig01"]
    assert parse_node_gres(state["gres"]) == want, state
    c.wait_idle(timeout=240)
    mig_type = new.group("lab-mig").gpus[0].mig_types()[0]
    _rec, out = finished(c, submit(c, ENV_SCRIPT, gres=f"gpu:{mig_type}:1"))
    env = env_of(out)
    assert env["CUDA_VISIBLE_DEVICES"] == mig_uuids_by_index(c)[int(env["SLURM_JOB_GPUS"])]
    assert len(mig_uuids_by_index(c)) == 2
