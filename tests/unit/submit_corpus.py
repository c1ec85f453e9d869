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
    "UNTYPED",
)


def load_cases() -> list[dict]:
    return yaml.safe_load(CASES_FILE.read_text(encoding="utf-8"))["cases"]


CASES = load_cases()
IDS = [c["id"] for c in CASES]


@cache
def site_of(policy: str = "small-lab", submission: tuple = (), slurm_version: str | None = None) -> Site:
    """The example policy, with overrides (``submission``: submission keys, and ``tiers.<name>`` for a tier's keys);
    an older Slurm only changes the version the tables are for."""
    path = ROOT / "etc" / f"{policy}.yaml"
    if not path.exists():
        path = TEST_POLICIES / f"{policy}.yaml"
    if submission:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        tiers = {k.split(".", 1)[1]: yaml.safe_load(v) for k, v in submission if k.startswith("tiers.")}
        mine = {k: yaml.safe_load(v) for k, v in submission if not k.startswith("tiers.")}
        raw["submission"] = {**raw.get("submission", {}), **mine}
        raw["tiers"] = [{**t, **tiers.get(t["name"], {})} for t in raw["tiers"]]
        site = build_site(raw, path.name)
    else:
        site = load_file(path)
    if slurm_version:
        # build_site refuses Slurm < 23.11; the gres: format is still rendered for it.
        site = dataclasses.replace(site, version=SlurmVersion.parse(slurm_version))
    return site


def overrides(case: dict) -> tuple:
    """A case's overrides as a hashable key: (name, the value as YAML text), by name; its ``tiers`` (a tier's
    keys by tier name) as ``tiers.<name>``."""
    tiers = {f"tiers.{name}": keys for name, keys in case.get("tiers", {}).items()}
    return tuple(sorted((k, yaml.safe_dump(v)) for k, v in {**case.get("submission", {}), **tiers}.items()))


def case_site(case: dict) -> Site:
    return site_of(case.get("policy", "small-lab"), overrides(case), case.get("slurm_version"))


def case_job(case: dict) -> dict:
    """The job_submit fields of a case: its options placed as sbatch places them, or its fields; and
    ``assoc_qos`` (job_desc.assoc_qos), the case's (null: none), else the QOS list alice/physics has on the test
    cluster."""
    if "options" in case:
        job = to_job(split_options(case["options"]), build_tables(case_site(case)).prefix)
    else:
        job = {k: v["text"] * v["times"] if isinstance(v, dict) else v for k, v in case["fields"].items()}
    assoc_qos = case["assoc_qos"] if "assoc_qos" in case else default_assoc_qos(case)
    return job if assoc_qos is None else {**job, "assoc_qos": assoc_qos}  # None: Slurm knows no association


def default_assoc_qos(case: dict) -> str:
    """What `gpushare accounts apply` gives a managed association: Slurm's normal and every tier QOS."""
    return ",".join(["normal", *(t.name for t in case_site(case).tiers)])


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
