"""What building a dataset saw: rows read, kept, skipped by reason, dropped, truncated, cache."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .bad_rows import BAD_ROW_REASONS


@dataclass
class DataReport:
    """Counts of one `build_dataset` call (the same whether it tokenised or hit the cache)."""

    source: str
    rows_read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BAD_ROW_REASONS, 0))
    dropped_incomplete: int = 0
    truncated: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    max_length: int = 0
    stopped_at_limit: bool = False
    notes: list[str] = field(default_factory=list)
    # Per data path: rows read, kept, skipped by reason and cut-off records dropped, so an
    # empty or all-bad corpus can be reported file by file.
    per_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The dataset's cache key: a hash of the data files, template, tokenizer, max_length, sample
    # limit and bad-row policy. Anything derived from the dataset (feature shards, eval records)
    # can key on it.
    fingerprint: str = ""
    cache_hit: bool = False
    cache_path: str = ""

    @property
    def skipped_total(self) -> int:
        """Rows skipped for any reason."""
        return sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (stored next to the cached dataset)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataReport:
        """Inverse of to_dict; unknown keys (from a newer version) are ignored."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def describe_sources(self) -> str:
        """Per data path: rows read, kept, skipped by reason and cut-off records dropped."""
        parts = []
        for source, counts in self.per_source.items():
            skipped = counts.get("skipped", {})
            reasons = ", ".join(f"{k} {v}" for k, v in skipped.items() if v) or "none"
            dropped = counts.get("dropped_incomplete", 0)
            tail = f", {dropped} cut-off record(s) dropped" if dropped else ""
            parts.append(
                f"{source}: {counts.get('rows_read', 0)} row(s) read, {counts.get('kept', 0)} "
                f"kept, skipped: {reasons}{tail}"
            )
        return "; ".join(parts) or f"{self.source}: {self.rows_read} row(s) read"

    def describe(self) -> str:
        """One line for logs: kept, skipped by reason, dropped, truncated."""
        skipped = ", ".join(f"{k} {v}" for k, v in self.skipped.items() if v) or "none"
        limit = " (stopped at the sample limit)" if self.stopped_at_limit else ""
        return (
            f"{self.source}: {self.kept} of {self.rows_read} rows kept{limit}; skipped: "
            f"{skipped}; cut-off records dropped: {self.dropped_incomplete}; truncated to "
            f"{self.max_length}: {self.truncated}; {self.tokens} tokens "
            f"({self.supervised_tokens} supervised)"
        )
