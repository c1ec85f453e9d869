"""A site's own job_container.conf joins per-job MIG isolation: its lines stay, the policy's nodes get its options
with gpushare-ns-caps as CloneNSScript, a site clone script is not replaced silently, and the rollback gives the
file back byte for byte (siteconf/jobcontainer.py, siteconf/install.py)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from hostlist import expand_hostlist

from slurm_gpushare.cli import main
from slurm_gpushare.policy.load import build_site
from slurm_gpushare.render import render_all
from slurm_gpushare.siteconf.jobcontainer import plan_job_container
from slurm_gpushare.siteconf.merge import BEGIN, END, OWNED, Options
from tests.conftest import ROOT
from tests.unit.siteconf.conftest import SITE_PERJOB, perjob_policy, snapshot

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"
NODES = frozenset(expand_hostlist("lab-excl01,lab-shard01,lab-mig01,lab-perjob[01-02]"))
SCRIPT = "CloneNSScript=/usr/local/sbin/gpushare-ns-caps CloneNSScript_Wait=30"


def ours(version: str = "24.11") -> str:
    return render_all(build_site(yaml.safe_load(POLICY.read_text()), "t.yaml", slurm_version=version))[
        "job_container.conf"
    ]


def plan(site: str | None, version: str = "24.11", **kw):
    return plan_job_container(site, ours(version), Options(NODES, **kw))


def block(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[lines.index(BEGIN) + 1 : lines.index(END)]


def test_install_keeps_the_site_container_and_rolls_back_every_byte(tmp_path, perjob_dir):
    before = snapshot(perjob_dir)
    policy = perjob_policy(tmp_path, perjob_dir)
    done = CliRunner().invoke(main, ["install", str(policy)])
    assert done.exit_code == 0, done.output
    text = (perjob_dir / "job_container.conf").read_text()
    assert text.startswith((SITE_PERJOB / "job_container.conf").read_text())  # the site's lines, as written
    assert block(text) == [
        "NodeName=lab-excl01,lab-mig01,lab-perjob01,lab-shard01 BasePath=/var/spool/slurm/containers "
        f"Dirs=/tmp,/dev/shm {SCRIPT}",
        f"NodeName=lab-perjob02 BasePath=/scratch/containers Dirs=/tmp,/dev/shm {SCRIPT}",
    ]
    assert "chain job_container.conf NodeName=lab-perjob02: NodeName=lab-perjob02 BasePath=/scratch/containers" in (
        done.output
    )
    again = CliRunner().invoke(main, ["install", str(policy)])
    assert again.exit_code == 0 and again.output.rstrip().endswith("nothing to do"), again.output
    undone = CliRunner().invoke(main, ["install", "--slurm-conf-dir", str(perjob_dir), "--rollback"])
    assert undone.exit_code == 0, undone.output
    assert snapshot(perjob_dir) == before


def test_without_a_site_file_the_policys_nodes_get_the_products_line():
    text, changes, refusals = plan(None)
    assert refusals == [] and [c.kind for c in changes] == [OWNED]
    assert block(text) == [
        "NodeName=lab-excl01,lab-mig01,lab-perjob[01-02],lab-shard01 BasePath=/var/spool/slurm/gpushare-ns "
        f"AutoBasePath=true Dirs=/dev/shm {SCRIPT}"
    ]  # nodes outside the policy have no gpushare-ns-caps: the container stays off there
    assert plan(text)[0] == text and plan(ours())[0] == text


def test_site_options_set_on_their_own_are_not_overridden_for_nodes_without_a_basepath():
    site = "Dirs=/tmp,/dev/shm\nNodeName=cpu01 BasePath=/var/spool/slurm/containers\n"
    text, _, _ = plan(site)
    (line,) = block(text)
    assert "Dirs=" not in line and "AutoBasePath=true" in line and SCRIPT in line


def test_a_site_clone_script_is_refused_unless_taken_over():
    site = "BasePath=/var/spool/slurm/containers CloneNSScript=/usr/local/sbin/site-ns\n"
    _, _, refusals = plan(site)
    assert len(refusals) == 1
    assert "CloneNSScript=/usr/local/sbin/site-ns is the site's (job_container.conf line 1)" in refusals[0]
    assert "--take-over CloneNSScript" in refusals[0] and "isolation: none" in refusals[0]
    text, changes, refusals = plan(site, take_over=frozenset({"clonensscript"}))
    assert refusals == [] and changes[0].kind == OWNED and "taken over" in changes[0].why
    assert block(text) == [
        f"NodeName=lab-excl01,lab-mig01,lab-perjob[01-02],lab-shard01 BasePath=/var/spool/slurm/containers {SCRIPT}"
    ]
    assert text.startswith(site)  # nodes outside the policy keep the site's script


@pytest.mark.parametrize(
    ("site", "expect"),
    [
        ("BasePath=/x CloneNSScript=/usr/local/sbin/gpushare-ns-caps CloneNSScript_Wait=60\n", None),
        ("BasePath=/x CloneNSScript_Wait=60\n", "CloneNSScript=/usr/local/sbin/gpushare-ns-caps CloneNSScript_Wait=60"),
    ],
)
def test_a_longer_site_wait_is_kept_and_a_site_already_joined_is_left_alone(site, expect):
    text, changes, refusals = plan(site)
    assert refusals == []
    if expect is None:
        assert text == site and changes == []
    else:
        assert block(text)[0].endswith(expect)


def test_a_job_container_turned_off_on_the_policys_nodes_is_refused():
    _, _, refusals = plan("BasePath=/x\nNodeName=lab-perjob[01-02] BasePath=none\n")
    assert len(refusals) == 1
    assert "BasePath=none (job_container.conf line 2) turns the job container off on lab-perjob[01-02]" in refusals[0]


def test_namespace_tmpfs_reads_the_same_file_from_25_11():
    site = (SITE_PERJOB / "job_container.conf").read_text()
    assert plan(site, "26.05") == plan(site, "24.11")
