"""`gpushare plan`: report and policy diff, --out that validates and renders, demand sources and their errors."""

from __future__ import annotations

import gzip
import json

import yaml
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.policy import load_file
from tests.conftest import ROOT
from tests.unit.slurm_fakes import FakeJob, FakeSlurm

POLICY = {
    "version": 1,
    "cluster": {"name": "t", "slurm_version": "24.11", "controller": "ctl"},
    "gpu_models": [{"name": "T4", "memory_mb": 15360}],
    "node_groups": [
        {"name": "big", "nodes": "b[1-3]", "gpu": {"model": "L40S", "count": 8}, "cpus": 96, "memory_mb": 512000},
        {"name": "rich", "nodes": "r[1-2]", "gpu": {"model": "T4", "count": 2}, "cpus": 104, "memory_mb": 512000},
    ],
    "tiers": [{"name": "main", "node_groups": ["big", "rich"], "default": True}],
}

CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n" + "".join(
    [f"f{i},6000,4096,1,470,,BE\n" for i in range(12)]
    + [f"w{i},8000,4096,1,1000,,LS\n" for i in range(8)]
    + [f"c{i},8000,4096,0,0,,LS\n" for i in range(4)]
)


def files(tmp_path):
    policy = tmp_path / "site.yaml"
    policy.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    trace = tmp_path / "pods.csv"
    trace.write_text(CSV)
    return policy, trace


def test_plan_prints_report_and_diff_and_writes_a_valid_policy(tmp_path):
    policy, trace = files(tmp_path)
    out = tmp_path / "planned.yaml"
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{trace}", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "demand: 24 jobs from openb:pods.csv" in text
    assert "MPS (100 units per GPU): 12 fractional jobs" in text
    assert "--- site.yaml (as read)" in text and "+++ site.yaml (planned)" in text
    assert "+  routes:" in text
    assert "candidates (packing score on sampled arrivals)" in text
    site = load_file(out)
    assert {s.mode for g in site.groups for s in g.gpus} == {"mps"}
    assert {t.name for t in site.tiers} >= {"frac", "gpu"}
    assert out.read_text().startswith("# Planned by `gpushare plan` from openb:")
    res = CliRunner().invoke(main, ["render", str(out), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "Weight=" in (tmp_path / "r" / "slurm.conf").read_text()


def test_plan_from_recorded_sacct_and_squeue(tmp_path):
    policy, _ = files(tmp_path)
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(
        "JobID|User|Account|Partition|State|Start|End|Elapsed|ElapsedRaw|AllocTRES|ReqTRES|QOS\n"
        "1|a|x|main|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=6,gres/gpu=1,mem=4G,node=1||ls\n"
        "2|a|x|main|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=2,mem=4G,node=1||ls\n"
    )
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"sacct:{sacct}", "--no-evaluate"])
    assert res.exit_code == 0, res.output
    assert "demand: 2 jobs from sacct:sacct.txt" in res.output
    queue = tmp_path / "q.json"
    queue.write_text(
        json.dumps({"jobs": [{"job_id": 1, "job_state": ["PENDING"], "cpus": 4, "tres_per_node": "gres/gpu:2"}]})
    )
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"squeue:{queue}", "--no-evaluate"])
    assert res.exit_code == 0, res.output
    assert "whole-GPU jobs by GPU count: 2: 1" in res.output


def test_plan_source_errors(tmp_path):
    policy, trace = files(tmp_path)
    runner = CliRunner()
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", str(trace)])
    assert res.exit_code == 2 and "write KIND:WHERE" in res.output
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", f"slurm:{trace}"])
    assert res.exit_code == 2 and "unknown kind 'slurm'" in res.output
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{tmp_path / 'missing.csv'}"])
    assert res.exit_code == 1 and "cannot read" in res.output
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\n")
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{bad}"])
    assert res.exit_code == 1 and "bad.csv: line 1: missing column(s) memory_mib, num_gpu, gpu_milli" in res.output
    binary = tmp_path / "pods.bin"
    binary.write_bytes(b"name\xff,cpu_milli\n")
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{binary}"])
    assert res.exit_code == 1 and "pods.bin is not UTF-8 text (byte 4" in res.output and "Traceback" not in res.output
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(CSV.encode())[:20])
    res = runner.invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{cut}"])
    assert res.exit_code == 1 and "cut.csv.gz is not a whole gzip file" in res.output


def test_plan_reads_a_gzip_compressed_pod_list(tmp_path):
    """The paper's pod lists ship gzip-compressed (tests/data/gpu-trace): the same demand as the plain file."""
    policy, trace = files(tmp_path)
    packed = tmp_path / "pods.csv.gz"
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    plain, gz = (
        CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{p}", "--no-evaluate"])
        for p in (trace, packed)
    )
    assert gz.exit_code == 0, gz.output
    assert gz.output.replace("pods.csv.gz", "pods.csv") == plain.output


def test_plan_help_explains_sources():
    res = CliRunner().invoke(main, ["plan", "--help"])
    assert res.exit_code == 0
    for fragment in ("openb:FILE.csv", "sacct:FILE", "squeue:FILE", "sacct:live", "--out", "node weights"):
        assert fragment in res.output, fragment


def test_plan_from_live_sacct_through_the_runner(tmp_path):
    policy, _ = files(tmp_path)
    t0 = 1740787200
    fake = FakeSlurm(
        jobs=[
            FakeJob("1", "alice", "physics", "main", t0 - 7200, t0 - 3600, "cpu=6,gres/mps=47,mem=4G"),
            FakeJob("2", "bob", "physics", "main", t0 - 7200, t0 - 3600, "cpu=8,gres/gpu=1,mem=4G"),
        ]
    )
    res = CliRunner().invoke(
        main,
        ["plan", "--policy", str(policy), "--demand", "sacct:live", "--days", "1", "--no-evaluate"],
        obj={"runner": fake, "clock": lambda: t0},
    )
    assert res.exit_code == 0, res.output
    assert "demand: 2 jobs from sacct:live, last 1 days" in res.output
    assert "fractional shares (milli: jobs): 470: 1" in res.output
    assert fake.calls and fake.calls[0][0] == "sacct"


def test_units_of_reads_the_sites_gres_as_billing_does():
    """units_of (sacct/squeue demand) from policy.billing.unit_fractions: MPS units and shards per GPU, each MIG
    type's milli of its GPU; whole-GPU types are not listed."""
    from slurm_gpushare.cli.plan import units_of
    from slurm_gpushare.planner.demand import Units

    etc = ROOT / "etc"
    assert units_of(load_file(etc / "small-lab.yaml")) == Units(mps=100, shard=4, type_milli={"a100_40g_1g.5gb": 143})
    assert units_of(load_file(etc / "mixed-production.yaml")) == Units(
        mps=100, shard=4, type_milli={"h100_3g.40gb": 500}
    )
    assert units_of(load_file(etc / "planned-lab.yaml")) == Units(
        mps=100, shard=1, type_milli={"a100_40g_3g.20gb": 500, "a100_40g_1g.10gb": 250}
    )
    assert units_of(load_file(etc / "mps-inference.yaml")) == Units(mps=100, shard=1, type_milli={})


def test_plan_is_the_same_with_candidates_scored_side_by_side(tmp_path):
    """--jobs 1 scores the candidates one by one in this process, --jobs 3 in forked workers: with no time budget
    (--budget 0) the same report and the same policy; --jobs 0 and a negative budget are refused by name."""
    policy, trace = files(tmp_path)
    outs = []
    for jobs in ("1", "3"):
        out = tmp_path / f"planned-{jobs}.yaml"
        res = CliRunner().invoke(
            main,
            [
                "plan",
                "--policy",
                str(policy),
                "--demand",
                f"openb:{trace}",
                "--jobs",
                jobs,
                "--budget",
                "0",
                "--out",
                str(out),
            ],
        )
        assert res.exit_code == 0, res.output
        outs.append((res.output.replace(out.name, "OUT"), out.read_text()))
    assert outs[0] == outs[1]
    assert "candidates (packing score on sampled arrivals)" in outs[0][0]
    assert "race over sampled orders 7, 8" in outs[0][0]
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{trace}", "--jobs", "0"])
    assert res.exit_code == 2 and "--jobs" in res.output
    res = CliRunner().invoke(main, ["plan", "--policy", str(policy), "--demand", f"openb:{trace}", "--budget", "-1"])
    assert res.exit_code == 2 and "--budget" in res.output


def test_plan_under_a_spent_budget_keeps_the_best_so_far_and_says_so(tmp_path):
    policy, trace = files(tmp_path)
    res = CliRunner().invoke(
        main, ["plan", "--policy", str(policy), "--demand", f"openb:{trace}", "--budget", "0.000001"]
    )
    assert res.exit_code == 0, res.output
    assert "the time budget ended the search: the best so far is kept" in res.output
    assert "--budget SECONDS" in CliRunner().invoke(main, ["plan", "--help"]).output
