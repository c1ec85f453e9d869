"""The gpushare command line: exit codes, messages, atomic and careful writes."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from slurm_gpushare.cli import main
from tests.conftest import ROOT

LAB = str(ROOT / "etc" / "small-lab.yaml")


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_explains():
    out = run("--help").output
    for word in ("validate", "render", "diff", "catalogue"):
        assert word in out
    assert "--force" in run("render", "--help").output


def test_validate_ok():
    res = run("validate", LAB)
    assert res.exit_code == 0 and "OK: cluster lab" in res.output


def test_validate_reports_all_problems(tmp_path, policy):
    policy["tenants"][0]["shares"] = 0
    policy["tiers"][0]["preempt_mode"] = "suspend"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(policy))
    res = CliRunner().invoke(main, ["validate", str(bad)])
    assert res.exit_code == 1
    assert "2 problem(s)" in res.output
    assert "tenants[0].shares:" in res.output and "tiers[0].preempt_mode:" in res.output


def test_validate_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["validate", str(tmp_path / "nope.yaml")])
    assert res.exit_code != 0


def test_render_default_example(tmp_path):
    res = run("render", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "bundled example small-lab.yaml" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cgroup.conf",
        "gres.conf",
        "job_submit.lua",
        "slurm-gpushare.conf",
        "slurm.conf",
    ]


def test_render_again_is_up_to_date(tmp_path):
    run("render", LAB, "--out", str(tmp_path))
    assert "up to date" in run("render", LAB, "--out", str(tmp_path)).output


def test_render_refuses_hand_edited_file(tmp_path):
    run("render", LAB, "--out", str(tmp_path))
    conf = tmp_path / "slurm.conf"
    conf.write_text(conf.read_text().replace("SlurmdDebug=info", "SlurmdDebug=debug"))
    edited = conf.read_text()
    gres_before = (tmp_path / "gres.conf").read_text()
    other = ROOT / "etc" / "mps-inference.yaml"
    res = CliRunner().invoke(main, ["render", str(other), "--out", str(tmp_path)])
    assert res.exit_code == 1 and "refusing to overwrite slurm.conf" in res.output
    assert conf.read_text() == edited  # nothing lost
    assert (tmp_path / "gres.conf").read_text() == gres_before  # and nothing half-written
    assert run("render", str(other), "--out", str(tmp_path), "--force").exit_code == 0
    assert "ClusterName=serve" in conf.read_text()


def test_render_refuses_foreign_file(tmp_path):
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\n")
    res = CliRunner().invoke(main, ["render", LAB, "--out", str(tmp_path)])
    assert res.exit_code == 1 and "gres.conf" in res.output


def test_render_leaves_no_temp_files(tmp_path):
    run("render", LAB, "--out", str(tmp_path))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_diff(tmp_path):
    run("render", LAB, "--out", str(tmp_path))
    assert run("diff", LAB, "--against", str(tmp_path)).exit_code == 0
    changed = tmp_path / "changed.yaml"
    changed.write_text((ROOT / "etc" / "small-lab.yaml").read_text().replace("replicas: 4", "replicas: 2"))
    res = CliRunner().invoke(main, ["diff", str(changed), "--against", str(tmp_path)])
    assert res.exit_code == 1
    assert "-NodeName=lab-shard01 CPUs=8 RealMemory=16000 Gres=gpu:l40s:1,shard:4" in res.output
    assert "+NodeName=lab-shard01 CPUs=8 RealMemory=16000 Gres=gpu:l40s:1,shard:2" in res.output


def test_slurm_version_override(tmp_path):
    run("render", LAB, "--out", str(tmp_path), "--slurm-version", "26.05")
    assert "for Slurm 26.05" in (tmp_path / "slurm.conf").read_text()


def test_catalogue_lists_models():
    out = run("catalogue").output
    for name in ("A100-SXM4-40GB", "H200-141GB", "L40S"):
        assert name in out


def test_catalogue_model_detail():
    out = run("catalogue", "A100-SXM4-40GB").output
    assert "1g.5gb" in out and "all-balanced" in out and "a100_40g_3g.20gb" in out


def test_catalogue_unknown_model():
    res = CliRunner().invoke(main, ["catalogue", "H300"])
    assert res.exit_code == 2 and "H100-SXM5-80GB" in res.output
