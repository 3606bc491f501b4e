"""Sample lengths for explain-buckets: from the corpus, a lengths file, or one longest sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LengthSource:
    """Where the sample lengths come from, and what was dropped or cut on the way."""

    kind: str  # "corpus" | "lengths_file" | "longest"
    description: str
    lengths: list[int]
    skipped: dict[str, int] = field(default_factory=dict)
    dropped_incomplete: int = 0
    truncated: int = 0  # lengths above max_length cut to it, as training truncates
    # Valid anchors per sample (from the loss masks), when the source has the masks: the corpus
    # does, a lengths file does not.
    anchor_counts: list[int] | None = None


def read_lengths_file(path: str | Path, max_length: int) -> LengthSource:
    """One positive length per line ('#' comments and blank lines allowed), cut to max_length."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the lengths file: {exc}") from exc
    lengths: list[int] = []
    truncated = 0
    for number, line in enumerate(text.splitlines(), start=1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value <= 0:
            raise ValueError(
                f"{path}:{number}: {item!r} is not a positive integer; the lengths file holds "
                f"one token count per line"
            )
        if value > max_length:
            truncated += 1
            value = max_length
        lengths.append(value)
    if not lengths:
        raise ValueError(f"{path}: no lengths in the file; write one token count per line")
    return LengthSource("lengths_file", path, lengths, truncated=truncated)
