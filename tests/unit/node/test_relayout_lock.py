"""`gpushare node relayout` (node/relayout.py) holds a node-local lock: two relayout runs on one node (two relayout
jobs, or an admin's run beside the live planner's) never both act. The other holder is a real process holding
the real flock."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from slurm_gpushare.node.relayout import RelayoutError, parse_node_gres
from tests.unit.hooks.test_repair import Clock, FakeSlurm, mig_node, relayout, relayout_policy  # noqa: F401


def _hold(path, started, release):
    """What another `gpushare node relayout` of the node does: the lock held, its pid in the file."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    started.set()
    release.wait(30)
    os.close(fd)


class Holder:
    """Another relayout of the node: a process holding the lock until released."""

    def __init__(self, path):
        ctx = multiprocessing.get_context("fork")
        self.started, self.release = ctx.Event(), ctx.Event()
        self.proc = ctx.Process(target=_hold, args=(path, self.started, self.release))

    def __enter__(self):
        self.proc.start()
        assert self.started.wait(30)
        return self

    def stop(self):
        self.release.set()
        self.proc.join(30)

    def __exit__(self, *exc):
        self.stop()


def setup(node):
    site = relayout_policy(node, "all-3g.20gb")
    slurm = FakeSlurm("lab-mig01", "gpu:a100_40g_1g.5gb:7", node.tmp / "etc" / "gres.d" / "mig.conf")
    return site, slurm, node.state_dir / "relayout.lock"


def test_a_relayout_while_another_holds_the_node_touches_nothing(mig_node):  # noqa: F811
    site, slurm, lock = setup(mig_node)
    with Holder(lock) as other, mig_node.backend() as backend:
        with pytest.raises(
            RelayoutError,
            match=rf"another `gpushare node relayout` \(pid {other.proc.pid}\) has "
            rf"held {lock} for 30 s; the node was not touched",
        ):
            relayout(mig_node, site, slurm, Clock(), backend).run()
    assert slurm.calls == [] and "DRAIN" not in slurm.flags  # not drained, not even asked about
    assert parse_node_gres(slurm.gres) == {("gpu", "a100_40g_1g.5gb"): 7}


def test_a_relayout_waits_for_the_other_then_finds_what_is_left_to_do(mig_node):  # noqa: F811
    site, slurm, lock = setup(mig_node)
    clock, lines = Clock(), []
    with Holder(lock) as other, mig_node.backend() as backend:

        def sleep(seconds):  # the other relayout ends while this one waits
            other.stop()
            clock.sleep(seconds)

        job = relayout(mig_node, site, slurm, clock, backend)
        job.sleep, job.say = sleep, lines.append
        done = job.run()
    assert lines[0] == f"node lab-mig01: waiting for the relayout of pid {other.proc.pid} ({lock})"
    assert done[-1] == "node lab-mig01: resumed" and parse_node_gres(slurm.gres) == {("gpu", "a100_40g_3g.20gb"): 2}
    assert lock.read_text() == f"{os.getpid()}\n"  # the last holder's pid, for the next one's message


def test_the_lock_is_not_taken_through_a_link(mig_node):  # noqa: F811
    site, slurm, lock = setup(mig_node)
    lock.parent.mkdir(parents=True, exist_ok=True)
    target = mig_node.tmp / "elsewhere"
    lock.symlink_to(target)
    with mig_node.backend() as backend, pytest.raises(RelayoutError, match="not a link"):
        relayout(mig_node, site, slurm, Clock(), backend).run()
    assert not target.exists() and slurm.calls == []
