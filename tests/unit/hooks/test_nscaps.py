"""Per-job MIG isolation on a node (node/nscaps.py, hooks/nscaps.py; issue 35, part 4): gpushare-ns-caps, run by
job_container/tmpfs as CloneNSScript, gives a per-job MIG job a private read-only /dev/nvidia-caps in its mount
namespace holding only its own instance's GI and CI capability files; it never drains the node, leaves jobs
without an isolated per-job device alone, and unmounts what it mounted when a later step fails. The commands
(nsenter ... mount/mknod) go to a recording runner here; the cluster test runs them in a job's namespace."""

from __future__ import annotations

import pytest
import yaml

from slurm_gpushare.gpu.migminors import (
    FAKE_CAPS_MAJOR,
    MigMinorsError,
    caps_major,
    ci_access_minor,
    gi_access_minor,
)
from slurm_gpushare.hooks import nscaps as nscaps_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node.journal import Device, Journal, JournalStore
from slurm_gpushare.node.nscaps import CAPS_DIR, NsCapsError, commands, plan_caps
from slurm_gpushare.proc import CommandError, Result
from tests.unit.hooks_support import ROOT, HookNode

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"


class Recorder:
    """The hook's runner: records each command; ``fail`` names a word whose command exits 1. A Slurm command
    (a drain) fails the test: the hook fails the job, never the node."""

    def __init__(self, fail: str | None = None):
        self.calls: list[tuple[str, ...]] = []
        self.fail = fail

    def __call__(self, argv, **_kw):
        argv = tuple(argv)
        assert "scontrol" not in argv[0], f"the node was drained: {argv}"
        self.calls.append(argv)
        if self.fail is not None and self.fail in argv:
            raise CommandError(Result(argv, 1, "", f"{self.fail}: failed"))
        return Result(argv, 0, "", "")

    def inside(self) -> list[tuple[str, ...]]:
        """The commands as run inside the namespace (nsenter's own words dropped)."""
        return [c[3:] for c in self.calls]


@pytest.fixture
def node(tmp_path):
    return HookNode(tmp_path, "lab-perjob01", POLICY)


def ns_env(node: HookNode, job: int) -> dict:
    ns = node.tmp / f"{job}.ns"
    ns.write_text("")  # stands for the bind-mounted namespace file Slurm names
    return node.env(job, "0", SLURM_NS=str(ns))


def made(node: HookNode, job: int) -> Device:
    assert prolog_hook.main(node.env(job, "0", SLURM_JOB_EXTRA="gpushare-mig=1g.5gb")) == 0
    return JournalStore(node.state_dir).read(job).devices[0]


def test_a_per_job_job_gets_only_its_own_gi_and_ci_capabilities_read_only(node):
    mine, neighbour = made(node, 61), made(node, 62)
    assert mine.minor == 0 and (mine.gi, mine.ci) != (neighbour.gi, neighbour.ci)
    run = Recorder()
    assert nscaps_hook.main(ns_env(node, 61), runner=run) == 0
    ns = str(node.tmp / "61.ns")
    assert all(c[:3] == ("nsenter", f"--mount={ns}", "--") for c in run.calls)
    steps = run.inside()
    assert steps[1][:2] == ("mount", "-t") and steps[1][-1] == CAPS_DIR
    assert steps[-1][:3] == ("mount", "-o", "remount,ro,mode=0755,nosuid,noexec,size=64k")
    nodes = {c[3]: (c[5], c[6], c[2]) for c in steps if c[0] == "mknod"}
    gi, ci = gi_access_minor(0, mine.gi), ci_access_minor(0, mine.gi, mine.ci)
    major = str(caps_major(fake=True))
    assert nodes == {
        f"{CAPS_DIR}/nvidia-cap{gi}": (major, str(gi), "0444"),
        f"{CAPS_DIR}/nvidia-cap{ci}": (major, str(ci), "0444"),
    }
    assert f"{CAPS_DIR}/nvidia-cap{gi_access_minor(0, neighbour.gi)}" not in nodes


def test_a_failure_after_the_mount_unmounts_it_and_fails_the_job_not_the_node(node, capsys):
    made(node, 63)
    run = Recorder(fail="mknod")
    assert nscaps_hook.main(ns_env(node, 63), runner=run) == 1
    assert run.inside()[-1] == ("umount", CAPS_DIR)
    err = capsys.readouterr().err
    assert err.startswith("gpushare-ns-caps: job 63: its private /dev/nvidia-caps:") and "mknod" in err


def test_a_failed_mount_leaves_nothing_to_unmount(node):
    made(node, 64)
    run = Recorder(fail="tmpfs")
    assert nscaps_hook.main(ns_env(node, 64), runner=run) == 1
    assert [c[0] for c in run.inside()] == ["mkdir", "mount"]


def test_jobs_without_an_isolated_per_job_device_keep_the_nodes_caps(node, tmp_path):
    run = Recorder()
    assert nscaps_hook.main(ns_env(node, 65), runner=run) == 0  # no journal: no GPU here
    assert run.calls == []
    raw = yaml.safe_load(POLICY.read_text())
    group = next(g for g in raw["node_groups"] if g["name"] == "lab-perjob")
    for entry in group["sharing"]:
        entry["isolation"] = "none"
    (tmp_path / "none").mkdir()
    other = HookNode(tmp_path / "none", "lab-perjob01", _write(tmp_path / "none.yaml", raw))
    made(other, 66)
    assert nscaps_hook.main(ns_env(other, 66), runner=run) == 0 and run.calls == []


def _write(path, raw):
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "value", ["", "relative/ns", "/var/spool/../../etc/passwd", "/a b/ns", "/ns\n", "/var/./ns", "/missing/.ns"]
)
def test_slurm_ns_is_checked(node, value, capsys):
    made(node, 67)
    env = node.env(67, "0", SLURM_NS=value)
    run = Recorder()
    assert nscaps_hook.main(env, runner=run) == 1 and run.calls == []
    assert "SLURM_NS" in capsys.readouterr().err


def test_the_job_id_comes_from_slurm_and_is_checked(node, capsys):
    env = ns_env(node, 68)
    env["SLURM_JOB_ID"] = "68;id"
    assert nscaps_hook.main(env, runner=Recorder()) == 1
    assert "SLURM_JOB_ID" in capsys.readouterr().err


def test_the_plan_takes_every_mig_instance_of_the_journal_and_names_what_it_cannot_find():
    table = {(1, 2, None): 300, (1, 2, 0): 301, (0, 5, None): 50, (0, 5, 1): 52}
    journal = Journal(
        7,
        1,
        1,
        "n",
        "ready",
        (
            Device(0, 1, "GPU-b", "mig", "MIG-1", 2, 0, "MIG-1", profile="1g.5gb", start=6, minor=1),
            Device(1, 0, "GPU-a", "mig", "MIG-2", 5, 1, "MIG-2", minor=0),  # a fixed layout's slice
            Device(2, 0, "GPU-a", "mig", profile="2g.10gb", minor=0),  # refused: not made
        ),
    )
    assert [n.minor for n in plan_caps(7, journal, table)] == [300, 301, 50, 52]
    assert plan_caps(7, journal, table)[1].what == "GPU 1 GI 2 CI 0"
    with pytest.raises(NsCapsError, match="has no capability for GPU 0 GI 5 CI 1"):
        plan_caps(7, journal, {k: v for k, v in table.items() if v != 52})
    old = Journal(7, 1, 1, "n", "ready", (Device(0, 1, "GPU-b", "mig", "MIG-1", 2, 0, "MIG-1", profile="1g.5gb"),))
    with pytest.raises(NsCapsError, match="device minor"):
        plan_caps(7, old, table)


def test_the_commands_are_argument_lists_in_order():
    argvs = commands("/var/spool/slurm/gpushare-ns/7/.ns", [], 509)
    assert [a[3] for a in argvs] == ["mkdir", "mount", "mount"]
    assert all(isinstance(w, str) for a in argvs for w in a)


def test_the_caps_major_is_the_drivers_or_the_fakes(tmp_path):
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 mem\n195 nvidia\n236 nvidia-caps\n\nBlock devices:\n  8 sd\n")
    assert caps_major(path=str(devices)) == 236
    devices.write_text("Character devices:\n  1 mem\n\nBlock devices:\n236 nvidia-caps\n")
    assert caps_major(fake=True, path=str(devices)) == FAKE_CAPS_MAJOR
    with pytest.raises(MigMinorsError, match="no nvidia-caps character device"):
        caps_major(path=str(devices))


def test_the_journal_is_read_without_waiting_for_other_jobs_prologs(node):
    """Another job's prolog holds the journal lock while it makes instances (tens of seconds, more than
    CloneNSScript_Wait): the hook reads its own job's journal, written whole, without the lock."""
    made(node, 69)
    store = JournalStore(node.state_dir)
    with store.locked():  # as a neighbour's prolog would, for the whole run
        run = Recorder()
        assert nscaps_hook.main(ns_env(node, 69), runner=run) == 0
    assert any(c[0] == "mknod" for c in run.inside())


def test_an_unreadable_journal_fails_the_job_and_is_left_for_the_lock_holders(node, capsys):
    made(node, 70)
    path = JournalStore(node.state_dir).file(70)
    with open(path, "w") as fh:
        fh.write("{not json")
    assert nscaps_hook.main(ns_env(node, 70), runner=Recorder()) == 1
    assert "70.json" in capsys.readouterr().err
    assert open(path).read() == "{not json"
