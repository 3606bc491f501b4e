"""Write a plain config mapping as TOML (for `specdraft config show`), without a dependency.

Only what a config holds: tables, strings, booleans, integers, floats and lists of those. TOML has
no null, so unset optional keys are written as comments, which keeps them visible to the reader.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dump_toml(data: Mapping[str, Any], *, header: str = "") -> str:
    """TOML text for a mapping of scalars, lists and nested tables."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    _write_table(lines, (), data)
    return "\n".join(lines).strip("\n") + "\n"


def _write_table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    if path:
        lines += ["", f"[{'.'.join(_key(p) for p in path)}]"]
    subtables = []
    for name, value in table.items():
        if isinstance(value, Mapping):
            subtables.append((name, value))
        elif value is None:
            lines.append(f"# {_key(name)} is not set")
        else:
            lines.append(f"{_key(name)} = {toml_value(value)}")
    for name, value in subtables:
        _write_table(lines, (*path, name), value)


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def toml_value(value: Any) -> str:
    """One TOML value: string, bool, int, float or a list of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _string(text: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
