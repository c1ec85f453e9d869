"""The existing site that tests/cluster/test_install_existing_site.py describes joins as the install page's
`gpushare install` (no --take-over) runs it: nothing refused, each site feature kept in the files, and the
rollback gives back every file byte for byte. The cluster test then shows Slurm acting on them."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_gpushare.cli import main
from tests.cluster.test_install_existing_site import SITE_FILES, SITE_SLURM_CONF
from tests.unit.siteconf.conftest import cluster_test_site, snapshot


def test_the_cluster_tests_site_joins_without_take_over_and_rolls_back(tmp_path):
    site, policy = cluster_test_site(tmp_path)
    before = snapshot(site)
    done = CliRunner().invoke(main, ["install", str(policy)])
    assert done.exit_code == 0 and "refused" not in done.output, done.output
    conf = (site / "slurm.conf").read_text() + (site / "slurm-gpushare.conf").read_text()
    for kept in (
        "Prolog=/etc/slurm/site/prolog.d/*",
        "Epilog=/etc/slurm/site/epilog.sh",
        "AllowGroups=gpuusers QOS=batchpart DefMemPerGPU=4000",
        "Licenses=matlab:2",
        "NodeName=gpu-x01 CPUs=8 RealMemory=16000 Gres=gpu:2",
        "PartitionName=legacy Nodes=gpu-x01",
    ):
        assert kept in conf, kept
    assert "license/matlab" in next(line for line in conf.splitlines() if line.startswith("AccountingStorageTRES="))
    assert "NodeName=gpu-x01 Name=gpu File=/dev/nvidia[0-1]" in (site / "gres.conf").read_text()
    assert (site / "job_submit_site.lua").read_text() == SITE_FILES["job_submit.lua"]
    assert "chain HealthCheckProgram: /etc/slurm/site/health.sh -> /usr/local/sbin/gpushare-node-health" in done.output
    undone = CliRunner().invoke(main, ["install", "--slurm-conf-dir", str(site), "--rollback"])
    assert undone.exit_code == 0, undone.output
    assert snapshot(site) == before and (site / "slurm.conf").read_text() == SITE_SLURM_CONF
