"""The output of `specdraft regenerate`: a JSONL file that is appended to one whole line at a time.

Each row is written with a single `write` of one complete line and synced after every chunk, so
a killed run leaves at most one torn last line; the next run cuts it off and carries on. The
settings the rows were made with (sources, template, lengths, generator) are kept next to the
file in `<name>.regenerate.json`, and a run with other settings refuses to append to it.

Rows go out a chunk at a time and in record order, so a resumed run writes the same bytes as
an uninterrupted one. The answers of the chunk in progress are kept as they arrive in
`<name>.pending` (`PendingAnswers`): a run stopped mid-chunk (the server gone, Ctrl-C, a kill)
loses none of them, and the next run takes them from there instead of asking again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..runtime.atomic import atomic_write

SETTINGS_SUFFIX = ".regenerate.json"
# No `.json`/`.jsonl` ending: the answers in it are not rows a corpus reader should pick up.
PENDING_SUFFIX = ".pending"


class OutputMismatch(ValueError):
    """The output file holds rows made with other settings, or is not a regenerate output."""


def settings_path(out: Path) -> Path:
    """Where the settings of an output file are kept."""
    return out.with_name(out.name + SETTINGS_SUFFIX)


def pending_path(out: Path) -> Path:
    """Where the finished answers of an unfinished chunk are kept."""
    return out.with_name(out.name + PENDING_SUFFIX)


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


class PendingAnswers:
    """Answers of the chunk in progress, one JSON line each, appended as they arrive.

    An answer is keyed by a digest of what it answers (the prompt) and of the output's settings,
    so an answer made with other settings (a deleted output redone with another model) never
    matches. Writes come from the responder's request threads, hence the lock. Each answer is
    one `write` (a killed process keeps it; `sync` makes it survive the machine too).
    """

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self._salt = json.dumps(settings, sort_keys=True)
        self._answers: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._fd: int | None = None

    def open(self) -> int:
        """Load the answers a stopped run kept (a torn last line is cut off); returns how many."""
        if self.path.is_file():
            data = self.path.read_bytes()
            complete = data.rfind(b"\n") + 1
            if complete < len(data):
                os.truncate(self.path, complete)
            for line in data[:complete].splitlines():
                try:
                    entry = json.loads(line)
                    answer = entry["answer"]
                    if answer is None or isinstance(answer, str):
                        self._answers[str(entry["key"])] = answer
                except (ValueError, KeyError, TypeError):
                    # A cache, not the output: an unreadable line only means asking again.
                    continue
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return len(self._answers)

    def key(self, what: Any) -> str:
        """The key of the answer to `what` (any JSON value, e.g. a prompt's messages)."""
        text = self._salt + "\n" + json.dumps(what, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def __len__(self) -> int:
        return len(self._answers)

    def __contains__(self, key: object) -> bool:
        return key in self._answers

    def get(self, key: str) -> str | None:
        """The kept answer (None: the generator gave no text for it)."""
        return self._answers[key]

    def add(self, key: str, answer: str | None) -> None:
        """Keep an answer (once); a no-op once closed, so a late request thread writes nothing."""
        with self._lock:
            if self._fd is None or key in self._answers:
                return
            line = (json.dumps({"key": key, "answer": answer}, ensure_ascii=False) + "\n").encode()
            os.write(self._fd, line)
            self._answers[key] = answer

    def clear(self) -> None:
        """Forget every answer: their chunk is in the output now."""
        with self._lock:
            self._answers.clear()
            if self._fd is not None:
                os.ftruncate(self._fd, 0)

    def sync(self) -> None:
        """Make the kept answers durable."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self, *, remove: bool = False) -> None:
        """Close the file; remove it when asked (the run is complete) or when it is empty."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if (remove or not self._answers) and self.path.exists():
                self.path.unlink()
