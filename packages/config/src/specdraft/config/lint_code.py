"""One lint code's entry (`Code`) and the severities; the tables are `codes.py` and each
family's `FamilyRules.codes`. Its own module, importing nothing, so a family can declare its
codes without importing the table that lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Code:
    """One lint code: what it is called, how bad it is, and which error types it covers."""

    code: str
    name: str
    severity: Severity
    summary: str
    # Error types (schema rule types or pydantic types) reported under this code.
    types: tuple[str, ...] = ()
    # The file could not be checked at all (unreadable, not TOML): exit status 2, not 1.
    fatal: bool = False
