"""A refusal that suggests a request suggests one the same policy accepts (submit/tables.py ``whole_request``).

Every ``--gres=...`` a refusal's message names is submitted as a job of its own (naming no partition, as the
rejections page's examples are) and must be accepted: over every refusal of the corpus (tests/cases/submit.yaml),
and over a set of refused requests on every example policy and the per-job test policy, as they are and with
every tier set to ``untyped_gpu: refuse`` (where a bare ``--gres=gpu:1`` is itself refused)."""

from __future__ import annotations

import re
from functools import cache

import pytest
import yaml

from slurm_gpushare.submit import Decision, build_tables, decide, split_options, to_job
from tests.conftest import ROOT
from tests.unit.submit_corpus import CASES, TEST_POLICIES, case_site, python_decision, site_of

POLICIES = sorted(p.stem for p in [*(ROOT / "etc").glob("*.yaml"), *TEST_POLICIES.glob("*.yaml")])
# requests each refused with a message that may suggest another (on a site that offers what they name)
REFUSED = (
    ("--gres=mps:1000",),  # MPS_RANGE
    ("--gres=shard:2",),  # OVER
    ("--gres=mps:10", "--ntasks-per-node=2"),  # MPS_TASKS
    ("--tres-per-task=gres/shard:1",),  # SCOPE
    ("--gres=gpu:1",),  # UNTYPED where a tier refuses it
    ("--gres=gpu:1", "--constraint=nosuchfeature"),  # UNKNOWN_FEATURE
    ("--gres=gpu:nosuchtype:1",),  # UNKNOWN_TYPE
)
SUGGESTION = re.compile(r"--gres=([A-Za-z0-9_.:/]+)")


def refusing(policy: str) -> tuple:
    """The overrides (as submit_corpus.site_of takes them) that set every tier of the policy to refuse untyped."""
    path = ROOT / "etc" / f"{policy}.yaml"
    raw = yaml.safe_load((path if path.exists() else TEST_POLICIES / f"{policy}.yaml").read_text(encoding="utf-8"))
    return tuple(sorted((f"tiers.{t['name']}", yaml.safe_dump({"untyped_gpu": "refuse"})) for t in raw["tiers"]))


@cache
def tables(policy: str, refuse: bool):
    return build_tables(site_of(policy, refusing(policy) if refuse else ()))


def decision(tb, options) -> Decision:
    return decide(tb, to_job(split_options(list(options)), tb.prefix))


def suggestions(d: Decision) -> set[str]:
    """The requests the refusal suggests (not a form it describes: ``--gres=gpu:N``)."""
    found = {m.rstrip(".") for v in d.violations for m in SUGGESTION.findall(v.message)}
    return {m for m in found if not re.search(r"(^|:)[A-Z]+(:|$)", m)}


def refused_suggestions(tb, d: Decision) -> list[str]:
    out = []
    for request in sorted(suggestions(d)):
        got = decision(tb, (f"--gres={request}",))
        if not got.accepted:
            out.append(f"--gres={request}: {got.user_message}")
    return out


@pytest.mark.parametrize("refuse", [False, True], ids=["as-written", "untyped-refused"])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_suggested_request_is_accepted(policy, refuse):
    tb = tables(policy, refuse)
    bad, seen = [], set()
    for options in REFUSED:
        d = decision(tb, options)
        seen |= suggestions(d)
        bad += [f"{' '.join(options)} -> {line}" for line in refused_suggestions(tb, d)]
    assert not bad, "\n".join(bad)
    assert seen, "no refusal here suggested a request: the test would prove nothing"
    if refuse:
        assert "gpu:1" not in seen, seen


def test_the_corpus_refusals_suggest_only_accepted_requests():
    bad, checked = [], 0
    for case in CASES:
        d = python_decision(case)
        if d.accepted or not suggestions(d):
            continue
        checked += 1
        bad += [f"{case['id']}: {line}" for line in refused_suggestions(build_tables(case_site(case)), d)]
    assert not bad, "\n".join(bad)
    assert checked >= 10


def test_where_untyped_is_refused_the_whole_gpu_is_named_by_its_type():
    """small-lab with every tier refusing untyped requests: MPS_RANGE, OVER and MPS_TASKS name the whole L40S."""
    tb = tables("small-lab", True)
    for options, code in (
        (("--gres=mps:1000",), "MPS_RANGE"),
        (("--gres=shard:2",), "OVER"),
        (("--gres=mps:10", "--ntasks-per-node=2"), "MPS_TASKS"),
    ):
        d = decision(tb, options)
        assert d.codes[0].startswith(code) and "--gres=gpu:l40s:1" in d.user_message, d.user_message
        assert "--gres=gpu:1" not in d.user_message
    assert "--gres=gpu:1" in decision(tables("small-lab", False), ("--gres=mps:1000",)).user_message
