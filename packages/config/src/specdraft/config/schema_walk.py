"""Walk the config schema as TOML tables: which model holds a key path, and every table in order.

The linter uses it for "did you mean" and "missing table" messages, the docs generator and the
schema tests to visit every field of every model.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from .positions import KeyPath
from .schema import Config


def table_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation stands for when the field is a table, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    # `Section | None` is still a table when present.
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if table_model(a) is not None]
        if len(models) == 1:
            return table_model(models[0])
    return None


def model_at(path: KeyPath, root: type[BaseModel] = Config) -> type[BaseModel] | None:
    """The model of the table at `path` (() is the whole config), or None if it is not a table."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = table_model(model.model_fields[part].annotation)
    return model


def iter_tables(root: type[BaseModel] = Config) -> Iterator[tuple[KeyPath, type[BaseModel]]]:
    """Every table of the schema, parents before children, in field order."""
    pending: list[tuple[KeyPath, type[BaseModel]]] = [((), root)]
    while pending:
        path, model = pending.pop(0)
        yield path, model
        children = []
        for name, info in model.model_fields.items():
            child = table_model(info.annotation)
            if child is not None:
                children.append(((*path, name), child))
        pending[:0] = children


def table_name(path: KeyPath) -> str:
    """How a table is written in TOML: `[model.dflash2]`, or 'the top level' for ()."""
    return f"[{'.'.join(str(p) for p in path)}]" if path else "the top level"
