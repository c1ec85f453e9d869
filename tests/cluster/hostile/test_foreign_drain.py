"""The health check heals only what our hooks broke (issue 21 part 4): another script's ``Prolog error`` and
an admin's drain stay drained.

Its own compose project: etc/small-lab.yaml (the health check on, slurmd's runs every 10 s) whose Prolog is a site's
own script,
``/usr/local/sbin/site-prolog``, that runs our prolog and then a site check of its own. The check fails
while ``/etc/site-check-fails`` exists: slurmctld drains the node ``Prolog error`` (as SlurmUser), exactly as
it does after our prolog fails. Ours finished (its journal was ``ready``) and it is not the only Prolog
slurmctld runs, so nothing attributes the failure to it: the health check, run as slurmd runs it and by
slurmd itself, must leave the node drained. Before the fix it resumed every ``Prolog error``, returning a
node the site's own check had taken out of service.

Run: GPUSHARE_REQUIRE_CLUSTER=1 flock /tmp/gpushare-cluster.lock \
  .venv/bin/python -m pytest -q tests/cluster/hostile/test_foreign_drain.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import POLICY, own_cluster, wait_for
from tests.cluster.test_node_health import drained_state, slurmd_health_runs
from tests.cluster.test_node_runtime import HOOKS, hooks_policy, node_shell, submit

PROJECT = os.environ.get("GPUSHARE_FOREIGN_DRAIN_PROJECT", "gpsh21foreign")
NODE = "lab-shard01"
SITE_PROLOG = "/usr/local/sbin/site-prolog"
HEALTH = "/usr/local/sbin/gpushare-node-health"
INTERVAL = 10  # slurmd's health runs, every INTERVAL s (the policy's least; bundled: a minute)
SCRIPT = f"""#!/bin/sh
# a site's Prolog: gpushare's, then the site's own check
{HOOKS["prolog"]} || exit $?
if [ -e /etc/site-check-fails ]; then echo "site check: node out of service" >&2; exit 1; fi
exit 0
"""


def site_policy(path: Path) -> Path:
    hooks_policy(path)
    raw = yaml.safe_load(path.read_text())
    raw["cluster"]["hooks"]["prolog"] = SITE_PROLOG
    raw["cluster"]["health"] = yaml.safe_load(POLICY.read_text())["cluster"]["health"]  # as bundled, but for
    raw["cluster"]["health"]["interval"] = INTERVAL  # the interval: slurmd's own runs are waited for below
    path.write_text(
        "# small-lab.yaml with a site Prolog around gpushare's (tests/cluster/hostile/test_foreign_drain.py)\n"
        + yaml.safe_dump(raw, sort_keys=False)
    )
    return path


@pytest.fixture(scope="module")
def site_lab():
    yield from own_cluster(
        "foreign", PROJECT, lambda work: site_policy(work / "small-lab-site.yaml"), "GPUSHARE_FOREIGN_DRAIN_KEEP"
    )


def state(c) -> dict:
    return c.node_states()[NODE]


def health(c) -> str:
    """The program as slurmd runs it (root, no arguments, SLURMD_NODENAME)."""
    res = c.exec(NODE, ["env", f"SLURMD_NODENAME={NODE}", HEALTH], check=False, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_another_scripts_prolog_error_and_an_admin_drain_are_left_drained(site_lab):
    c = site_lab
    conf = c.exec("slurmctld", ["scontrol", "show", "config"]).stdout
    assert re.search(rf"^Prolog(\[0\])?\s*= {SITE_PROLOG}$", conf, re.M), conf  # 24.11: Prolog[0] = ...
    assert re.search(rf"^HealthCheckProgram\s*= {HEALTH}$", conf, re.M), conf
    node_shell(
        c, NODE, f"cat > {SITE_PROLOG} <<'EOF'\n{SCRIPT}EOF\nchmod 755 {SITE_PROLOG}; touch /etc/site-check-fails"
    )
    job = submit(c, "true\n", gres="shard:1", nodelist=NODE)
    try:
        s = wait_for(f"{NODE} drained by the site check", lambda: drained_state(state(c)), 120)
        assert s["reason"] == "Prolog error", s
        out = health(c)
        assert "not attributed to the gpushare prolog" in out and "resume" not in out, out
        # slurmd's own runs too: two of them, seen start and end on the node
        runs = slurmd_health_runs(c, NODE, 2, timeout=6 * INTERVAL)
        assert runs >= 2, f"{runs} of slurmd's health runs on {NODE} in {6 * INTERVAL} s"
        s = state(c)
        assert "DRAIN" in s["state"] and s["reason"] == "Prolog error", s
        print(
            f"\n{NODE} drained 'Prolog error' by the site's own check; health: {out.strip().splitlines()[-1]}; "
            f"after {runs} of slurmd's health runs: {s['state']}"
        )
        # an admin's drain is left alone too, its reason kept
        c.scontrol("update", f"nodename={NODE}", "state=resume")
        node_shell(c, NODE, "rm -f /etc/site-check-fails")
        c.scontrol("update", f"nodename={NODE}", "state=drain", "reason=admin: PSU swap")
        out = health(c)
        s = state(c)
        assert "DRAIN" in s["state"] and s["reason"] == "admin: PSU swap" and "not resumed" in out, (s, out)
    finally:
        node_shell(c, NODE, "rm -f /etc/site-check-fails", check=False)
        c.slurm(["scancel", str(job)], check=False)
        c.scontrol("update", f"nodename={NODE}", "state=resume")
