"""What the linter reports: a `Problem` (a code at a key path) and a `Finding` (it, positioned)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from .lint_code import Severity
from .positions import KeyPath


@dataclass(frozen=True)
class Problem:
    """A finding before it has a place: its code, the key path it concerns, and the message."""

    code: str
    key: KeyPath
    message: str
    # Point at the key (unknown key, missing key's table) or at its value (wrong value).
    at: Literal["key", "value"] = "value"
    # Where to point when that is not `key` itself (a value set by --set is not in the file).
    anchor: KeyPath | None = None


@dataclass(frozen=True)
class Finding:
    """One line of lint output: `path:line:col: CODE message`."""

    path: str
    line: int
    col: int
    code: str
    severity: Severity
    message: str
    key: str | None

    def to_dict(self) -> dict[str, object]:
        """The JSON object of this finding."""
        return asdict(self)


def key_text(path: KeyPath) -> str | None:
    """Render a key path as users write it: `training.static_shape_buckets[2]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def display_path(path: str) -> str:
    """A file name safe to print (undecodable bytes of a file name become U+FFFD)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
