"""Read a JSON array of records one record at a time, tolerating a cut-off end.

A JSON array that was cut off mid-record (a truncated download, the ShareGPT package's file) is
refused by every whole-file parser. Decoding record by record keeps every complete record,
counts the cut-off tail as dropped, and never holds more than a window of the file in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK_CHARS = 1 << 20
_WHITESPACE = " \t\r\n"


class JsonArrayError(ValueError):
    """A JSON-array file that is broken before its end (not merely cut off)."""


@dataclass
class ArrayReadStats:
    """What a record-by-record read of a JSON array saw: complete records, the cut-off tail."""

    complete: int = 0
    dropped_incomplete: int = 0
    chars_read: int = 0  # characters up to the end of the last complete record

    @property
    def records_started(self) -> int:
        """Records the file begins: the complete ones plus a cut-off one."""
        return self.complete + self.dropped_incomplete


def iter_json_array(path: str | Path, stats: ArrayReadStats | None = None) -> Iterator[Any]:
    """Yield the records of a JSON-array file one by one; a cut-off last record is dropped.

    `stats` is filled in as the records are read. A syntax error that is not a cut-off end raises
    JsonArrayError with the file, line and column.
    """
    stats = stats if stats is not None else ArrayReadStats()
    decoder = json.JSONDecoder()
    # Undecodable bytes become lone surrogates instead of stopping the read: they can only sit
    # inside a record's strings (anywhere else is a syntax error that names the place), and
    # `normalise_conversation` counts such a record as a malformed row.
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        reader = _Buffer(handle)
        reader.skip_whitespace()
        if reader.at_end():
            raise JsonArrayError(f"{path}: the file is empty; expected a JSON array of records")
        if reader.peek() != "[":
            raise JsonArrayError(
                f"{path}:{reader.position()}: expected a JSON array '[' of records; for one "
                f"record per line use the .jsonl extension"
            )
        reader.advance(1)
        expect_comma = False
        while True:
            reader.skip_whitespace()
            if reader.at_end():
                # The array never closes: the file ends between two records.
                break
            if reader.peek() == "]":
                break
            if expect_comma:
                if reader.peek() != ",":
                    raise JsonArrayError(
                        f"{path}:{reader.position()}: expected ',' or ']' between records"
                    )
                reader.advance(1)
                reader.skip_whitespace()
                if reader.at_end():
                    break
            record = reader.decode(decoder, path)
            if record is _CUT_OFF:
                stats.dropped_incomplete += 1
                break
            stats.complete += 1
            stats.chars_read = reader.consumed_chars()
            expect_comma = True
            yield record


_CUT_OFF = object()


class _Buffer:
    """A growing window on a text file, so records can be decoded without reading it whole."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.text = ""
        self.pos = 0
        self.offset = 0  # characters dropped from the front of `text`
        self.lines = 0  # newlines in the dropped characters
        self.eof = False
        self._fill(_CHUNK_CHARS)

    def _fill(self, size: int) -> bool:
        if self.eof:
            return False
        more = self.handle.read(size)
        if not more:
            self.eof = True
            return False
        if self.pos > _CHUNK_CHARS:
            # Drop what has been decoded so the window does not hold the whole file.
            dropped = self.text[: self.pos]
            self.lines += dropped.count("\n")
            self.offset += self.pos
            self.text = self.text[self.pos :]
            self.pos = 0
        self.text += more
        return True

    def at_end(self) -> bool:
        while self.pos >= len(self.text):
            if not self._fill(_CHUNK_CHARS):
                return True
        return False

    def peek(self) -> str:
        return self.text[self.pos]

    def advance(self, n: int) -> None:
        self.pos += n

    def skip_whitespace(self) -> None:
        while not self.at_end():
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < len(text):
                return

    def consumed_chars(self) -> int:
        return self.offset + self.pos

    def position(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else pos
        line = self.lines + self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"{line}:{col}"

    def decode(self, decoder: json.JSONDecoder, path: str | Path) -> Any:
        """Decode the record at the cursor, reading more of the file until it is complete."""
        while True:
            try:
                record, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # Read more (doubling the window keeps long records linear) and try again.
                if self._fill(max(_CHUNK_CHARS, len(self.text) - self.pos)):
                    continue
                if _is_cut_off(exc, self.text):
                    return _CUT_OFF
                raise JsonArrayError(
                    f"{path}:{self.position(exc.pos)}: invalid JSON ({exc.msg}); fix the record "
                    f"or convert the file to JSON Lines so one bad row cannot hide the rest"
                ) from exc
            if end >= len(self.text) and self._fill(_CHUNK_CHARS):
                # A record that ends exactly at the window edge may continue (a number, say).
                continue
            self.pos = end
            return record


def _is_cut_off(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error comes from the text ending (a truncated file), not bad syntax."""
    if exc.msg.startswith("Unterminated string"):
        return True
    # Otherwise the error sits at the very end: at the last character, or inside a \uXXXX
    # escape that the end cut short.
    return exc.pos + len("\\uXXXX") >= len(text.rstrip(_WHITESPACE))
