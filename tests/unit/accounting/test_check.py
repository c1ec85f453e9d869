"""Our Fair Tree against sshare's own figures: agreement, flagged differences, and what integer RawUsage excuses."""

from __future__ import annotations

import dataclasses
import io

import pytest

from slurm_gpushare.accounting import fairtree
from slurm_gpushare.slurm import sshare
from slurm_gpushare.slurm.parsable import SlurmParseError
from tests.unit.slurm_fakes import DATA


@pytest.mark.parametrize("name", ["sshare-small-lab.parsable2", "sshare-small-lab.v0.0.42.json"])
def test_recorded_sshare_agrees_to_1e6(name):
    rows = sshare.read(DATA / name)
    root = fairtree.tree_from_sshare(rows)
    checks = fairtree.check_against(rows, root, fairtree.compute(root))
    assert len(checks) == 29 and all(c.ok for c in checks), [c for c in checks if not c.ok]
    fields = {c.field for c in checks}
    assert fields == {"norm_shares", "effective_usage", "level_fs", "fairshare"}


def _perturbed(key, **changes):
    rows = sshare.read(DATA / "sshare-small-lab.v0.0.42.json")
    return [dataclasses.replace(r, **changes) if r.key == key else r for r in rows]


def test_a_difference_beyond_the_tolerance_is_flagged():
    rows = _perturbed(("physics", ""), level_fs=0.891089108910891 + 2e-6)
    root = fairtree.tree_from_sshare(rows)
    bad = [c for c in fairtree.check_against(rows, root, fairtree.compute(root)) if not c.ok]
    assert [(c.key, c.field) for c in bad] == [(("physics", ""), "level_fs")]
    assert bad[0].diff == pytest.approx(2e-6)


def test_inf_against_a_number_is_flagged():
    rows = _perturbed(("root", "root"), level_fs=123.0)
    root = fairtree.tree_from_sshare(rows)
    bad = [c for c in fairtree.check_against(rows, root, fairtree.compute(root)) if not c.ok]
    assert [(c.key, c.field) for c in bad] == [(("root", "root"), "level_fs")]


def test_integer_raw_usage_widens_what_is_allowed():
    # True usages 10.6 and 5.4 under 16: sshare prints RawUsage 10 and 5 but U and LevelFS from the real values.
    text = (
        "Account|User|RawShares|NormShares|RawUsage|NormUsage|EffectvUsage|FairShare|LevelFS|GrpTRESMins|TRESRunMins\n"
        "root|||0.000000|16|1.000000|1.000000||||\n"
        " a||1|1.000000|16|1.000000|1.000000||1.000000||\n"
        "  a|u1|1|0.500000|10|0.662500|0.662500|0.500000|0.754717||\n"
        "  a|u2|1|0.500000|5|0.337500|0.337500|1.000000|1.481481||\n"
    )
    rows = sshare.parse(io.StringIO(text))
    root = fairtree.tree_from_sshare(rows)
    checks = fairtree.check_against(rows, root, fairtree.compute(root))
    strict = fairtree.check_against(rows, root, fairtree.compute(root), tolerance=1e-6)
    assert all(c.ok for c in checks) and all(c.ok for c in strict)
    lf = next(c for c in checks if c.key == ("a", "u1") and c.field == "level_fs")
    assert lf.allowed > 0.05 and lf.diff > 1e-3  # excused by the integer inputs, not by the tolerance


def test_tree_needs_a_root_and_parents_first():
    rows = sshare.read(DATA / "sshare-small-lab.parsable2")
    with pytest.raises(SlurmParseError, match="no root"):
        fairtree.tree_from_sshare([])
    with pytest.raises(SlurmParseError, match="before its parent"):
        fairtree.tree_from_sshare([rows[0], rows[3]])
