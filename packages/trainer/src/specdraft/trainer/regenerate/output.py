"""The output of `specdraft regenerate`: a JSONL file that is appended to one whole line at a time.

Each row is written with a single `write` of one complete line and synced after every chunk, so
a killed run leaves at most one torn last line; the next run cuts it off and carries on. The
settings the rows were made with (sources, template, lengths, generator) are kept next to the
file in `<name>.regenerate.json`, and a run with other settings refuses to append to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..runtime.atomic import atomic_write

SETTINGS_SUFFIX = ".regenerate.json"


class OutputMismatch(ValueError):
    """The output file holds rows made with other settings, or is not a regenerate output."""


def settings_path(out: Path) -> Path:
    """Where the settings of an output file are kept."""
    return out.with_name(out.name + SETTINGS_SUFFIX)


class RegeneratedFile:
    """Append-only JSONL output that knows which rows it already holds."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = json.loads(json.dumps(settings))  # plain JSON types, comparable
        self._fd: int | None = None

    def open(self) -> set[tuple[str, int]]:
        """Check the settings, repair a torn last line, and return the keys already written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._check_settings()
        done = self._done_keys() if self.path.exists() else set()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return done

    def _check_settings(self) -> None:
        meta = settings_path(self.path)
        if meta.is_file():
            saved = json.loads(meta.read_text(encoding="utf-8"))
            diffs = [
                f"{key}: the file has {saved.get(key)!r}, this run {self.settings.get(key)!r}"
                for key in sorted(set(saved) | set(self.settings))
                if saved.get(key) != self.settings.get(key)
            ]
            if diffs:
                raise OutputMismatch(
                    f"{self.path} was regenerated with other settings:\n  "
                    + "\n  ".join(diffs)
                    + "\nresume with the same settings, or write to a new --out file"
                )
            return
        if self.path.exists() and self.path.stat().st_size > 0:
            raise OutputMismatch(
                f"{self.path} exists but has no {meta.name}: it was not written by "
                "`specdraft regenerate`; choose a new --out file"
            )
        atomic_write(meta, json.dumps(self.settings, indent=1, sort_keys=True))

    def _done_keys(self) -> set[tuple[str, int]]:
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # A run killed mid-write leaves a torn last line: drop it, the row is redone.
            os.truncate(self.path, complete)
        keys = set()
        for number, line in enumerate(data[:complete].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                keys.add((str(row["id"]), int(row["source_row"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise OutputMismatch(
                    f"{self.path}:{number}: not a regenerated row ({exc}); remove the line or "
                    "write to a new --out file"
                ) from None
        return keys

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Append rows, one `write` per line, then sync (a chunk survives a crash after this)."""
        if self._fd is None:
            raise RuntimeError("open() the output before appending")
        for row in rows:
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
