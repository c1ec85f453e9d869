"""A realistic existing site (tests/unit/siteconf/site/): its own prolog and epilog, NHC, a job_submit.lua rule,
a partition with AllowGroups, a QOS, OverSubscribe, DefMemPerGPU, a licence in the accounted TRES, and GPU nodes
outside the policy; and the mixed-production policy that joins it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

SITE = Path(__file__).parent / "site"
SITE_INCLUDES = Path(__file__).parent / "site-includes"  # the same site, its slurm.conf split with Include lines
SITE_PERJOB = Path(__file__).parent / "site-perjob"  # a site with a job container of its own, for per-job MIG


def policy_for(tmp: Path, directory: Path, **changes) -> Path:
    raw = yaml.safe_load((ROOT / "etc" / "mixed-production.yaml").read_text())
    raw["cluster"].setdefault("paths", {})["slurm_conf_dir"] = str(directory)
    if changes.get("site_program", True):
        raw["cluster"].setdefault("health", {})["site_program"] = "/usr/sbin/nhc"
    if changes.get("site_lua", True):
        raw.setdefault("submission", {})["site_lua"] = {
            "path": str(directory / "job_submit_site.lua"),
            "order": "before",
        }
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def site_dir(tmp_path) -> Path:
    directory = tmp_path / "etc-slurm"
    shutil.copytree(SITE, directory)
    (directory / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    return directory


def perjob_policy(tmp: Path, directory: Path) -> Path:
    """tests/data/policies/perjob-lab.yaml (per-job MIG, isolated: it renders job_container.conf) for ``directory``."""
    raw = yaml.safe_load((ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml").read_text())
    raw["cluster"].setdefault("paths", {})["slurm_conf_dir"] = str(directory)
    path = tmp / "perjob.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def includes_dir(site_dir) -> Path:
    """The realistic site with its slurm.conf split: accounting.conf, nodes.conf (lower-case include),
    conf.d/%c-partitions.conf (the default partition), which includes conf.d/legacy.conf (nested, relative to
    slurm.conf's directory)."""
    shutil.copytree(SITE_INCLUDES, site_dir, dirs_exist_ok=True)
    return site_dir


@pytest.fixture
def perjob_dir(tmp_path) -> Path:
    directory = tmp_path / "etc-slurm-lab"
    shutil.copytree(SITE_PERJOB, directory)
    return directory


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory`` but the backups: its bytes and mode."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mode & 0o7777)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".gpushare-backup" not in p.parts
    }


def cluster_test_site(tmp: Path) -> tuple[Path, Path]:
    """tests/cluster/test_install_existing_site.py's site files in ``tmp``/etc-slurm and its policy pointed
    there: (the directory, the policy file)."""
    from tests.cluster.test_install_existing_site import POLICY, SITE_FILES

    site = tmp / "etc-slurm"
    for name, text in SITE_FILES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    raw = yaml.safe_load(POLICY)
    raw["cluster"].setdefault("paths", {})["slurm_conf_dir"] = str(site)
    raw["submission"]["site_lua"]["path"] = str(site / "job_submit_site.lua")
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    return site, policy
