"""`gpushare node reconcile` and `gpushare node relayout` against a stateful fake Slurm (scontrol,
squeue as these commands use them; anything else raises) on the fake NVML."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml

from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.epilog import Killer, QuitMps
from slurm_gpushare.node.journal import JournalStore
from slurm_gpushare.node.reconcile import (
    ReconcileError,
    daemon_dirs,
    execute_reconcile,
    observe_reconcile,
    plan_reconcile,
    running_jobs,
)
from slurm_gpushare.node.relayout import Relayout, RelayoutError, fmt_gres, missing_devices, parse_node_gres
from slurm_gpushare.policy import load_file
from slurm_gpushare.proc import CommandError, Result, run
from slurm_gpushare.slurm.cli_backend import CliClient
from tests.unit.hooks_support import FAKE_MPS, HookNode, no_scontrol


class FakeSlurm:
    """One node as scontrol and squeue show it. Reconfigure re-reads the node's gres include."""

    def __init__(self, node: str, gres: str, include: Path | None = None, jobs=None):
        self.node, self.gres, self.include = node, gres, include
        self.flags, self.reason = {"IDLE"}, ""
        self.jobs = dict(jobs or {})  # job id -> TRES per node
        self.calls: list[list[str]] = []
        self.finish_after: dict[int, int] = {}  # job id -> squeue calls until it ends
        self.started: dict[int, int] = {}  # job id -> start time (epoch s); unset: started just now
        self.requeued: list[int] = []
        self.interactive: set[int] = set()  # jobs with no batch script (salloc, srun): batch flag 0
        self.ended: set[int] = set()  # jobs that ended here and Slurm still knows (MinJobAge): requeue works

    def __call__(self, argv, *, input=None, timeout=60.0, check=True, env=None):
        argv = list(argv)
        self.calls.append(argv)
        n = self.node
        if argv == ["scontrol", "show", "node", n, "--json"]:
            state = sorted(self.flags, key=lambda f: f != "IDLE")
            return self._ok(
                json.dumps(
                    {
                        "nodes": [
                            {
                                "name": n,
                                "architecture": "x86_64",
                                "gres": self.gres,
                                "state": state,
                                "reason": self.reason,
                            }
                        ]
                    }
                )
            )
        if (
            argv[:3] == ["scontrol", "update", f"nodename={n}"]
            and argv[3] == "state=drain"
            and argv[4].startswith("reason=")
        ):
            self.flags.add("DRAIN")
            self.reason = argv[4][len("reason=") :]
            return self._ok("")
        if argv == ["scontrol", "update", f"nodename={n}", "state=resume"]:
            self.flags.discard("DRAIN")
            self.reason = ""
            return self._ok("")
        if argv == ["scontrol", "reconfigure"]:
            self.gres = self._registered()
            return self._ok("")
        gpu_jobs = argv[4:5] == ["--Format"] and argv[:4] == ["squeue", "-w", n, "-h"]
        if gpu_jobs or (argv[:4] == ["squeue", "-w", n, "-h"] and argv[4:] == ["-o", "%A"]):
            for job in list(self.finish_after):
                self.finish_after[job] -= 1
                if self.finish_after[job] < 0:
                    self.jobs.pop(job)
                    del self.finish_after[job]
            if argv[-1] == "%A":
                return self._ok("".join(f"{j}\n" for j in self.jobs))
            delim = argv[5].split(",")[0][len("JobID:") :]  # commands.gpu_jobs_on_node: the delimiter after each field
            assert argv[5] == f"JobID:{delim},tres-per-node:{delim}" and len(delim) > 8
            return self._ok("".join(f"{j}{delim}{t}{delim}\n" for j, t in self.jobs.items()))
        if argv == ["squeue", "-w", n, "-h", "-t", "RUNNING", "--Format", "JobID:|,StartTime:|,BatchHost:|,BatchFlag:"]:
            assert env and env.get("SLURM_TIME_FORMAT") == "%s", "start times are read as epoch seconds"
            return self._ok(
                "".join(
                    f"{j}|{self.started.get(j, int(time.time()))}|{n}|{int(j not in self.interactive)}\n"
                    for j in self.jobs
                )
            )
        if argv[:2] == ["scontrol", "requeue"] and len(argv) == 3 and int(argv[2]) in self.interactive:
            # slurmctld's ESLURM_BATCH_ONLY (job_mgr.c _job_requeue_op)
            result = Result(tuple(argv), 1, "", "Requeue of JobId=... returned an error: Only batch jobs are accepted")
            if check:
                raise CommandError(result)
            return result
        if argv[:2] == ["scontrol", "requeue"] and len(argv) == 3 and int(argv[2]) in {*self.jobs, *self.ended}:
            self.jobs.pop(int(argv[2]), None)
            self.ended.discard(int(argv[2]))
            self.requeued.append(int(argv[2]))
            return self._ok("")
        raise AssertionError(f"fake Slurm does not know {argv}")

    def _registered(self) -> str:
        types = re.findall(r"^NodeName=\S+ Name=gpu Type=(\S+) ", self.include.read_text(), re.M)
        return ",".join(f"gpu:{t}:{types.count(t)}" for t in sorted(set(types)))

    @staticmethod
    def _ok(out: str) -> Result:
        return Result(("fake",), 0, out, "")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(seconds, 1.0)


# ---- reconcile ----------------------------------------------------------------------------


def test_reconcile_undoes_orphans_keeps_running_jobs_and_stops_unnamed_daemons(mps_node):
    for job, pct in ((1, 25), (2, 25), (3, 50)):
        assert prolog_hook.main(mps_node.env(job, "0", pct), runner=no_scontrol, mps=mps_node.mps) == 0
    store = JournalStore(mps_node.state_dir)
    stray = store.dir / ".4.json.abc123"
    stray.write_text("{")
    # a daemon nobody's journal names (a prolog killed before it wrote its journal)
    lost = mps_node.state_dir / "mps" / "g0-u9-p10" / "pipe"
    lost.mkdir(parents=True)
    run(
        list(FAKE_MPS) + ["-d"],
        env={
            "CUDA_MPS_PIPE_DIRECTORY": str(lost),
            "CUDA_MPS_LOG_DIRECTORY": str(mps_node.tmp / "log"),
            "PATH": os.defpath,
        },
        timeout=20,
    )
    journals = store.all()
    slurm = FakeSlurm("lab-mps01", "gpu:a30:1,mps:a30:100", jobs={1: "gres/mps:25"})
    with mps_node.backend() as backend:
        plan = plan_reconcile(
            journals,
            running_jobs(CliClient(slurm), "lab-mps01"),
            observe_reconcile(journals, backend),
            daemon_dirs(str(mps_node.state_dir)),
            store.stray_temporaries(),
        )
        assert plan.kept == [1] and sorted(plan.orphans) == [2, 3]
        assert not any(isinstance(a, QuitMps) for a in plan.orphans[2])  # job 1 still uses that daemon
        assert [a.daemon.key for a in plan.orphans[3] if isinstance(a, QuitMps)] == [journals[3].mps.key]
        assert [a.daemon.key for a in plan.daemons] == ["g0-u9-p10"]
        lines = plan.lines("lab-mps01")
        assert lines[0] == "node lab-mps01: job 1 runs, journal kept" and any(
            "remove half-written file" in x for x in lines
        )
        assert execute_reconcile(plan, store, mps_node.mps, Killer(backend), journals) == []
    assert mps_node.journals() == ["1.json"] and not stray.exists()
    assert mps_node.mps.alive(journals[1].mps) and not mps_node.mps.alive(journals[3].mps)
    assert sorted(daemon_dirs(str(mps_node.state_dir))) == [journals[1].mps.key]


def test_running_jobs_parses_squeue_and_refuses_garbage():
    assert running_jobs(CliClient(FakeSlurm("n1", "", jobs={5: "", 12: ""})), "n1") == {5, 12}
    with pytest.raises(ReconcileError, match="unexpected job id"):
        running_jobs(CliClient(lambda argv, **kw: Result(tuple(argv), 0, "5\nJOBID\n", "")), "n1")


# ---- relayout -------------------------------------------------------------------------------


def relayout_policy(node: HookNode, layout: str) -> object:
    raw = yaml.safe_load(node.policy.read_text())
    for group in raw["node_groups"]:
        if group["name"] == "lab-mig":
            group["sharing"][0]["layout"] = layout
    raw["submission"]["aliases"].pop("small", None)  # it names the old layout's type
    path = node.tmp / f"policy-{layout}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_file(path)


@pytest.fixture
def mig_node(tmp_path):
    return HookNode(tmp_path, "lab-mig01")


def relayout(node: HookNode, site, slurm: FakeSlurm, clock: Clock, backend, **kw) -> Relayout:
    kw.setdefault("missing", lambda text: [])  # the device files of the new instances (made by the driver)
    return Relayout(
        site,
        "lab-mig01",
        backend,
        CliClient(slurm, timeout=60),
        JournalStore(node.state_dir),
        timeout=30,
        poll=1,
        say=lambda line: None,
        sleep=clock.sleep,
        clock=clock,
        **kw,
    )


def include_types(node: HookNode) -> list[str]:
    return re.findall(r"Type=(\S+)", (node.tmp / "etc" / "gres.d" / "mig.conf").read_text())


def test_relayout_changes_layout_include_and_slurm_then_resumes(mig_node):
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = FakeSlurm(
        "lab-mig01",
        "gpu:a100_40g_1g.5gb:7",
        mig_node.tmp / "etc" / "gres.d" / "mig.conf",
        jobs={8: "gres/gpu:a100_40g_1g.5gb:1", 9: "N/A"},
    )
    slurm.finish_after = {8: 2}
    clock = Clock()
    with mig_node.backend() as backend:
        done = relayout(mig_node, site, slurm, clock, backend).run()
    assert parse_node_gres(slurm.gres) == {("gpu", "a100_40g_3g.20gb"): 2} and "DRAIN" not in slurm.flags
    assert include_types(mig_node) == ["a100_40g_3g.20gb"] * 2
    steps = [
        c[3] if c[:2] == ["scontrol", "update"] else c[1] for c in slurm.calls if c[0] == "scontrol" and c[1] != "show"
    ]
    assert steps == ["state=drain", "reconfigure", "state=resume"]
    assert done[0] == "node lab-mig01: drained" and done[-1] == "node lab-mig01: resumed"
    assert any("destroy GPU instance" in line for line in done) and clock.now >= 2  # it waited for job 8, not job 9
    with mig_node.backend() as backend:  # and a second run has nothing to do, touching nothing
        slurm.calls.clear()
        assert relayout(mig_node, site, slurm, clock, backend).run()[0].endswith("nothing to do")
    assert all(c[:2] != ["scontrol", "update"] for c in slurm.calls)


def test_relayout_times_out_waiting_for_jobs_and_leaves_the_node_drained(mig_node):
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = FakeSlurm(
        "lab-mig01",
        "gpu:a100_40g_1g.5gb:7",
        mig_node.tmp / "etc" / "gres.d" / "mig.conf",
        jobs={8: "gres/gpu:a100_40g_1g.5gb:1"},
    )
    with mig_node.backend() as backend, pytest.raises(RelayoutError, match="relayout failed, node left drained"):
        relayout(mig_node, site, slurm, Clock(), backend).run()
    assert "DRAIN" in slurm.flags
    assert slurm.reason == "gpushare relayout failed: timed out after 30 s waiting for GPU jobs 8 to end"
    assert include_types(mig_node) == ["a100_40g_1g.5gb"] * 7  # nothing was changed


def test_relayout_refused_by_processes_leaves_the_node_drained(mig_node):
    site = relayout_policy(mig_node, "all-3g.20gb")
    mig_node.fake.add_process(0, 4242, gi=7, ci=0)
    slurm = FakeSlurm("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    with mig_node.backend() as backend, pytest.raises(RelayoutError):
        relayout(mig_node, site, slurm, Clock(), backend).run()
    assert "DRAIN" in slurm.flags and "processes are running on it (PIDs 4242)" in slurm.reason


def test_relayout_fails_when_the_node_does_not_register_the_new_counts(mig_node):
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = FakeSlurm("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    slurm._registered = lambda: "gpu:a100_40g_1g.5gb:7"  # slurmctld still has the old slurm.conf
    with mig_node.backend() as backend, pytest.raises(RelayoutError):
        relayout(mig_node, site, slurm, Clock(), backend).run()
    assert "DRAIN" in slurm.flags
    assert slurm.reason.startswith("gpushare relayout failed: the node did not register Gres=gpu:a100_40g_3g.20gb:2")


def test_relayout_will_not_restart_slurmd_onto_missing_device_files(mig_node):
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = FakeSlurm("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    with mig_node.backend() as backend, pytest.raises(RelayoutError):
        relayout(mig_node, site, slurm, Clock(), backend, missing=missing_devices).run()
    assert "DRAIN" in slurm.flags and "device files that do not exist: /dev/nvidia0" in slurm.reason
    assert not any(c == ["scontrol", "reconfigure"] for c in slurm.calls)


def test_missing_devices_checks_char_devices(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")  # a plain file is no device
    text = (
        "NodeName=n Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[12-13]\n"
        "NodeName=n Name=gpu File=/dev/null\n"
    )
    assert missing_devices(text, str(tmp_path)) == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
        "/dev/null",
    ]
    assert missing_devices("NodeName=n Name=gpu File=/dev/null\n") == []


def test_node_gres_parsing():
    assert parse_node_gres("gpu:l40s:1,shard:l40s:4(S:0)") == {("gpu", "l40s"): 1, ("shard", ""): 4}
    assert parse_node_gres("(null)") == {} and fmt_gres({("gpu", "a"): 2, ("mps", ""): 100}) == "gpu:a:2,mps:100"
