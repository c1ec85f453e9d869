"""`gpushare offers`: every request it tells a user to type is one the submission filter accepts, on every
example policy; it reads the site's policy the way `find_policy` says and prints which one."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.cli.offers import offer_lines
from slurm_gpushare.policy import load_file
from slurm_gpushare.submit import build_tables, decide, split_options, to_job
from tests.conftest import ROOT

EXAMPLES = sorted((ROOT / "etc").glob("*.yaml"))
LAB = ROOT / "etc" / "small-lab.yaml"


def requests(lines: list[str]) -> list[str]:
    """The first column of every offer and alias row: what the user is told to type."""
    return [m[1] for line in lines if (m := re.match(r"^  (-\S.*?)(?: {2,}|$)", line))]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_offered_request_is_accepted(path):
    site = load_file(path)
    tables = build_tables(site)
    typed = requests(offer_lines(site, tables))
    assert typed, "offers printed no request"
    for request in typed:
        decision = decide(tables, to_job(split_options(request.split()), tables.prefix))
        assert decision.accepted, f"{path.name}: {request!r} is refused: {decision.violations}"


def test_offers_names_models_mig_shards_mps_aliases_and_tiers():
    out = CliRunner().invoke(main, ["offers", "--policy", str(LAB)], catch_exceptions=False).output
    assert out.splitlines()[0] == f"policy: {LAB} (--policy)"
    for text in (
        "tier batch (default)",
        "tier scavenger",
        "--gres=gpu:a100_40g_1g.5gb:1",
        "MIG slice 1g.5gb",
        "--gres=shard:1",
        "--gres=mps:25",
        "--gres=gpu:small:1  is --gres=gpu:a100_40g_1g.5gb:1",
        "-p scavenger --gres=gpu:l40s:1",
        "--constraint='a100_40g|a30|l40s'",
    ):
        assert text in out, text


def test_offers_reads_gpushare_policy_from_the_environment():
    res = CliRunner().invoke(
        main, ["offers", "--tier", "inference"], env={"GPUSHARE_POLICY": str(ROOT / "etc" / "mixed-production.yaml")}
    )
    assert res.exit_code == 0, res.output
    assert "($GPUSHARE_POLICY)" in res.output.splitlines()[0]
    assert "-p inference --gres=gpu:h100_3g.40gb:1" in res.output and "\ntier training" not in res.output


def test_an_unknown_tier_lists_the_tiers():
    res = CliRunner().invoke(main, ["offers", "--policy", str(LAB), "--tier", "nope"])
    assert res.exit_code == 2 and "tiers: batch, scavenger" in res.output
