"""Load a config from TOML (tomli, for its line/column on syntax errors) with `--set` overrides."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomli
from pydantic import ValidationError

from .schema import Config


class ConfigError(Exception):
    """A config that cannot be used: unreadable, not TOML, bad override, or invalid.

    `path` is the file; `syntax` carries (line, col) for TOML syntax errors; `validation` the
    pydantic error; `text` the document, so callers can render file:line:col messages.
    """

    def __init__(
        self,
        path: str,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        validation: ValidationError | None = None,
        text: str | None = None,
        kind: str = "invalid",
    ) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.line = line
        self.col = col
        self.validation = validation
        self.text = text
        self.kind = kind  # "io" | "syntax" | "override" | "invalid"

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where = f"{where}:{self.line}:{self.col or 1}"
        return f"{where}: {self.message}"


def read_toml(path: str | Path) -> tuple[str, dict[str, Any]]:
    """Read and parse a TOML file; raise ConfigError with the parser's line and column."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"cannot read config: {exc}", kind="io") from exc
    try:
        return text, tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        message = getattr(exc, "msg", None) or str(exc)
        raise ConfigError(
            path,
            f"TOML syntax error: {message}",
            line=getattr(exc, "lineno", None),
            col=getattr(exc, "colno", None),
            text=text,
            kind="syntax",
        ) from exc


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse `a.b.c=value`; the value is read as a TOML literal, else taken as a bare string."""
    if "=" not in item:
        raise ValueError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    parts = [p.strip() for p in key.strip().split(".")]
    if not all(parts):
        raise ValueError(f"override {item!r} has an empty key part")
    raw = raw.strip()
    try:
        value = tomli.loads(f"v = {raw}")["v"]
    except tomli.TOMLDecodeError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides to a parsed document (in place) and return it."""
    for item in overrides:
        parts, value = parse_override(item)
        node: Any = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {part!r} is not a table")
            node = child
        node[parts[-1]] = value
    return data


def validate_config(data: Mapping[str, Any]) -> Config:
    """Validate a parsed document into a Config (raises pydantic.ValidationError)."""
    return Config.model_validate(dict(data))


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Load, override and validate a config file; raise ConfigError on any problem."""
    path = str(path)
    text, data = read_toml(path)
    try:
        apply_overrides(data, overrides)
    except ValueError as exc:
        raise ConfigError(path, str(exc), kind="override") from exc
    try:
        return validate_config(data)
    except ValidationError as exc:
        raise ConfigError(path, _summarise(exc), validation=exc, text=text, kind="invalid") from exc


def _summarise(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err.get("loc", ()))
        ctx_key = (err.get("ctx") or {}).get("key")
        lines.append(f"{ctx_key or key or '<root>'}: {err.get('msg')}")
    return "invalid config:\n  " + "\n  ".join(lines)
