"""Per-job MIG tiers in `gpushare check` (the rewrite and what it means) and `gpushare offers` (the slices a user
may ask for, made for each job), on the perjob-lab test policy."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.cli.offers import offer_lines
from slurm_gpushare.policy import load_file
from slurm_gpushare.submit import build_tables, decide, split_options, to_job
from tests.conftest import ROOT
from tests.unit.cli.test_offers import requests

POLICY = ROOT / "tests" / "data" / "policies" / "perjob-lab.yaml"


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_check_prints_the_rewrite_and_that_the_slice_is_made_for_the_job():
    res = cli("check", "--policy", str(POLICY), "--", "-p", "perjob", "--gres=gpu:a100_40g_2g.10gb:1")
    assert res.exit_code == 0
    which, ok, note = res.output.splitlines()
    assert which == f"policy: {POLICY} (--policy)"
    rewrite = "tres_per_node=gres/shard:4, extra=gpushare-mig=2g.10gb"
    assert ok == f"OK (would set {rewrite}, qos=perjob if your association may use it)"
    assert note.startswith("  a 2g.10gb MIG instance is made for this job when it starts")
    assert "destroyed when it ends" in note and "gpushare-mig=2g.10gb in the job's extra field" in note


def test_check_says_nothing_more_for_a_fixed_slice():
    res = cli("check", "--policy", str(POLICY), "--", "--gres=gpu:a100_40g_1g.5gb:1")
    assert res.output.splitlines()[1:] == ["OK (would set qos=batch if your association may use it)"]


def test_offers_lists_the_per_job_profiles_a_user_may_ask_for():
    site = load_file(POLICY)
    tables = build_tables(site)
    lines = offer_lines(site, tables, "perjob")
    made = [line for line in lines if line.endswith("made for the job when it starts")]
    assert len(made) == 5 and "-p perjob --gres=gpu:a100_40g_3g.20gb:1" in made[2]
    assert "billed as 0.50 GPU" in made[2]
    assert any("one whole A100-SXM4-40GB GPU (40.0 GiB) when no job's slice is on it" in line for line in lines)
    for request in requests(offer_lines(site, tables)):  # each is accepted as it is written
        decision = decide(tables, to_job(split_options(request.split()), tables.prefix))
        assert decision.accepted, f"{request!r} is refused: {decision.violations}"
