"""What a conversation source hands to the tokeniser: records in file order and read counts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .json_array import ArrayReadStats


class Malformed:
    """A row that could not even be parsed as JSON; it is counted as malformed."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


@dataclass
class SourceRead:
    """The records of one data path; `rows()` yields (row index, record) in file order."""

    label: str
    records: Iterable[Any]
    total: int
    stats: ArrayReadStats | None = None  # set when a JSON array was read record by record
    via: str = "datasets"
    notes: list[str] = field(default_factory=list)

    def rows(self) -> Iterator[tuple[int, Any]]:
        """Yield (row index, record); the index is the record's position in the file."""
        yield from enumerate(self.records)

    @property
    def dropped_incomplete(self) -> int:
        """Cut-off records at the end of a JSON array (known once the rows are consumed)."""
        return self.stats.dropped_incomplete if self.stats else 0
