"""`gpushare node relayout` (node/relayout.py) stopped after each of its side effects, as by `kill -9`, then run again:
the next run converges (the policy's layout, the include written from it, Slurm's GRES, the node back in service),
by re-observation (the module docstring says how).

A side effect is a Slurm command that changes something (the drain, the reconfigure, the resume), an NVML call
that changes the MIG layout, or the write of the gres include. ``Crash`` (a BaseException: no ``except`` of the
workflow takes it) is raised right after the step took effect. The fakes are test_repair.py's: the stateful fake
Slurm of one node (whose reconfigure reads the include) and the fake NVML, whose state is a file (a new process
sees what the killed one left).
"""

from __future__ import annotations

import re

import pytest

from slurm_gpushare.node.relayout import DRAIN_REASON, RelayoutError, parse_node_gres
from tests.unit.crash_support import Crash, Crasher
from tests.unit.hooks.test_repair import Clock, FakeSlurm, mig_node, relayout, relayout_policy  # noqa: F401

NVML_CHANGES = ("destroy_compute_instance", "destroy_gpu_instance", "create_gpu_instance", "create_compute_instance")
SLURM_CHANGES = {"state=drain": "drain", "reconfigure": "reconfigure", "state=resume": "resume"}
NEW = {("gpu", "a100_40g_3g.20gb"): 2}
# all-1g.5gb (7 GIs of one CI) to all-3g.20gb (2), with no job on the node: every side effect, in order
STEPS = (
    "drain",
    *(f"nvml destroy_compute_instance {i}" for i in range(1, 8)),
    *(f"nvml destroy_gpu_instance {i}" for i in range(1, 8)),
    "nvml create_gpu_instance 1",
    "nvml create_compute_instance 1",
    "nvml create_gpu_instance 2",
    "nvml create_compute_instance 2",
    "gres include",
    "reconfigure",
    "resume",
)


class CrashingSlurm(FakeSlurm):
    crasher: Crasher

    def __call__(self, argv, **kw):
        res = super().__call__(argv, **kw)
        if argv[0] == "scontrol" and argv[1] in ("update", "reconfigure"):
            word = argv[3] if argv[1] == "update" else argv[1]
            self.crasher.after(SLURM_CHANGES[word])
        return res


class CrashingBackend:
    """The open backend, its MIG changes followed by the crasher (numbered per kind)."""

    def __init__(self, backend, crasher: Crasher):
        self._backend, self._crasher, self._count = backend, crasher, dict.fromkeys(NVML_CHANGES, 0)

    def __getattr__(self, name):
        method = getattr(self._backend, name)
        if name not in NVML_CHANGES:
            return method

        def changed(*args, **kw):
            out = method(*args, **kw)
            self._count[name] += 1
            self._crasher.after(f"nvml {name} {self._count[name]}")
            return out

        return changed


@pytest.fixture
def crashing(mig_node, monkeypatch):  # noqa: F811
    """(one run as a new process would make it, the fake Slurm, the crasher)."""
    import slurm_gpushare.atomic as atomic

    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = CrashingSlurm("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    crasher = slurm.crasher = Crasher()
    write = atomic.atomic_write

    def write_then(path, text, *a, **kw):
        write(path, text, *a, **kw)
        crasher.after("gres include")

    monkeypatch.setattr(atomic, "atomic_write", write_then)

    def run() -> list[str]:
        with mig_node.backend() as backend:
            return relayout(mig_node, site, slurm, Clock(), CrashingBackend(backend, crasher)).run()

    return run, slurm, crasher


def include_types(node) -> list[str]:
    return re.findall(r"Type=(\S+)", (node.tmp / "etc" / "gres.d" / "mig.conf").read_text())


def test_the_steps_are_these(crashing):
    run, slurm, crasher = crashing
    assert run()[-1] == "node lab-mig01: resumed"
    assert tuple(crasher.seen) == STEPS


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_after_each_step_is_finished_by_the_next_run(crashing, mig_node, step):  # noqa: F811
    run, slurm, crasher = crashing
    crasher.at = step
    with pytest.raises(Crash):
        run()
    assert crasher.fired
    done = run()  # a new process
    assert parse_node_gres(slurm.gres) == NEW and "DRAIN" not in slurm.flags and slurm.reason == ""
    assert include_types(mig_node) == ["a100_40g_3g.20gb"] * 2
    assert done[-1] in (
        "node lab-mig01: resumed",
        "node lab-mig01: layout, gres include and Slurm's GRES match the policy; nothing to do",
    )
    if step == "resume":
        assert done[-1].endswith("nothing to do")
    elif step == "reconfigure":  # in sync, but drained by the run that stopped: only finished
        assert done == ["node lab-mig01: registered Gres=gpu:a100_40g_3g.20gb:2", "node lab-mig01: resumed"]
    slurm.calls.clear()
    assert run()[0].endswith("nothing to do")  # and then there is nothing left
    assert all(c[:2] != ["scontrol", "update"] and c[1:2] != ["reconfigure"] for c in slurm.calls)


def test_a_node_in_sync_drained_by_someone_else_is_left_drained(crashing):
    run, slurm, crasher = crashing
    run()
    slurm.flags.add("DRAIN")
    slurm.reason = "disk replaced: admin"
    assert run()[0].endswith("nothing to do") and "DRAIN" in slurm.flags and slurm.reason == "disk replaced: admin"
    slurm.reason = "gpushare relayout failed: timed out after 30 s waiting for GPU jobs 8 to end"
    assert run()[0].endswith("nothing to do") and "DRAIN" in slurm.flags  # a failure is the admin's to look at


def test_a_drain_reason_that_names_the_relayout_is_its_intent(crashing):
    run, slurm, crasher = crashing
    crasher.at = "drain"
    with pytest.raises(Crash):
        run()
    assert "DRAIN" in slurm.flags and slurm.reason == DRAIN_REASON


class RefusesDrains(FakeSlurm):
    def __call__(self, argv, **kw):
        if argv[:3] == ["scontrol", "update", f"nodename={self.node}"] and argv[3] == "state=drain":
            if argv[4].startswith("reason=gpushare relayout failed"):
                from slurm_gpushare.proc import CommandError, Result

                raise CommandError(
                    Result(tuple(argv), 1, "", "slurm_update error: Unable to contact slurm controller\n")
                )
        return super().__call__(argv, **kw)


def test_a_failure_whose_drain_fails_too_says_both(mig_node):  # noqa: F811
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = RefusesDrains(
        "lab-mig01",
        "gpu:a100_40g_1g.5gb:7",
        mig_node.tmp / "etc" / "gres.d" / "mig.conf",
        jobs={8: "gres/gpu:a100_40g_1g.5gb:1"},
    )
    with mig_node.backend() as backend, pytest.raises(RelayoutError) as exc:
        relayout(mig_node, site, slurm, Clock(), backend).run()
    text = str(exc.value)
    assert "timed out after 30 s waiting for GPU jobs 8 to end" in text
    assert "could not be drained with that reason" in text and "Unable to contact slurm controller" in text
    assert slurm.reason == DRAIN_REASON  # the intent stays: the next run finds the relayout unfinished
