"""docker/fake_gpus.py: the device set of a test node comes from its rendered gres.conf."""

from __future__ import annotations

import subprocess
import sys

from slurm_gpushare.policy import load_file
from slurm_gpushare.render import render_all
from tests.conftest import ROOT

SCRIPT = ROOT / "docker" / "fake_gpus.py"


def listed(gres_conf, node) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--gres-conf", str(gres_conf), "--node", node, "--list"],
        capture_output=True,
        text=True,
    )
    return out.returncode, out.stdout.split(), out.stderr


def rendered(tmp_path, mig_include: str | None):
    site = load_file(ROOT / "etc" / "small-lab.yaml")
    text = render_all(site)["gres.conf"]
    include = tmp_path / "mig.conf"
    text = text.replace(site.cluster.paths.gres_include, str(include))
    if mig_include is not None:
        include.write_text(mig_include)
    conf = tmp_path / "gres.conf"
    conf.write_text(text)
    return conf


def test_exclusive_node_devices(tmp_path):
    rc, paths, _ = listed(rendered(tmp_path, ""), "lab-excl01")
    assert rc == 0 and paths == ["/dev/nvidia0", "/dev/nvidia1"]


def test_other_nodes_lines_are_ignored(tmp_path):
    rc, paths, _ = listed(rendered(tmp_path, ""), "lab-shard01")
    assert paths == ["/dev/nvidia0"]


def test_mig_include_is_followed(tmp_path):
    line = (
        "NodeName=lab-mig01 Name=gpu Type=a100_40g_1g.5gb "
        "MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap66,/dev/nvidia-caps/nvidia-cap67\n"
    )
    rc, paths, _ = listed(rendered(tmp_path, line), "lab-mig01")
    assert rc == 0
    assert set(paths) == {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"}


def test_missing_include_is_an_error(tmp_path):
    rc, _paths, err = listed(rendered(tmp_path, None), "lab-mig01")
    assert rc == 3 and "does not exist" in err
