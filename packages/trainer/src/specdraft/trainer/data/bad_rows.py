"""Rows that cannot train the draft: why (a fixed set of reasons) and what the policy does.

`data.bad_rows = 'skip'` drops such rows and counts them by reason; `'fail'` stops at the first
one with an error that names the file and the row, so a broken corpus never trains silently.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

MALFORMED = "malformed"
EMPTY = "empty"
NO_ASSISTANT_TURN = "no_assistant_turn"
NO_SUPERVISED_PAIR = "no_supervised_pair"

BAD_ROW_REASONS = (MALFORMED, EMPTY, NO_ASSISTANT_TURN, NO_SUPERVISED_PAIR)

_FIXES = {
    MALFORMED: "each row needs 'conversations' (from/value) or 'messages' (role/content) turns "
    "with string contents and known roles",
    EMPTY: "remove rows without any non-empty turn",
    NO_ASSISTANT_TURN: "every row needs at least one assistant (gpt) turn to learn from",
    NO_SUPERVISED_PAIR: "the assistant turns must keep at least two tokens within "
    "data.max_length; raise max_length or shorten the prompt",
}


class BadRow(Exception):
    """Raised while reading or tokenising one row: `reason` is one of BAD_ROW_REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in BAD_ROW_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class BadRowError(ValueError):
    """A bad row under `data.bad_rows = 'fail'`: names the file, the row, the reason and the fix."""

    def __init__(self, source: str, row: int, bad: BadRow) -> None:
        self.source = source
        self.row = row
        self.reason = bad.reason
        super().__init__(
            f"{source}: row {row} (0-based) is {bad.reason}: {bad.detail}. Fix: "
            f"{_FIXES[bad.reason]}, or set data.bad_rows = 'skip' to drop and count such rows"
        )


@dataclass
class BadRowCounter:
    """Applies the bad-row policy and counts skipped rows by reason."""

    policy: str = "skip"
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BAD_ROW_REASONS, 0))

    def __post_init__(self) -> None:
        if self.policy not in ("skip", "fail"):
            raise ValueError(f"data.bad_rows = {self.policy!r}; use 'skip' or 'fail'")

    def record(self, source: str, row: int, bad: BadRow) -> None:
        """Count a bad row, or raise BadRowError when the policy is 'fail'."""
        if self.policy == "fail":
            raise BadRowError(source, row, bad)
        self.counts[bad.reason] += 1

    @property
    def total(self) -> int:
        """Rows skipped for any reason."""
        return sum(self.counts.values())


def has_supervised_pair(loss_mask: Sequence[int]) -> bool:
    """Whether two consecutive positions are supervised (the least a draft block can learn from)."""
    return any(a and b for a, b in itertools.pairwise(loss_mask))


def check_supervised_pair(loss_mask: Sequence[int]) -> None:
    """Raise BadRow(no_supervised_pair) when no two consecutive tokens carry loss."""
    if not has_supervised_pair(loss_mask):
        supervised = sum(1 for m in loss_mask if m)
        raise BadRow(
            NO_SUPERVISED_PAIR,
            f"{supervised} supervised token(s) in {len(loss_mask)}, none next to another",
        )
