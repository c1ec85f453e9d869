"""Which policy a user's command reads: --policy, else $GPUSHARE_POLICY, else the site's file; never an example."""

from __future__ import annotations

import pytest

from slurm_gpushare.sitepolicy import ENV, SITE_POLICY, PolicyNotFound, describe, find_policy


def test_the_site_file_is_etc_gpushare_policy_yaml():
    assert str(SITE_POLICY) == "/etc/gpushare/policy.yaml" and ENV == "GPUSHARE_POLICY"


def test_explicit_wins_over_the_environment_and_the_site_file(tmp_path):
    site = tmp_path / "policy.yaml"
    site.write_text("version: 1\n")
    path, how = find_policy("mine.yaml", {ENV: "env.yaml"}, site)
    assert (str(path), how) == ("mine.yaml", "--policy")


def test_the_environment_wins_over_the_site_file(tmp_path):
    site = tmp_path / "policy.yaml"
    site.write_text("version: 1\n")
    path, how = find_policy(None, {ENV: "/srv/p.yaml"}, site)
    assert (str(path), how) == ("/srv/p.yaml", "$GPUSHARE_POLICY")


@pytest.mark.parametrize("explicit, env", [(None, {}), ("", {ENV: "  "}), (None, {"OTHER": "x"})])
def test_the_site_file_when_nothing_is_named(tmp_path, explicit, env):
    site = tmp_path / "policy.yaml"
    site.write_text("version: 1\n")
    assert find_policy(explicit, env, site) == (site, "the site's default")
    assert describe(site, "the site's default") == f"policy: {site} (the site's default)"


def test_no_policy_anywhere_is_an_error_naming_every_way(tmp_path):
    with pytest.raises(PolicyNotFound) as err:
        find_policy(None, {}, tmp_path / "absent.yaml")
    text = str(err.value)
    assert str(tmp_path / "absent.yaml") in text and "--policy" in text and "GPUSHARE_POLICY" in text
    assert err.value.exit_code == 2
