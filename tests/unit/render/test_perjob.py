"""Rendering per-job MIG GPUs (issue 35): gres.conf declares each whole GPU and its carrier shards on one device
file, slurm.conf picks the least loaded GPU for a slice, and the fixed-MIG include leaves them out."""

from __future__ import annotations

import yaml

from slurm_gpushare.policy import load_file
from slurm_gpushare.render import context as ctx
from slurm_gpushare.render import render_all
from tests.conftest import ROOT

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"


def test_gres_conf_declares_the_whole_gpu_and_its_carrier_shards():
    site = load_file(POLICY)
    gres = render_all(site)["gres.conf"]
    assert "NodeName=lab-perjob[01-02] Name=gpu Type=a100_40g File=/dev/nvidia[0-1]" in gres
    for index in (0, 1):
        assert f"NodeName=lab-perjob[01-02] Name=shard Count=15 File=/dev/nvidia{index}" in gres
    assert "AutoDetect=off" in gres and "AutoDetect=nvml" not in gres
    assert "# lab-perjob: 2 x A100-SXM4-40GB (0-1 mig per job (1g.5gb/2g.10gb/3g.20gb/4g.20gb/7g.40gb: " in gres


def test_only_fixed_layouts_go_to_the_per_node_mig_include():
    site = load_file(POLICY)
    assert ctx.mig_nodes(site) == [{"nodes": "lab-mig01", "gpus": [(0, ["1g.5gb"] * 7)]}]


def test_slurm_conf_picks_the_least_loaded_gpu_for_slices_and_never_spreads_one():
    site = load_file(POLICY)
    conf = render_all(site)["slurm.conf"]
    assert "SelectTypeParameters=CR_Core_Memory,LL_SHARED_GRES\n" in conf
    assert "MULTIPLE_SHARING_GRES_PJ" not in conf
    assert "GresTypes=gpu,shard\n" in conf
    assert "NodeName=lab-perjob[01-02]" in conf and "Gres=gpu:a100_40g:2,shard:30" in conf


def test_sites_without_per_job_mig_keep_their_select_type_parameters():
    site = load_file(ROOT / "etc" / "small-lab.yaml")
    assert ctx.select_type_parameters(site) == "CR_Core_Memory"
    assert not ctx.per_job_mig(site)


def test_per_job_nodes_bound_the_prolog_and_hold_no_nvml_for_accounting():
    """A per-job prolog makes MIG instances: PrologEpilogTimeout bounds it above what it takes at NVIDIA's
    latencies (tests/unit/hooks/test_perjob.py), BatchStartTimeout lets a batch job wait that long for it, no
    AutoDetect=nvml and no GPU accounting hold NVML (in the fragment a site's own slurm.conf includes too)."""
    from slurm_gpushare.policy.share import PER_JOB_PROLOG_TIMEOUT_S

    out = render_all(load_file(POLICY))
    for name in ("slurm.conf", "slurm-gpushare.conf"):
        lines = out[name].splitlines()
        assert f"PrologEpilogTimeout={PER_JOB_PROLOG_TIMEOUT_S}" in lines
        assert f"BatchStartTimeout={PER_JOB_PROLOG_TIMEOUT_S}" in lines
        assert lines.count("JobAcctGatherParams=DisableGPUAcct") == 1
    assert "AutoDetect=off" in out["gres.conf"].splitlines() and "AutoDetect=nvml" not in out["gres.conf"]
    plain = render_all(load_file(ROOT / "etc" / "small-lab.yaml"))["slurm.conf"]
    assert "PrologEpilogTimeout" not in plain and "BatchStartTimeout" not in plain and "DisableGPUAcct" not in plain


def test_isolated_per_job_gpus_get_a_job_container_whose_clone_script_is_the_hook():
    """isolation: namespace (the default from 24.11): job_container/tmpfs with PrologFlags Contain, its
    job_container.conf naming gpushare-ns-caps (beside the prolog) as CloneNSScript; namespace/tmpfs from 25.11."""
    out = render_all(load_file(POLICY))
    fragment = out["slurm-gpushare.conf"]
    assert "JobContainerType=job_container/tmpfs\n" in fragment and "PrologFlags=Alloc,Contain\n" in fragment
    conf = out["job_container.conf"]
    # one line: Slurm reads CloneNSScript only on the BasePath line
    line = (
        "BasePath=/var/spool/slurm/gpushare-ns AutoBasePath=true Dirs=/dev/shm "
        "CloneNSScript=/usr/local/sbin/gpushare-ns-caps CloneNSScript_Wait=30\n"
    )
    assert line in conf
    from slurm_gpushare.policy.load import build_site

    raw = yaml.safe_load(POLICY.read_text())
    raw["cluster"]["hooks"]["ns_caps"] = "/opt/site/ns-caps"
    newer = render_all(build_site(raw, "t.yaml", slurm_version="26.05"))
    assert "NamespaceType=namespace/tmpfs\n" in newer["slurm-gpushare.conf"]
    assert "JobContainerType" not in newer["slurm-gpushare.conf"]
    assert " CloneNSScript=/opt/site/ns-caps " in newer["job_container.conf"]


def test_no_job_container_without_isolation():
    from slurm_gpushare.policy.load import build_site

    raw = yaml.safe_load(POLICY.read_text())
    for group in raw["node_groups"]:
        for entry in group.get("sharing", []):
            if entry.get("per_job"):
                entry["isolation"] = "none"
    out = render_all(build_site(raw, "t.yaml"))
    assert "job_container.conf" not in out and "JobContainerType" not in out["slurm.conf"]
    assert "job_container.conf" not in render_all(load_file(ROOT / "etc" / "small-lab.yaml"))
