"""Which tokens make the draft vocabulary: the most frequent supervised labels, deterministic.

Ranked by count, ties by the lower target id, so the same corpus and size always give the same
vocabulary on every rank and every resume. When the corpus has fewer distinct labels than the
size, the rest are the lowest unused ids (they cost a head row each and are never wrong).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DraftVocab:
    """A draft vocabulary: its tokens as ascending target ids, and where they came from."""

    ids: tuple[int, ...]
    target_vocab_size: int
    # Share of the training corpus's supervised labels the vocabulary holds.
    train_coverage: float

    @property
    def size(self) -> int:
        """Tokens in the draft vocabulary (D)."""
        return len(self.ids)


def ranked_tokens(counts: np.ndarray) -> np.ndarray:
    """Every token id, most frequent first, ties by the lower id (a stable sort)."""
    return np.argsort(-counts, kind="stable")


def choose_draft_vocab(counts: np.ndarray, size: int) -> DraftVocab:
    """The `size` most frequent supervised tokens of `counts` [V] as a DraftVocab."""
    vocab_size = int(counts.shape[0])
    if not 0 < size <= vocab_size:
        raise ValueError(
            f"model.draft_vocab_size = {size} must be between 1 and the target vocabulary "
            f"({vocab_size})"
        )
    kept = np.sort(ranked_tokens(counts)[:size])
    return DraftVocab(
        ids=tuple(int(token) for token in kept),
        target_vocab_size=vocab_size,
        train_coverage=coverage(counts, kept),
    )


def coverage(counts: np.ndarray, ids: np.ndarray | tuple[int, ...]) -> float:
    """Share of the labels counted in `counts` that are among `ids` (1.0 for no labels)."""
    total = int(counts.sum())
    if total == 0:
        return 1.0
    return float(counts[np.asarray(ids, dtype=np.int64)].sum()) / total


def smallest_covering(counts: np.ndarray, share: float, ranking: np.ndarray | None = None) -> int:
    """The smallest draft vocabulary size covering `share` of the labels counted in `counts`.

    The vocabulary of size n is the first n tokens of `ranking` (default: of `counts` itself;
    pass the training counts' ranking to measure held-out data against the vocabulary training
    would choose).
    """
    total = int(counts.sum())
    if total == 0:
        return 1
    order = ranked_tokens(counts) if ranking is None else ranking
    needed = math.ceil(share * total - 1e-9)  # labels to cover, robust to 0.98 * 100 = 98.0000001
    cumulative = np.cumsum(counts[order])
    return int(np.searchsorted(cumulative, needed)) + 1
