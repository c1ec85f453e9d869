"""sshare -a -l --parsable2 and sshare --json: the tree recovered from indentation, values as printed."""

from __future__ import annotations

import io
import math

import pytest

from slurm_gpushare.slurm import sshare
from slurm_gpushare.slurm.parsable import SlurmParseError
from tests.unit.slurm_fakes import DATA, FakeSlurm

PARSABLE = DATA / "sshare-small-lab.parsable2"
JSON = DATA / "sshare-small-lab.v0.0.42.json"


def by_key(rows):
    return {r.key: r for r in rows}


def test_tree_from_indentation():
    rows = by_key(sshare.read(PARSABLE))
    assert rows[("root", "")].parent is None and rows[("root", "")].raw_shares is None
    assert rows[("root", "root")].parent == "root"
    assert rows[("biology-imaging", "")].parent == "biology" and rows[("biology-imaging", "")].depth == 2
    assert (
        rows[("biology-imaging", "dave")].parent == "biology-imaging" and rows[("biology-imaging", "dave")].depth == 3
    )
    assert rows[("physics", "")].parent == "root"


def test_values_as_printed():
    rows = by_key(sshare.read(PARSABLE))
    bob = rows[("physics", "bob")]
    assert (bob.raw_shares, bob.norm_shares, bob.raw_usage, bob.effective_usage, bob.fairshare, bob.level_fs) == (
        1,
        0.5,
        100000,
        0.25,
        0.4,
        2.0,
    )
    assert math.isinf(rows[("root", "root")].level_fs)
    assert rows[("physics", "")].fairshare is None  # accounts have no factor under Fair Tree
    assert rows[("root", "")].level_fs is None
    assert not bob.exact_usage


def test_json_gives_the_same_tree_with_exact_usage():
    a, b = sshare.read(PARSABLE), sshare.read(JSON)
    assert [(r.key, r.parent, r.depth, r.raw_shares, r.raw_usage) for r in a] == [
        (r.key, r.parent, r.depth, r.raw_shares, r.raw_usage) for r in b
    ]
    exact = by_key(b)[("physics", "")]
    assert exact.exact_usage and exact.effective_usage == 400000 / 600000
    assert by_key(b)[("root", "root")].fairshare == 1.0 and math.isinf(by_key(b)[("root", "root")].level_fs)


def test_parent_shares_and_no_header():
    text = " a||parent|0.000000|10|0.5|0.5||||\n  a|u|parent|0.000000|10|0.5|1.0|1.000000|||\n"
    rows = sshare.parse(io.StringIO("root|||0.000000|20|1.0|1.0||||\n" + text))
    assert rows[1].shares_parent and rows[1].raw_shares is None and rows[1].level_fs is None
    assert rows[2].shares_parent and rows[2].parent == "a"


def test_json_parent_shares():
    doc = (
        '{"shares": {"shares": [{"name": "root", "parent": "", "type": ["ASSOCIATION"], "shares": {"set": false}},'
        ' {"name": "u", "parent": "root", "type": ["USER"], "shares": {"set": true, "number": 2147483647},'
        ' "fairshare": {"level": {"set": true, "infinite": true, "number": 0},'
        ' "factor": {"set": true, "number": 1.0}}}]}}'
    )
    root, u = sshare.parse_json(io.StringIO(doc))
    assert u.shares_parent and u.raw_shares is None and math.isinf(u.level_fs) and u.account == "root"


def test_user_without_its_account_is_an_error():
    with pytest.raises(SlurmParseError, match="does not follow its account"):
        sshare.parse(io.StringIO("root|||0|0|0|0||||\n  physics|bob|1|0.5|0|0|0|0|0||\n"))
    with pytest.raises(SlurmParseError, match="parent is missing"):
        sshare.parse(io.StringIO("root|||0|0|0|0||||\n   deep||1|0.5|0|0|0||0||\n"))


def test_live_query_uses_the_runner():
    fake = FakeSlurm.recorded()
    rows = sshare.query(fake)
    assert fake.calls == [("sshare", "-a", "-l", "--parsable2")]
    assert len(rows) == 9
    exact = sshare.query(fake, as_json=True)
    assert fake.calls[-1] == ("sshare", "-a", "--json") and all(r.exact_usage for r in exact)
