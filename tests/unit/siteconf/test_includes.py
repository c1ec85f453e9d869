"""A site's slurm.conf split with Include lines: the files are read as Slurm reads them, what they define is the
site's, they are never edited, and what Slurm would refuse to read twice is refused naming the file and line
(siteconf/includes.py, siteconf/merge.py, cli/install.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.siteconf import conf
from slurm_gpushare.siteconf.includes import resolve
from tests.unit.siteconf.conftest import policy_for, snapshot


def install(*args: str):
    return CliRunner().invoke(main, ["install", *args])


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_includes_resolve_as_slurm_reads_them():
    files = {
        "/etc/slurm/a.conf": "A=1\ninclude sub/b.conf\n",
        "/etc/slurm/sub/b.conf": "B=2\nInclude\tc-%c.conf\n",  # relative to slurm.conf's directory, not sub/
        "/etc/slurm/c-prod.conf": "C=3\n",
        "/site/abs.conf": "D=4\n",
    }
    top = "ClusterName=Prod\nINCLUDE a.conf   # comment\nInclude /site/abs.conf\nE=5\n"
    got = resolve(top, "/etc/slurm", files.get)
    assert got.problems == []
    values = [(ln.file, ln.first.key) for ln in got.lines if ln.first is not None and ln.first.name != "include"]
    assert values == [
        ("slurm.conf", "ClusterName"),
        ("/etc/slurm/a.conf", "A"),
        ("/etc/slurm/sub/b.conf", "B"),
        ("/etc/slurm/c-prod.conf", "C"),
        ("/site/abs.conf", "D"),
        ("slurm.conf", "E"),
    ]
    assert [(f.path, f.by.where) for f in got.files] == [
        ("/etc/slurm/a.conf", "slurm.conf line 2"),
        ("/etc/slurm/sub/b.conf", "/etc/slurm/a.conf line 2"),
        ("/etc/slurm/c-prod.conf", "/etc/slurm/sub/b.conf line 2"),
        ("/site/abs.conf", "slurm.conf line 3"),
    ]


@pytest.mark.parametrize(
    ("top", "files", "problem"),
    [
        ("Include nodes.d/*.conf\n", {}, "slurm.conf line 1: Include nodes.d/*.conf: Slurm reads no glob"),
        ("Include gone.conf\n", {}, "slurm.conf line 1 includes /etc/slurm/gone.conf, which does not exist"),
        ("Include a.conf\n", {"/etc/slurm/a.conf": "Include a.conf\n"}, "includes a.conf, which includes itself"),
        ("Include %c.conf\nClusterName=x\n", {}, "%c needs a ClusterName set before this line"),
    ],
)
def test_what_slurm_cannot_read_is_a_problem(top, files, problem):
    got = resolve(top, "/etc/slurm", files.get)
    assert len(got.problems) == 1 and problem in got.problems[0], got.problems


def test_install_reads_the_included_files_and_rolls_back_every_byte(tmp_path, includes_dir):
    before = snapshot(includes_dir)
    done = install(str(policy_for(tmp_path, includes_dir)))
    assert done.exit_code == 0 and "refused" not in done.output, done.output
    for name, by in [
        ("accounting.conf", "slurm.conf line 17"),
        ("nodes.conf", "slurm.conf line 21"),
        ("conf.d/prod-partitions.conf", "slurm.conf line 24"),
        ("conf.d/legacy.conf", f"{includes_dir}/conf.d/prod-partitions.conf line 4"),
    ]:
        assert f"note: read {includes_dir}/{name} ({by} includes it); gpushare never edits it" in done.output
    after = snapshot(includes_dir)
    for name in ("accounting.conf", "nodes.conf", "conf.d/prod-partitions.conf", "conf.d/legacy.conf"):
        assert after[name] == before[name], name
    merged = (includes_dir / "slurm.conf").read_text()
    assert "Include accounting.conf\n" in merged and "include nodes.conf\n" in merged
    fragment = (includes_dir / "slurm-gpushare.conf").read_text()
    tres = next(ln for ln in fragment.splitlines() if ln.startswith("AccountingStorageTRES="))
    assert tres.startswith("AccountingStorageTRES=gres/gpu,license/matlab,")  # the included file's licence kept
    training = next(ln for ln in conf.parse(fragment) if ln.get("PartitionName") == "training")
    assert training.get("Default") == "NO"  # the site's default partition is in an included file
    assert "AccountingStorageTRES=gres/gpu,license/matlab is also set in" in done.output
    gres = (includes_dir / "gres.conf").read_text()
    assert "NodeName=cpu[01-04],gpu-old[01-02] AutoDetect=nvml" in gres  # nodes.conf's nodes are the site's
    assert install(str(policy_for(tmp_path, includes_dir))).output.rstrip().endswith("nothing to do")
    undone = install("--slurm-conf-dir", str(includes_dir), "--rollback")
    assert undone.exit_code == 0, undone.output
    assert snapshot(includes_dir) == before


def test_an_absolute_include_is_read_and_left_alone(tmp_path, includes_dir):
    extra = tmp_path / "shared" / "site-extra.conf"
    extra.parent.mkdir()
    extra.write_text("PreemptType=preempt/qos\n")
    (includes_dir / "slurm.conf").write_text((includes_dir / "slurm.conf").read_text() + f"Include {extra}\n")
    policy = policy_for(tmp_path, includes_dir)
    refused = install(str(policy))
    assert refused.exit_code == 1 and f"PreemptType=preempt/qos is the site's ({extra} line 1)" in refused.output
    before = extra.read_bytes()
    taken = install(str(policy), "--take-over", "PreemptType")
    assert taken.exit_code == 0, taken.output
    assert "PreemptType=preempt/qos is also set in" in taken.output and extra.read_bytes() == before
    fragment = (includes_dir / "slurm-gpushare.conf").read_text()
    assert "PreemptType=preempt/partition_prio" in fragment.splitlines()  # read after the site's file: it wins


def test_a_tier_partition_in_an_included_file_is_refused(tmp_path, includes_dir):
    line = "PartitionName=training Nodes=h100-[01-08] MaxTime=3-00:00:00 AllowGroups=ml,research QOS=training State=UP"
    edit(includes_dir / "slurm.conf", line + "\n", "")
    (includes_dir / "conf.d" / "legacy.conf").write_text((includes_dir / "conf.d" / "legacy.conf").read_text() + line)
    before = snapshot(includes_dir)
    res = install(str(policy_for(tmp_path, includes_dir)), "--take-over", "PartitionName=training")
    assert res.exit_code == 1 and "refused, nothing written" in res.output
    assert f"PartitionName=training is defined in {includes_dir}/conf.d/legacy.conf line 2" in res.output
    assert "Move that line into slurm.conf" in res.output
    assert snapshot(includes_dir) == before


def test_policy_nodes_in_an_included_file_are_refused(tmp_path, includes_dir):
    line = "NodeName=h100-[01-08] CPUs=112 RealMemory=2000000 Gres=gpu:8\n"
    edit(includes_dir / "slurm.conf", line, "")
    edit(includes_dir / "nodes.conf", "NodeName=gpu-old[01-02]", "NodeName=h100-[01-08],gpu-old[01-02]")
    res = install(str(policy_for(tmp_path, includes_dir)), "--force")
    assert res.exit_code == 1
    assert f"NodeName=h100-[01-08],gpu-old[01-02] ({includes_dir}/nodes.conf line 4) defines h100-[01-08]" in res.output


def test_an_epilog_in_an_included_file_runs_first_only_when_taken_over(tmp_path, includes_dir):
    edit(includes_dir / "slurm.conf", "Epilog=/etc/slurm/epilog.d/site-epilog.sh\n", "")
    accounting = includes_dir / "accounting.conf"
    accounting.write_text(accounting.read_text() + "Epilog=/etc/slurm/epilog.d/site-epilog.sh\n")
    policy = policy_for(tmp_path, includes_dir)
    res = install(str(policy), "--dry-run")
    assert res.exit_code == 1 and "it would run before the product's epilog" in res.output
    taken = install(str(policy), "--dry-run", "--take-over", "Epilog")
    assert taken.exit_code == 0 and "the site's epilog" in taken.output and "runs first" in taken.output


def test_the_products_own_prolog_in_an_included_file_would_run_twice(tmp_path, includes_dir):
    accounting = includes_dir / "accounting.conf"
    accounting.write_text(accounting.read_text() + "Prolog=/usr/local/sbin/gpushare-prolog\n")
    res = install(str(policy_for(tmp_path, includes_dir)), "--dry-run", "--force")
    assert res.exit_code == 1 and "it would run twice; take that line out of" in res.output


def test_an_include_slurm_cannot_read_is_refused(tmp_path, includes_dir):
    edit(includes_dir / "slurm.conf", "include nodes.conf", "include nodes.d/*.conf")
    res = install(str(policy_for(tmp_path, includes_dir)), "--dry-run")
    assert res.exit_code == 1 and "Slurm reads no glob in an Include" in res.output
