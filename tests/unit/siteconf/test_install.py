"""`gpushare install` on a realistic existing site: what it writes, what it refuses, and the rollback that gives
back every file byte for byte (cli/install.py, siteconf/install.py)."""

from __future__ import annotations

import os

from click.testing import CliRunner

from slurm_gpushare.cli import main
from tests.lua.harness import Script
from tests.unit.siteconf.conftest import policy_for, snapshot


def install(*args: str):
    return CliRunner().invoke(main, ["install", *args])


def test_install_keeps_the_site_and_rollback_restores_every_byte(tmp_path, site_dir):
    os.chmod(site_dir / "job_submit.lua", 0o640)
    before = snapshot(site_dir)
    policy = policy_for(tmp_path, site_dir)
    done = install(str(policy))
    assert done.exit_code == 0, done.output
    assert "chain Prolog: /etc/slurm/prolog.d/*" in done.output and "--rollback" in done.output
    assert (site_dir / "job_submit_site.lua").read_bytes() == before["job_submit.lua"][0]
    assert "Include slurm-gpushare.conf" in (site_dir / "slurm.conf").read_text()
    assert (site_dir / "slurm.conf").stat().st_mode & 0o7777 == before["slurm.conf"][1]
    again = install(str(policy))
    assert again.exit_code == 0 and again.output.rstrip().endswith(f"{site_dir}: nothing to do")
    undone = install("--slurm-conf-dir", str(site_dir), "--rollback")
    assert undone.exit_code == 0, undone.output
    assert snapshot(site_dir) == before
    assert "removed" in undone.output and "restored" in undone.output
    nothing = install("--slurm-conf-dir", str(site_dir), "--rollback")
    assert nothing.exit_code == 1 and "no install to roll back" in nothing.output


def test_the_site_job_submit_lua_is_never_replaced_without_being_kept(tmp_path, site_dir):
    before = snapshot(site_dir)
    res = install(str(policy_for(tmp_path, site_dir, site_lua=False)))
    assert res.exit_code == 1 and "refused, nothing written" in res.output
    assert "submission.site_lua" in res.output and "is the site's own" in res.output
    assert snapshot(site_dir) == before and not (site_dir / ".gpushare-backup").exists()


def test_dry_run_prints_and_writes_nothing(tmp_path, site_dir):
    before = snapshot(site_dir)
    res = install(str(policy_for(tmp_path, site_dir)), "--dry-run")
    assert res.exit_code == 0 and "would write:" in res.output
    assert "union AccountingStorageTRES: gres/gpu,license/matlab -> gres/gpu,license/matlab," in res.output
    assert snapshot(site_dir) == before


def test_an_edited_include_is_not_overwritten(tmp_path, site_dir):
    policy = policy_for(tmp_path, site_dir)
    assert install(str(policy)).exit_code == 0
    include = site_dir / "slurm-gpushare.conf"
    include.write_text(include.read_text() + "# an admin's edit\n")
    site_dir.joinpath("slurm.conf").write_text(site_dir.joinpath("slurm.conf").read_text() + "MaxJobCount=20000\n")
    res = install(str(policy))
    assert res.exit_code == 1 and "slurm-gpushare.conf was edited" in res.output
    assert install(str(policy), "--force").exit_code == 0
    assert "MaxJobCount=20000" in (site_dir / "slurm.conf").read_text()  # the admin's later line stays


def test_the_installed_job_submit_lua_runs_the_site_rule(tmp_path, site_dir):
    assert install(str(policy_for(tmp_path, site_dir))).exit_code == 0
    script = Script("lua54", (site_dir / "job_submit.lua").read_text())
    res = script.submit({"tres_per_node": "gres/shard:1"})
    assert res.rc == -1 and res.user == ["site rule: give your job a time limit (--time)"]
    assert script.submit({"time_limit": 30, "tres_per_node": "gres/shard:1"}).rc == 0


def test_notes_count_the_nodes_outside_the_policy_in_included_files_too(tmp_path, site_dir):
    conf = site_dir / "slurm.conf"
    conf.write_text(conf.read_text() + "Include nodes-extra.conf\n")
    res = install(str(policy_for(tmp_path, site_dir)), "--dry-run")
    assert (
        res.exit_code == 1 and f"slurm.conf line 31 includes {site_dir}/nodes-extra.conf, which does not" in res.output
    )
    (site_dir / "nodes-extra.conf").write_text("NodeName=viz[01-02] CPUs=32 RealMemory=128000\n")
    res = install(str(policy_for(tmp_path, site_dir)), "--dry-run")
    assert res.exit_code == 0 and f"note: read {site_dir}/nodes-extra.conf (slurm.conf line 31" in res.output
    assert "on the nodes outside the policy (8) it must exist, empty" in res.output
    assert "note: nodes outside the policy (8): cpu[01-04],gpu-old[01-02],viz[01-02]: " in res.output


def test_install_lists_the_nodes_outside_the_policy_that_need_node_install(tmp_path, site_dir):
    """The site's CPU nodes and its old GPU nodes run the include's hooks too: each needs
    `gpushare node install --outside-policy`, and install names them (as a hostlist) and the keys."""
    res = install(str(policy_for(tmp_path, site_dir)), "--dry-run")
    (note,) = [line for line in res.output.splitlines() if line.startswith("note: nodes outside the policy")]
    assert note.startswith(
        "note: nodes outside the policy (6): cpu[01-04],gpu-old[01-02]: slurm.conf's Prolog, Epilog, TaskProlog, "
        "HealthCheckProgram run there too; on each, before the reconfigure, run `gpushare node install "
        "--outside-policy --policy POLICY`"
    ), note


def test_no_outside_note_when_every_node_is_the_policys(tmp_path, site_dir):
    conf = site_dir / "slurm.conf"
    conf.write_text(
        conf.read_text().replace("NodeName=cpu[01-04]", "#NodeName=cpu[01-04]").replace(",gpu-old[01-02]", "")
    )
    res = install(str(policy_for(tmp_path, site_dir)), "--dry-run")
    assert "outside the policy" not in res.output, res.output
