"""tests/cases/submit.yaml through the Python decision (the loader: submit_corpus.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.unit.submit_corpus import CASES, CODES, IDS, TEST_POLICIES, check_expectations, python_decision


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_case(case):
    d = python_decision(case)
    check_expectations(case, d.accepted, d.codes, d.user_message, d.partition, dict(d.fields), d.qos, d.extra)


def test_corpus_is_big_enough_and_ids_unique():
    assert len(CASES) >= 60
    assert len(set(IDS)) == len(IDS)


def test_every_rule_and_policy_is_covered():
    codes = {code.split()[0] for c in CASES for code in c["expect"].get("codes", [])}
    assert codes == set(CODES)
    examples = {p.stem for p in (ROOT / "etc").glob("*.yaml")}
    assert {c.get("policy", "small-lab") for c in CASES} == examples | {p.stem for p in TEST_POLICIES.glob("*.yaml")}
    fields = [c["fields"] for c in CASES if "fields" in c]
    texts = [v for f in fields for v in f.values() if isinstance(v, str)]
    assert any(t.startswith("gres:") for t in texts) and any(t.startswith("gres/") for t in texts)
    opts = " ".join(o for c in CASES for o in c.get("options", []))
    for option in ("--gres", "--gpus=", "--gpus-per-task", "--gpus-per-socket", "--gpus-per-node", "-G", "-p"):
        assert option in opts, option
    assert any(c["expect"].get("partition") for c in CASES) and any(c["expect"].get("fields") for c in CASES)
    assert any("modify" in c for c in CASES)
    # the tier QOS: set for GPU and non-GPU jobs, from routing and from a given partition; a named QOS is kept
    assert any(c["fields"].get("qos") for c in CASES if "fields" in c)
    assert any(c["expect"].get("qos") and c["expect"].get("partition") for c in CASES)


def test_cluster_cases_are_for_the_test_cluster():
    cluster = [c for c in CASES if c.get("cluster")]
    assert 20 <= len(cluster) <= 40  # each one two real sbatch calls per cluster run
    for c in cluster:
        assert c.get("policy", "small-lab") == "small-lab" and "options" in c, c["id"]
        assert not ({"submission", "slurm_version", "modify"} & set(c)), c["id"]
    assert {c["expect"]["accept"] for c in cluster} == {True, False}
