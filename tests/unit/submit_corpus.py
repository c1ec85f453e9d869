"""tests/cases/submit.yaml: loading its cases, and checking one decision against a case's ``expect``.

Shared by every executor of the corpus: the Python decision
(tests/unit/submit/test_corpus.py), the generated job_submit.lua
(tests/lua/test_lua_corpus.py) and real sbatch (tests/cluster/test_submission.py).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import yaml

from slurm_gpushare.policy import Site, build_site, load_file
from slurm_gpushare.slurmversion import SlurmVersion
from slurm_gpushare.submit import Decision, build_tables, decide, split_options, to_job
from tests.conftest import ROOT

CASES_FILE = ROOT / "tests" / "cases" / "submit.yaml"
TEST_POLICIES = ROOT / "tests" / "data" / "policies"  # policies only tests use (per-job MIG: perjob-lab)
CODES = (
    "BAD_REQUEST",
    "UNKNOWN_TYPE",
    "MPS_RANGE",
    "OVER",
    "SCOPE",
    "MIXED",
    "MPS_TASKS",
    "UNKNOWN_FEATURE",
    "CONSTRAINT",
    "PER_JOB",
    "PER_JOB_FIELD",
    "PER_JOB_TIERS",
    "PER_JOB_SHARD",
    "PER_JOB_EXTRA",
)


def load_cases() -> list[dict]:
    return yaml.safe_load(CASES_FILE.read_text(encoding="utf-8"))["cases"]


CASES = load_cases()
IDS = [c["id"] for c in CASES]


@cache
def site_of(policy: str = "small-lab", submission: tuple = (), slurm_version: str | None = None) -> Site:
    """The example policy, with submission overrides; an older Slurm only changes the version the tables are for."""
    path = ROOT / "etc" / f"{policy}.yaml"
    if not path.exists():
        path = TEST_POLICIES / f"{policy}.yaml"
    if submission:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["submission"] = {**raw.get("submission", {}), **{k: yaml.safe_load(v) for k, v in submission}}
        site = build_site(raw, path.name)
    else:
        site = load_file(path)
    if slurm_version:
        # build_site refuses Slurm < 23.11; the gres: format is still rendered for it.
        site = dataclasses.replace(site, version=SlurmVersion.parse(slurm_version))
    return site


def overrides(case: dict) -> tuple:
    """A case's submission overrides as a hashable key: (name, the value as YAML text), by name."""
    return tuple(sorted((k, yaml.safe_dump(v)) for k, v in case.get("submission", {}).items()))


def case_site(case: dict) -> Site:
    return site_of(case.get("policy", "small-lab"), overrides(case), case.get("slurm_version"))


def case_job(case: dict) -> dict:
    """The job_submit fields of a case: its options placed as sbatch places them, or its fields."""
    if "options" in case:
        return to_job(split_options(case["options"]), build_tables(case_site(case)).prefix)
    return {k: v["text"] * v["times"] if isinstance(v, dict) else v for k, v in case["fields"].items()}


@cache
def _tables(site_key):
    return build_tables(site_of(*site_key))


def python_decision(case: dict) -> Decision:
    key = (case.get("policy", "small-lab"), overrides(case), case.get("slurm_version"))
    modify = case.get("modify")
    current = modify or {}
    return decide(_tables(key), case_job(case), modify is not None, current.get("partition"), current.get("extra"))


def check_expectations(
    case: dict,
    accepted: bool,
    codes: list[str],
    message: str | None,
    partition,
    fields: dict,
    qos: str | None = None,
    extra: str | None = None,
) -> None:
    """One case's ``expect`` against a decision, however it was reached (Python or Lua)."""
    want = case["expect"]
    assert accepted == want["accept"], f"{case['id']}: accepted={accepted}, message: {message}"
    assert codes == want.get("codes", []), f"{case['id']}: codes {codes}"
    if "message" in want:
        assert message is not None and want["message"] in message, f"{case['id']}: message {message!r}"
    assert partition == want.get("partition"), f"{case['id']}: partition {partition}"
    assert fields == want.get("fields", {}), f"{case['id']}: fields {fields}"
    assert qos == want.get("qos"), f"{case['id']}: qos {qos}"
    assert extra == want.get("extra"), f"{case['id']}: extra {extra}"
