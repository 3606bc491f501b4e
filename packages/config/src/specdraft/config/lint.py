"""`lint_file`: every finding for one config file, positioned; never raises, whatever the input.

The order of checks: read and parse the TOML (SD0xx, fatal), validate it against the schema and
its hard rules (SD1xx-SD4xx errors), then, on a valid config, the soft rules and target checks
(`rules.py`). The findings come back sorted by line and column.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomli
from pydantic import ValidationError

from .diagnostics import findings_from_error, place
from .finding import Finding, Problem, display_path
from .loader import ConfigError, read_toml, validate_config
from .positions import index_positions
from .rules import check_config


def lint_file(path: str | Path, strict: bool = False, target: str | None = None) -> list[Finding]:
    """Lint one config file; `strict` turns warnings into errors, `target` replaces model.target."""
    path = str(path)
    try:
        findings = _lint(path, target=target)
    except Exception as exc:  # the linter's own bug must not look like a traceback in pre-commit
        findings = [_internal_error(path, exc)]
    return finalize(findings, strict=strict)


def lint_text(
    text: str,
    path: str = "<string>",
    *,
    strict: bool = False,
    target: str | None = None,
) -> list[Finding]:
    """Lint a config given as text (as if read from `path`); never raises."""
    try:
        findings = _lint_document(path, text, target=target)
    except Exception as exc:
        findings = [_internal_error(path, exc)]
    return finalize(findings, strict=strict)


def finalize(findings: Iterable[Finding], *, strict: bool) -> list[Finding]:
    """Sort findings by place; with `strict`, warnings count as errors."""
    out = [
        Finding(f.path, f.line, f.col, f.code, "error", f.message, f.key)
        if strict and f.severity == "warning"
        else f
        for f in findings
    ]
    return sorted(out, key=lambda f: (f.path, f.line, f.col, f.code))


def _lint(path: str, *, target: str | None) -> list[Finding]:
    try:
        text, document = read_toml(path)
    except ConfigError as err:
        return findings_from_error(err)
    except RecursionError:
        return [_too_deep(path)]
    return _check_document(path, text, document, target=target)


def _lint_document(path: str, text: str, *, target: str | None) -> list[Finding]:
    try:
        document = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        err = ConfigError(
            path,
            f"TOML syntax error: {getattr(exc, 'msg', None) or exc}",
            line=getattr(exc, "lineno", None),
            col=getattr(exc, "colno", None),
            kind="syntax",
        )
        return findings_from_error(err)
    except RecursionError:
        return [_too_deep(path)]
    return _check_document(path, text, document, target=target)


def _check_document(
    path: str, text: str, document: dict[str, Any], *, target: str | None
) -> list[Finding]:
    try:
        config = validate_config(document)
    except ValidationError as exc:
        err = ConfigError(path, "invalid config", validation=exc, text=text)
        return findings_from_error(err)
    index = index_positions(text)
    return [place(p, path, index) for p in check_config(config, document, target=target)]


def _too_deep(path: str) -> Finding:
    return place(
        Problem("SD001", (), "TOML syntax error: the document nests too deeply"), path, None
    )


def _internal_error(path: str, exc: BaseException) -> Finding:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
    message = f"internal error: {type(exc).__name__}: {exc}{at} (please report this)"
    return Finding(display_path(path), 1, 1, "SD003", "error", message, None)
