"""The JSON Schema and docs/config.md stay in step with the pydantic models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.config.reference import render_reference
from specdraft.config.schema_json import config_json_schema, render_json_schema
from specdraft.config.schema_walk import iter_tables, table_model

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "run `python scripts/generate_config_docs.py`"


def _properties(schema: dict, model: type) -> dict:
    """The JSON Schema properties of one model (the root or one of its $defs)."""
    node = schema if model.__name__ == "Config" else schema["$defs"][model.__name__]
    return node["properties"]


def test_every_field_of_every_model_has_a_description():
    for path, model in iter_tables():
        assert model.__doc__, f"{model.__name__} needs a docstring (it heads its docs section)"
        for name, info in model.model_fields.items():
            assert info.description, f"{'.'.join([*path, name])} needs a description"


def test_json_schema_carries_every_field_with_its_description():
    schema = config_json_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    for _, model in iter_tables():
        properties = _properties(schema, model)
        assert set(properties) == set(model.model_fields)
        for name, info in model.model_fields.items():
            assert properties[name]["description"] == info.description
        node = schema if model.__name__ == "Config" else schema["$defs"][model.__name__]
        assert node["additionalProperties"] is False  # unknown keys are errors in editors too


def test_committed_json_schema_is_current():
    committed = (ROOT / "docs" / "config-schema.json").read_text(encoding="utf-8")
    assert committed == render_json_schema(), f"docs/config-schema.json is stale: {REGENERATE}"
    json.loads(committed)


def test_committed_reference_is_current_and_lists_every_key():
    committed = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == render_reference(), f"docs/config.md is stale: {REGENERATE}"
    for path, model in iter_tables():
        for name, info in model.model_fields.items():
            if table_model(info.annotation) is None:
                assert f"`{'.'.join([*path, name])}`" in committed


@pytest.mark.subprocess
def test_generator_check_mode_agrees():
    script = ROOT / "scripts" / "generate_config_docs.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
