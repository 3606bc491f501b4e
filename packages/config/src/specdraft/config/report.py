"""Lint output: `path:line:col: CODE message` text, a JSON list, and the exit status.

The exit status lives in one small object (`ExitCode.of`) so `lint`, `config show` and `train`
agree on it: 0 clean (notes and warnings allowed), 1 findings, 2 usage, I/O or TOML syntax errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from enum import IntEnum

from .codes import get
from .diagnostics import findings_from_error
from .finding import Finding
from .loader import ConfigError

TEXT_LINE = r"^(?P<path>.+):(?P<line>\d+):(?P<col>\d+): (?P<code>SD\d{3}) (?P<message>.+)$"


class ExitCode(IntEnum):
    """The exit status of a command that checks configs."""

    CLEAN = 0
    FINDINGS = 1
    FATAL = 2

    @classmethod
    def of(cls, findings: Iterable[Finding]) -> ExitCode:
        """2 if a file could not be checked, else 1 if any error, else 0."""
        status = cls.CLEAN
        for finding in findings:
            if get(finding.code).fatal:
                return cls.FATAL
            if finding.severity == "error":
                status = cls.FINDINGS
        return status


def render_text(findings: Iterable[Finding]) -> str:
    """One `path:line:col: CODE message` line per finding (warnings and notes say so)."""
    lines = []
    for f in findings:
        label = "" if f.severity == "error" else f"{f.severity}: "
        message = " ".join(f.message.split())  # one finding, one line
        lines.append(f"{f.path}:{f.line}:{f.col}: {f.code} {label}{message}")
    return "\n".join(lines)


def render_json(findings: Iterable[Finding]) -> str:
    """A JSON list of findings: path, line, col, code, severity, message, key."""
    return json.dumps([f.to_dict() for f in findings], indent=2, ensure_ascii=False)


def summary(findings: Sequence[Finding], files: int) -> str:
    """A closing line such as '3 files checked: 1 error, 0 warnings, 2 notes'."""
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    parts = [f"{n} {s}{'' if n == 1 else 's'}" for s, n in counts.items()]
    return f"{files} file{'' if files == 1 else 's'} checked: {', '.join(parts)}"


def format_config_error(err: ConfigError, overrides: Iterable[str] = ()) -> str:
    """A config that failed to load, as `path:line:col: CODE message` lines."""
    return render_text(findings_from_error(err, overrides))
