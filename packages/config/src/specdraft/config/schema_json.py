"""The JSON Schema of a config file, for editors (Even Better TOML / taplo) and for the docs."""

from __future__ import annotations

import json
from typing import Any

from .schema import Config

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of `Config`, with the dialect and a title editors show."""
    schema = Config.model_json_schema()
    return {"$schema": JSON_SCHEMA_DIALECT, "title": "specdraft config", **_without_title(schema)}


def render_json_schema() -> str:
    """The JSON Schema as stable, indented text (what `specdraft config schema` prints)."""
    return json.dumps(config_json_schema(), indent=2, ensure_ascii=False) + "\n"


def _without_title(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "title"}
