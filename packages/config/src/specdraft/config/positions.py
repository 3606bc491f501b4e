"""Where each key and value of a TOML document sits: a key path -> (line, col) index.

tomli reports a line and column only for syntax errors; schema errors carry a key path such as
`("training", "static_shape_buckets", 2)`. This module scans the document text once and records,
for every key path, where its key and its value start, so each finding can point at the offending
key, value or array element. Lines and columns are 1-based, like tomli's.

The scanner is written for documents that tomli already accepted, but it never raises on any
text: on something it does not understand it skips to the next line, and lookups fall back to the
nearest enclosing table, then to line 1, column 1.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Literal

import tomli

KeyPath = tuple[str | int, ...]
Position = tuple[int, int]

_BARE_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(",]}\n#")
_START: Position = (1, 1)


@dataclass(frozen=True)
class PositionIndex:
    """Positions of every key and value of one document, looked up by key path."""

    keys: dict[KeyPath, Position] = field(default_factory=dict)
    values: dict[KeyPath, Position] = field(default_factory=dict)

    def locate(self, path: KeyPath, *, at: Literal["key", "value"] = "key") -> Position:
        """Position of `path` (its key or its value), else of its nearest enclosing table."""
        path = tuple(path)
        if at == "value" and path in self.values:
            return self.values[path]
        if path in self.keys:
            return self.keys[path]
        if path in self.values:
            return self.values[path]
        # A missing key points at the table that should hold it; a missing table at line 1.
        for end in range(len(path) - 1, 0, -1):
            prefix = path[:end]
            if prefix in self.keys:
                return self.keys[prefix]
            if prefix in self.values:
                return self.values[prefix]
        return _START


def index_positions(text: str) -> PositionIndex:
    """Scan a TOML document once and index the position of every key path in it."""
    scanner = _Scanner(text)
    # Absurdly deep nesting: keep what was indexed so far; lookups fall back to parents.
    with suppress(RecursionError):
        scanner.scan_document()
    return PositionIndex(scanner.keys, scanner.values)


class _Scanner:
    """A forgiving single-pass TOML scanner that records positions, not values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        self.keys: dict[KeyPath, Position] = {}
        self.values: dict[KeyPath, Position] = {}
        self.explicit: set[KeyPath] = set()
        self.array_tables: dict[KeyPath, int] = {}

    # ------------------------------------------------------------------------------ positions

    def where(self, offset: int) -> Position:
        line = bisect_right(self.line_starts, offset)
        return line, offset - self.line_starts[line - 1] + 1

    def record_key(self, path: KeyPath, offset: int, *, explicit: bool) -> None:
        # A table first created implicitly (by `[a.b]` or `a.b = 1`) points there until its own
        # header appears; an explicit definition always wins.
        if explicit:
            if path not in self.explicit:
                self.keys[path] = self.where(offset)
                self.explicit.add(path)
        elif path not in self.keys:
            self.keys[path] = self.where(offset)

    # -------------------------------------------------------------------------------- helpers

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.text[i] if i < len(self.text) else ""

    def skip_blanks(self) -> None:
        while self.peek() in (" ", "\t"):
            self.pos += 1

    def skip_trivia(self) -> None:
        """Skip blanks, newlines and comments."""
        while True:
            ch = self.peek()
            if ch in (" ", "\t", "\r", "\n"):
                self.pos += 1
            elif ch == "#":
                self.skip_line()
            else:
                return

    def skip_line(self) -> None:
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end + 1

    # ------------------------------------------------------------------------------- document

    def scan_document(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip_trivia()
            if self.pos >= len(self.text):
                return
            start = self.pos
            if self.text.startswith("[[", start):
                table = self.scan_array_table_header()
            elif self.peek() == "[":
                table = self.scan_table_header()
            else:
                self.scan_key_value(table)
            if self.pos == start:
                # Nothing understood here: move on rather than loop.
                self.skip_line()

    def resolve(self, names: list[str]) -> KeyPath:
        """Key path of a header: `[a.b]` after `[[a]]` means the last element of `a`."""
        path: KeyPath = ()
        for name in names:
            path = (*path, name)
            if path in self.array_tables:
                path = (*path, self.array_tables[path] - 1)
        return path

    def scan_table_header(self) -> KeyPath:
        start = self.pos
        self.pos += 1
        names = [name for name, _ in self.scan_key()]
        path = self.resolve(names)
        for end in range(1, len(path)):
            self.record_key(path[:end], start, explicit=False)
        self.record_key(path, start, explicit=True)
        self.skip_line()
        return path

    def scan_array_table_header(self) -> KeyPath:
        start = self.pos
        self.pos += 2
        names = [name for name, _ in self.scan_key()]
        parent = self.resolve(names[:-1])
        base = (*parent, names[-1]) if names else parent
        for end in range(1, len(base)):
            self.record_key(base[:end], start, explicit=False)
        index = self.array_tables.get(base, 0)
        self.array_tables[base] = index + 1
        self.record_key(base, start, explicit=False)
        self.record_key((*base, index), start, explicit=True)
        self.values.setdefault((*base, index), self.where(start))
        self.skip_line()
        return (*base, index)

    def scan_key_value(self, table: KeyPath) -> None:
        start = self.pos
        parts = self.scan_key()
        if not parts:
            return
        self.skip_blanks()
        if self.peek() != "=":
            self.skip_line()
            return
        self.pos += 1
        self.skip_blanks()
        path = (*table, *(name for name, _ in parts))
        for end in range(len(table) + 1, len(path)):
            self.record_key(path[:end], start, explicit=False)
        self.record_key(path, start, explicit=True)
        self.scan_value(path)

    # ------------------------------------------------------------------------------------ keys

    def scan_key(self) -> list[tuple[str, int]]:
        """A dotted key: its parts and where each starts."""
        parts: list[tuple[str, int]] = []
        while True:
            self.skip_blanks()
            start = self.pos
            ch = self.peek()
            if ch == '"':
                self.scan_basic_string()
                name = _decode_quoted_key(self.text[start : self.pos])
            elif ch == "'":
                self.scan_literal_string()
                name = self.text[start + 1 : self.pos - 1]
            else:
                while self.peek() and (self.peek() in _BARE_KEY_CHARS or self.peek() > "\x7f"):
                    self.pos += 1
                name = self.text[start : self.pos]
                if not name:
                    return parts
            parts.append((name, start))
            self.skip_blanks()
            if self.peek() != ".":
                return parts
            self.pos += 1

    # ---------------------------------------------------------------------------------- values

    def scan_value(self, path: KeyPath) -> None:
        self.values[path] = self.where(self.pos)
        text, pos = self.text, self.pos
        if text.startswith('"""', pos):
            self.scan_multiline_string('"""', escapes=True)
        elif text.startswith("'''", pos):
            self.scan_multiline_string("'''", escapes=False)
        elif self.peek() == '"':
            self.scan_basic_string()
        elif self.peek() == "'":
            self.scan_literal_string()
        elif self.peek() == "[":
            self.scan_array(path)
        elif self.peek() == "{":
            self.scan_inline_table(path)
        else:
            while self.peek() and self.peek() not in _SCALAR_END:
                self.pos += 1

    def scan_basic_string(self) -> None:
        self.pos += 1
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "\\":
                self.pos += 2
            elif ch == '"':
                self.pos += 1
                return
            elif ch == "\n":
                return
            else:
                self.pos += 1

    def scan_literal_string(self) -> None:
        end = self.text.find("'", self.pos + 1)
        newline = self.text.find("\n", self.pos + 1)
        if end < 0 or 0 <= newline < end:
            self.pos = len(self.text) if newline < 0 else newline
        else:
            self.pos = end + 1

    def scan_multiline_string(self, quotes: str, *, escapes: bool) -> None:
        self.pos += 3
        while self.pos < len(self.text):
            if escapes and self.text[self.pos] == "\\":
                self.pos += 2
            elif self.text.startswith(quotes, self.pos):
                self.pos += 3
                # Up to two quote characters may sit right before the closing delimiter.
                extra = 0
                while extra < 2 and self.peek() == quotes[0]:
                    self.pos += 1
                    extra += 1
                return
            else:
                self.pos += 1

    def scan_array(self, path: KeyPath) -> None:
        index = 0

        def element() -> None:
            nonlocal index
            key = (*path, index)
            self.keys.setdefault(key, self.where(self.pos))
            self.scan_value(key)
            index += 1

        self.scan_items("]", element)

    def scan_inline_table(self, path: KeyPath) -> None:
        self.scan_items("}", lambda: self.scan_key_value(path))

    def scan_items(self, close: str, scan_item: Callable[[], None]) -> None:
        """Scan the comma-separated items of an array or inline table, up to `close`."""
        self.pos += 1
        while True:
            self.skip_trivia()
            ch = self.peek()
            if ch in (close, ""):
                self.pos += 1 if ch else 0
                return
            if ch == ",":
                self.pos += 1
                continue
            start = self.pos
            scan_item()
            # A character the scanner does not understand is stepped over, never looped on.
            if self.pos == start:
                self.pos += 1


def _decode_quoted_key(raw: str) -> str:
    """The name a basic-string key stands for (escapes resolved by tomli itself)."""
    try:
        return next(iter(tomli.loads(f"{raw} = 0")))
    except (tomli.TOMLDecodeError, StopIteration):
        return raw.strip('"')
