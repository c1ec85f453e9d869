"""The policy's nodes whose GRES the install changes: drained before the switch (docs/admins/switching.md)."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.siteconf import conf
from slurm_gpushare.siteconf.gresdiff import gres_changes, gres_items, node_gres
from tests.unit.siteconf.conftest import cluster_test_site


def test_gres_items_write_counts_out_and_drop_socket_bindings():
    assert gres_items("gpu:2(S:0-1),shard:8") == {"gpu:2", "shard:8"}
    assert gres_items("gpu") == {"gpu:1"}
    assert gres_items(None) == gres_items("(null)") == frozenset()


def test_the_last_definition_wins_and_defaults_fill_in():
    lines = conf.parse(
        "NodeName=DEFAULT Gres=gpu:4\nNodeName=a[1-2] CPUs=8\nNodeName=b Gres=gpu:a100:2\nNodeName=a2 Gres=gpu:1\n"
    )
    assert node_gres(lines) == {"a1": {"gpu:4"}, "a2": {"gpu:1"}, "b": {"gpu:a100:2"}}


def test_changed_nodes_are_those_defined_now_with_other_gres():
    now = {"a": frozenset({"gpu:2"}), "b": frozenset({"gpu:l40s:2"}), "c": frozenset({"gpu:1"})}
    after = {"a": frozenset({"gpu:l40s:2"}), "b": frozenset({"gpu:l40s:2"}), "new": frozenset({"gpu:1"})}
    assert gres_changes(now, after, ["a", "b", "new"]) == {"a": ("gpu:2", "gpu:l40s:2")}
    assert gres_changes(now, after, ["c"]) == {"c": ("gpu:1", "(none)")}


def test_install_names_the_nodes_to_drain_and_none_once_installed(tmp_path):
    """Before the install every policy node of the site changes (untyped GPUs become typed, shards, MPS); the
    node outside the policy never does; once installed, the same policy changes nothing."""
    site, policy = cluster_test_site(tmp_path)
    before = CliRunner().invoke(main, ["install", str(policy), "--gres-changes"])
    assert before.exit_code == 0 and before.output == "gpu-a01,gpu-m01,gpu-s01\n", before.output
    assert not (site / "slurm-gpushare.conf").exists()
    dry = CliRunner().invoke(main, ["install", str(policy), "--dry-run"])
    (note,) = [line for line in dry.output.splitlines() if line.startswith("note: GRES change")]
    assert note.startswith(
        "note: GRES change on 3 node(s): gpu-a01,gpu-m01,gpu-s01 "
        "(gpu-a01 gpu:2 -> gpu:a100_40g:1,gpu:a100_40g_3g.20gb:2;"
    )
    assert CliRunner().invoke(main, ["install", str(policy)]).exit_code == 0
    after = CliRunner().invoke(main, ["install", str(policy), "--gres-changes"])
    assert after.exit_code == 0 and after.output == "\n", after.output
