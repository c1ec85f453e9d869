"""Slurm's behaviour with a half-faked node: what protects the test cluster from itself."""

from __future__ import annotations

import time


def test_missing_gres_file_kills_slurmd(cluster):
    t0 = time.monotonic()
    res = cluster.oneoff_slurmd("lab-excl01", {"GPUSHARE_FAKE_GPUS_OMIT": "/dev/nvidia1"})
    waited = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "Waiting for gres.conf file /dev/nvidia1" in out
    assert "fatal: can't stat gres.conf file /dev/nvidia1" in out
    assert waited > 15, f"slurmd gave up after {waited:.0f} s, expected its ~20 s retry"


def test_gres_file_that_is_not_a_device_is_dropped(cluster):
    res = cluster.oneoff_slurmd("lab-excl01", {"GPUSHARE_FAKE_GPUS_REGULAR": "/dev/nvidia1"})
    out = res.stdout + res.stderr
    assert "/dev/nvidia1 is not a valid character or block device" in out
    assert "fatal" not in out  # silently dropped: slurmd carries on


def test_fully_faked_node_parses_cleanly(cluster):
    res = cluster.oneoff_slurmd("lab-excl01", {})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "not a valid character" not in out and "Waiting for gres.conf" not in out
    assert out.count("Gres Name=gpu Type=l40s") == 2
