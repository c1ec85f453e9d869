"""The policy reference and the JSON Schema in docs/reference are what `gpushare schema` generates from the
policy model now, and every key of the model has a meaning there."""

from __future__ import annotations

import json

from click.testing import CliRunner

from slurm_gpushare.cli import main
from slurm_gpushare.cli.schema import policy_schema, reference_markdown, schema_json
from tests.conftest import ROOT

REGEN = (
    "regenerate: gpushare schema > docs/reference/policy.schema.json && "
    "gpushare schema --format markdown > docs/reference/policy.md"
)


def test_committed_json_schema_is_current():
    assert (ROOT / "docs/reference/policy.schema.json").read_text() == schema_json(), REGEN


def test_committed_reference_page_is_current():
    assert (ROOT / "docs/reference/policy.md").read_text() == reference_markdown(), REGEN


def test_every_key_of_the_model_has_a_meaning():
    """Each field of the policy model carries its description (``Field(description=...)``), and the schema shows it."""
    from pydantic import BaseModel

    from slurm_gpushare.policy import model

    classes = [c for c in vars(model).values() if isinstance(c, type) and issubclass(c, BaseModel)]
    missing = [
        f"{c.__name__}.{name}" for c in classes for name, field in c.model_fields.items() if not field.description
    ]
    assert missing == [], f"give these a Field(description=...) in slurm_gpushare/policy/model.py: {missing}"
    schema = policy_schema()
    for section in [schema, *schema["$defs"].values()]:
        for key, prop in section.get("properties", {}).items():
            assert prop.get("description"), key


def test_every_key_appears_in_the_reference_page():
    page = reference_markdown()
    schema = policy_schema()
    for section in [schema, *schema["$defs"].values()]:
        for key in section.get("properties", {}):
            assert f"| `{key}` |" in page, key


def test_cli_prints_the_schema_and_the_examples_use_only_its_keys():
    out = CliRunner().invoke(main, ["schema"])
    assert out.exit_code == 0, out.output
    schema = json.loads(out.output)
    assert schema["additionalProperties"] is False and set(schema["required"]) >= {"version", "cluster"}
    import yaml

    for example in sorted((ROOT / "etc").glob("*.yaml")):
        doc = yaml.safe_load(example.read_text())
        assert set(doc) <= set(schema["properties"]), example.name
        assert set(doc["cluster"]) <= set(schema["$defs"]["Cluster"]["properties"]), example.name


def test_markdown_format():
    out = CliRunner().invoke(main, ["schema", "--format", "markdown"])
    assert out.exit_code == 0 and out.output.startswith("# Policy reference")
    assert "## `node_groups[].sharing[]`" in out.output and "## Example" in out.output
