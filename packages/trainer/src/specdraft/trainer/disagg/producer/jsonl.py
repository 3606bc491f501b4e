"""Reading the producer's JSONL files (its ledger, pre-tokenised prompt rows) line by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonlLineError(ValueError):
    """A line that is not JSON; `lineno` (1-based) and `reason` let the caller name the fix."""

    def __init__(self, path: Path, lineno: int, reason: str) -> None:
        super().__init__(f"{path}:{lineno}: {reason}")
        self.path = path
        self.lineno = lineno
        self.reason = reason


def read_jsonl(path: str | Path, *, torn_tail_ok: bool = False) -> list[tuple[int, Any]]:
    """(line number, value) of every non-blank line; OSError if the file cannot be read.

    With `torn_tail_ok`, an unparsable last line of a file that does not end in a newline is
    dropped: an append-only writer killed mid-line never finished that record.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            if torn_tail_ok and lineno == len(lines):
                break
            raise JsonlLineError(path, lineno, exc.msg) from exc
    return records
