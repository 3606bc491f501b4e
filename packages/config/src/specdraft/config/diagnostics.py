"""Turn a `ConfigError` (unreadable, not TOML, bad override, invalid) into positioned findings.

Shared by `lint` and by every command that loads a config (`train`, `config show`, ...), so a bad
config reads the same everywhere: `path:line:col: CODE message`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from .codes import code_for, get
from .finding import Finding, Problem, display_path, key_text
from .loader import ConfigError, parse_override
from .positions import KeyPath, PositionIndex, index_positions
from .schema_walk import iter_tables, model_at, table_model, table_name


def findings_from_error(err: ConfigError, overrides: Iterable[str] = ()) -> list[Finding]:
    """The findings that explain why a config could not be loaded."""
    if err.kind == "syntax":
        finding = Finding(
            path=display_path(err.path),
            line=err.line or 1,
            col=err.col or 1,
            code="SD001",
            severity="error",
            message=err.message,
            key=None,
        )
        return [finding]
    if err.kind == "io":
        return [place(Problem("SD002", (), err.message), err.path, None)]
    if err.kind == "override" or err.validation is None:
        return [place(Problem("SD004", (), err.message), err.path, None)]
    index = _safe_index(err.text or "")
    problems = [_attribute(p, overrides) for p in problems_from_validation(err.validation)]
    return [place(p, err.path, index) for p in problems]


def problems_from_validation(exc: ValidationError) -> list[Problem]:
    """One problem per pydantic error, with its code, key path and a message that says the fix."""
    return [_problem(error) for error in exc.errors()]


def _safe_index(text: str) -> PositionIndex | None:
    try:
        return index_positions(text)
    except Exception:  # positions are a courtesy: never let them hide the finding itself
        return None


def _problem(error: Any) -> Problem:
    error_type = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    code = code_for(error_type).code
    if isinstance(ctx.get("key"), str):
        # Schema rules name the offending key (and element) themselves.
        path: KeyPath = tuple(ctx["key"].split("."))
        if isinstance(ctx.get("index"), int):
            path = (*path, ctx["index"])
        return Problem(code, path, str(error.get("msg", "")))
    path = _clean_loc(error.get("loc", ()))
    if error_type == "extra_forbidden":
        return Problem(code, path, _unknown_key_message(path), at="key")
    if error_type == "missing":
        return Problem(code, path, _missing_key_message(path), at="key")
    return Problem(code, path, _value_message(path, error_type, error))


def _clean_loc(loc: Iterable[Any]) -> KeyPath:
    """The key path of a pydantic location, without its internal steps such as 'list[int]'."""
    return tuple(p for p in loc if isinstance(p, int) or not any(c in str(p) for c in "[]()"))


def _attribute(problem: Problem, overrides: Iterable[str]) -> Problem:
    """Say so when a problem comes from a `--set` override rather than from the file."""
    # The last override of a key is the one in effect: search from the end.
    for item in reversed(list(overrides)):
        try:
            parts, _ = parse_override(item)
        except ValueError:
            continue
        if tuple(problem.key[: len(parts)]) == tuple(parts):
            # The file's own value was replaced, so point at its key (or table), not inside it.
            message = f"{problem.message} (from --set {item})"
            return Problem(problem.code, problem.key, message, "key", tuple(parts))
    return problem


# ------------------------------------------------------------------------------------ messages


def _unknown_key_message(path: KeyPath) -> str:
    name, parent = str(path[-1]) if path else "", path[:-1]
    where = table_name(parent)
    head = f"unknown key '{name}' in {where}"
    model = model_at(parent)
    if model is None:
        return head
    here = list(model.model_fields)
    near = difflib.get_close_matches(name, here, n=1, cutoff=0.8)
    if near:
        return f"{head}; did you mean '{near[0]}'?"
    elsewhere = _homes_of(name)
    if elsewhere:
        return f"{head}; it belongs in {table_name(elsewhere[0])}"
    everywhere = {f"{'.'.join(map(str, t))}.{n}" if t else n: (t, n) for t, n in _all_keys()}
    near = difflib.get_close_matches(name, [n for _, n in everywhere.values()], n=1, cutoff=0.8)
    if near:
        dotted = next(k for k, (_, n) in everywhere.items() if n == near[0])
        return f"{head}; did you mean '{dotted}'?"
    near = difflib.get_close_matches(name, here, n=1, cutoff=0.6)
    if near:
        return f"{head}; did you mean '{near[0]}'?"
    return f"{head}; allowed keys: {', '.join(here)}"


def _missing_key_message(path: KeyPath) -> str:
    name, parent = str(path[-1]) if path else "", path[:-1]
    model = model_at(parent)
    info = model.model_fields.get(name) if model is not None else None
    if info is not None and table_model(info.annotation) is not None:
        head = f"missing required table {table_name(path)}"
    else:
        head = f"missing required key '{name}' in {table_name(parent)}"
    description = (info.description or "") if info is not None else ""
    return f"{head}: {_first_sentence(description)}" if description else head


def _value_message(path: KeyPath, error_type: str, error: Any) -> str:
    msg = str(error.get("msg", "invalid value"))
    msg = msg[:1].lower() + msg[1:]
    value = error.get("input")
    key = key_text(path) or "the document"
    text = f"{key} = {short_value(value)}: {msg}"
    if error_type == "list_type" and isinstance(value, str | int | float):
        text += f"; write a list: [{short_value(value)}]"
    return text


def _homes_of(name: str) -> list[KeyPath]:
    return [table for table, model in iter_tables() if name in model.model_fields]


def _all_keys() -> list[tuple[KeyPath, str]]:
    return [(table, n) for table, model in iter_tables() for n in model.model_fields]


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


def short_value(value: Any, limit: int = 60) -> str:
    """A value as it would look in TOML, cut to `limit` characters."""
    text = _toml_like(value, depth=0)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _toml_like(value: Any, depth: int) -> str:
    if depth > 3:
        return "…"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        items = [_toml_like(v, depth + 1) for v in list(value)[:8]]
        return "[" + ", ".join(items) + (", …" if len(value) > 8 else "") + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = …" for k in list(value)[:4]) + "}"
    return str(value)


def place(problem: Problem, path: str, index: PositionIndex | None) -> Finding:
    """Give a problem its file, line and column."""
    where = problem.key if problem.anchor is None else problem.anchor
    line, col = index.locate(where, at=problem.at) if index is not None else (1, 1)
    entry = get(problem.code)
    return Finding(
        path=display_path(path),
        line=line,
        col=col,
        code=entry.code,
        severity=entry.severity,
        message=problem.message,
        key=key_text(problem.key),
    )
