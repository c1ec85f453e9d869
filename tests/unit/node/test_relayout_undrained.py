"""`gpushare node relayout` (node/relayout.py) when the reconfigure leaves the node undrained, as Slurm 24.11 did
in tests/cluster/test_live_planner.py for an exclusive GPU turned into shards: no resume (Slurm would refuse it,
"Invalid node state specified"), the relayout succeeds."""

from __future__ import annotations

from slurm_gpushare.node.relayout import parse_node_gres
from slurm_gpushare.proc import CommandError, Result
from tests.unit.hooks.test_repair import Clock, FakeSlurm, mig_node, relayout, relayout_policy  # noqa: F401


class DropsDrain(FakeSlurm):
    def __call__(self, argv, **kw):
        if list(argv) == ["scontrol", "update", f"nodename={self.node}", "state=resume"] and "DRAIN" not in self.flags:
            raise AssertionError("resume of an undrained node: Slurm refuses it (Invalid node state specified)")
        res = super().__call__(argv, **kw)
        if list(argv) == ["scontrol", "reconfigure"]:
            self.flags.discard("DRAIN")
            self.reason = ""
        return res


def test_a_reconfigure_that_drops_the_drain_needs_no_resume(mig_node):  # noqa: F811
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = DropsDrain("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    with mig_node.backend() as backend:
        done = relayout(mig_node, site, slurm, Clock(), backend).run()
    assert parse_node_gres(slurm.gres) == {("gpu", "a100_40g_3g.20gb"): 2} and "DRAIN" not in slurm.flags
    assert done[-1] == "node lab-mig01: not drained any more after the reconfigure: nothing to resume"
    assert ["scontrol", "update", "nodename=lab-mig01", "state=resume"] not in slurm.calls


class RefusesResumeOnce(FakeSlurm):
    refused = 0

    def __call__(self, argv, **kw):
        if list(argv) == ["scontrol", "update", f"nodename={self.node}", "state=resume"] and not self.refused:
            self.refused += 1
            self.calls.append(list(argv))
            raise CommandError(Result(tuple(argv), 1, "", "slurm_update error: Invalid node state specified\n"))
        return super().__call__(argv, **kw)


def test_a_refused_resume_is_tried_again(mig_node):  # noqa: F811
    site = relayout_policy(mig_node, "all-3g.20gb")
    slurm = RefusesResumeOnce("lab-mig01", "gpu:a100_40g_1g.5gb:7", mig_node.tmp / "etc" / "gres.d" / "mig.conf")
    with mig_node.backend() as backend:
        done = relayout(mig_node, site, slurm, Clock(), backend).run()
    assert slurm.refused == 1 and "DRAIN" not in slurm.flags and done[-1] == "node lab-mig01: resumed"
    assert slurm.calls.count(["scontrol", "update", "nodename=lab-mig01", "state=resume"]) == 2
