"""docs/admins/switching.md gives the tested order of a switch on a live cluster, and the upgrade page's diff
compares like with like (a render against a render, from the policy the cluster runs)."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.unit.docs_support import gpushare_command_problem

PAGE = ROOT / "docs" / "admins" / "switching.md"
UPGRADING = ROOT / "docs" / "admins" / "upgrading.md"


def steps() -> dict[int, str]:
    """The step table: step number -> its row."""
    return {int(m[1]): m[0] for m in re.finditer(r"^\| (\d+) \|.*$", PAGE.read_text(), re.M)}


def step_of(needle: str) -> int:
    (found,) = [n for n, row in steps().items() if needle in row]
    return found


def test_the_steps_come_in_an_order_where_a_slurmd_restart_is_safe():
    table = steps()
    assert sorted(table) == list(range(1, len(table) + 1)) and len(table) >= 7
    assert all(row.count(" | ") == 3 and row.rstrip().endswith("|") for row in table.values())
    drain, accounts = step_of("drain the nodes of section 1"), step_of("gpushare accounts apply")
    nodes, controller = step_of("gpushare node install"), step_of("`gpushare install /etc/gpushare/policy.yaml`")
    reconfigure = step_of("`scontrol reconfigure`")
    # the nodes' hooks and gres include before any file names them; the QOS before the filter asks for them
    assert drain < nodes < controller < reconfigure and accounts < controller, table
    assert step_of("gpushare node gres-conf") == nodes


def test_the_page_covers_drain_configless_and_rollback():
    text = PAGE.read_text()
    assert "gpushare install /etc/gpushare/policy.yaml --dry-run" in text and "state=drain" in text
    configless = " ".join(text.split("## 3. Configless Slurm", 1)[1].split("\n## ", 1)[0].split())
    assert "enable_configless" in configless and "This is not tested" in configless
    assert "node-local" in configless and "gres_include" in configless
    rollback = " ".join(text.split("## 4. Rolling back", 1)[1].split("\n## ", 1)[0].split())
    for what in ("gpushare install --rollback", "gpushare node reconcile", "-mig 0", "-c DEFAULT", "mig.mode"):
        assert what in rollback, what
    assert "live.policy_file" in text


def test_each_gpushare_command_on_the_page_exists():
    lines = [
        line.strip()
        for block in re.findall(r"^```sh\n(.*?)^```$", PAGE.read_text(), re.M | re.S)
        for line in block.splitlines()
    ]
    commands = [line for line in lines if line.startswith("gpushare ")]
    assert commands
    for line in commands:
        assert not gpushare_command_problem(line), gpushare_command_problem(line)


def test_the_page_is_linked_from_the_nav_the_install_and_the_upgrade_pages():
    assert "admins/switching.md" in (ROOT / "mkdocs.yml").read_text()
    assert "(switching.md)" in (ROOT / "docs" / "admins" / "install.md").read_text()
    assert "(switching.md)" in UPGRADING.read_text()


def test_the_upgrade_diff_compares_a_render_with_a_render_from_the_policy_the_cluster_runs():
    text = UPGRADING.read_text()
    assert "--against /etc/slurm`" not in text and "--against /etc/slurm " not in text
    assert "gpushare diff POLICY --against /etc/gpushare/rendered" in text
    assert "live.policy_file" in text and "copy the files that changed" not in text
