"""Render docs/config.md, the reference of every config field, from the schema descriptions.

The page is generated (`python scripts/generate_config_docs.py`) and a test checks that the
committed copy is current, so the reference cannot drift from the schema.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Annotated, Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .codes import CODES
from .positions import KeyPath
from .schema_walk import iter_tables, table_model, table_name
from .toml_writer import toml_value

_INTRO = """\
# Config reference

<!-- Generated from the schema by `python scripts/generate_config_docs.py`; do not edit. -->

A specdraft config is one TOML file. Every key below is optional unless its default says
*required*; unknown keys are errors. `specdraft lint FILE` checks a file (the codes are listed at
the end of this page), `specdraft config show FILE` prints it with every default filled in, and
`specdraft config schema` prints the JSON Schema (also committed as `docs/config-schema.json`)
for editor completion.
"""


def render_reference() -> str:
    """The whole reference page as Markdown."""
    parts = [_INTRO]
    for path, model in iter_tables():
        parts.append(_table_section(path, model))
    parts.append(_codes_section())
    return "\n".join(parts).rstrip("\n") + "\n"


def _table_section(path: KeyPath, model: type[BaseModel]) -> str:
    title = f"## `{table_name(path)}`" if path else "## Top level"
    doc = " ".join((model.__doc__ or "").split())
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if table_model(info.annotation) is not None:
            continue  # sub-tables get their own section
        key = ".".join([*map(str, path), name])
        rows.append(
            f"| `{key}` | {_cell(type_text(info))} | {_cell(default_text(info))} | "
            f"{_cell(info.description or '')} |"
        )
    body = "\n".join(rows) if len(rows) > 2 else "*(tables only)*"
    return f"{title}\n\n{doc}\n\n{body}\n"


def _codes_section() -> str:
    rows = ["## Lint codes", "", "| code | name | severity | meaning |", "|---|---|---|---|"]
    for code in CODES:
        rows.append(f"| {code.code} | {code.name} | {code.severity} | {_cell(code.summary)} |")
    return "\n".join(rows) + "\n"


def type_text(info: FieldInfo) -> str:
    """A field's type as a reader wants it: 'integer > 0', '"sdpa" | "flex"', 'list of string'."""
    return _annotation_text(Annotated[(info.annotation, *info.metadata)] if info.metadata
                            else info.annotation)  # fmt: skip


def default_text(info: FieldInfo) -> str:
    """A field's default in TOML spelling, 'required', or 'unset'."""
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "(table)" if isinstance(value, BaseModel) else f"`{toml_value(value)}`"
    if info.default is None:
        return "unset"
    return f"`{toml_value(info.default)}`"


_NAMES = {int: "integer", float: "float", str: "string", bool: "boolean"}


def _annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        base, notes = _annotation_text(args[0]), _constraints(args[1:])
        if "non-empty" in notes:
            notes.remove("non-empty")
            base = f"non-empty {base}"
        return " ".join([base, ", ".join(notes)]) if notes else base
    if origin in (typing.Union, types.UnionType):
        kept = [_annotation_text(a) for a in args if a is not type(None)]
        optional = " (optional)" if type(None) in args else ""
        return " or ".join(kept) + optional
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"list of {_annotation_text(args[0]) if args else 'values'}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def format_bound(value: Any) -> str:
    """A bound as text, the same for 0 and 0.0: pydantic may hand back an equal cached
    annotated_types bound of the other type (Ge(0) == Ge(0.0)), depending on import order."""
    if isinstance(value, (int, float)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _constraints(metadata: tuple[Any, ...]) -> list[str]:
    out = []
    for item in metadata:
        inner = item.metadata if isinstance(item, FieldInfo) else [item]
        for m in inner:
            if isinstance(m, at.Gt):
                out.append(f"> {format_bound(m.gt)}")
            elif isinstance(m, at.Ge):
                out.append(f">= {format_bound(m.ge)}")
            elif isinstance(m, at.Lt):
                out.append(f"< {format_bound(m.lt)}")
            elif isinstance(m, at.Le):
                out.append(f"<= {format_bound(m.le)}")
            elif isinstance(m, at.MinLen):
                out.append("non-empty" if m.min_length == 1 else f"length >= {m.min_length}")
            elif getattr(m, "pattern", None):
                out.append(f"matching `{m.pattern}`")
    return out


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
