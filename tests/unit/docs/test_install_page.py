"""docs/admins/install.md's cluster-runnable blocks (run by tests/cluster/test_install_plain_slurm.py) are well
formed, cover every step, and name commands the CLI has; `gpushare node install` takes the fake NVML from the
environment as the other node commands do (how that test gives the page's commands its nodes' stand-in GPUs)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from tests.conftest import ROOT
from tests.unit.docs_support import cluster_blocks, gpushare_command_problem, runnable_blocks

PAGE = ROOT / "docs" / "admins" / "install.md"
BLOCKS = cluster_blocks(PAGE)
SWITCHING = ROOT / "docs" / "admins" / "switching.md"  # run by tests/cluster/test_install_existing_site.py
SWITCHING_BLOCKS = cluster_blocks(SWITCHING)


def test_the_install_page_has_a_block_for_every_step_and_role():
    text = PAGE.read_text()
    roles = [b.node for b in BLOCKS]
    assert {"all", "controller", "gpu", "outside", "mig"} == set(roles), roles
    scripts = "\n".join(b.script for b in BLOCKS)
    for step in (
        "pip install 'slurm-gpushare[nvml]'",
        "gpushare validate",
        "gpushare render",
        "gpushare install /etc/gpushare/policy.yaml",
        "gpushare node install",
        "gpushare node install --outside-policy",
        "gpushare node gres-conf",
        "scontrol reconfigure",
        "gpushare accounts apply",
        "slurm_gpushare.systemd",
        "gpushare-exporter.service",
        "gpushare-live.service",
        "gpushare install --slurm-conf-dir /etc/slurm --rollback",
        "gpushare node reconcile",
        "state=resume",
    ):
        assert step in scripts, step
    rollback = text.splitlines().index("## Rolling back") + 1
    assert [b.node for b in BLOCKS if b.line > rollback] == ["controller", "gpu", "controller"]
    assert not runnable_blocks(PAGE)  # none of them runs on the unit tier


def test_the_switching_page_runs_its_steps_in_the_tables_order():
    scripts = [b.script for b in SWITCHING_BLOCKS]
    order = ("gpushare render", "--gres-changes", "accounts apply", "node install --policy", "--outside-policy")
    order += ("gpushare install /etc/gpushare/policy.yaml\n", "scontrol reconfigure", "state=resume")
    found = [next(i for i, text in enumerate(scripts) if step in text + "\n") for step in order]
    assert found == sorted(found), dict(zip(order, found, strict=True))
    assert not runnable_blocks(SWITCHING)


@pytest.mark.parametrize("block", BLOCKS + SWITCHING_BLOCKS, ids=[b.id for b in BLOCKS + SWITCHING_BLOCKS])
def test_each_gpushare_command_of_a_block_exists(block):
    for line in block.script.splitlines():
        if line.startswith("gpushare "):
            assert not gpushare_command_problem(line), f"{block.id}: {gpushare_command_problem(line)}"


def test_a_cluster_marker_with_an_unknown_role_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- cluster-runnable node=login -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="node=login is not one of controller, gpu, outside, all, mig"):
        cluster_blocks(page)
    page.write_text("<!-- cluster-runnable node=gpu -->\n\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="cluster-runnable marker must be followed at once by a ```sh block"):
        cluster_blocks(page)


def test_node_install_takes_the_fake_nvml_from_the_environment(tmp_path):
    policy = ROOT / "etc" / "small-lab.yaml"
    done = CliRunner().invoke(
        main,
        ["node", "install", "--policy", str(policy), "--root", str(tmp_path)],
        env={"GPUSHARE_FAKE_NVML": "/var/lib/fake-nvml/state.json"},
    )
    assert done.exit_code == 0, done.output
    text = (tmp_path / "etc/gpushare/node.yaml").read_text()
    assert "fake_nvml: /var/lib/fake-nvml/state.json" in text.splitlines(), text
