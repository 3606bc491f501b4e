"""The draft vocabulary's choice: the most frequent supervised labels, deterministic, and the
coverage figures explain-vocab reports."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.vocab import (
    choose_draft_vocab,
    coverage,
    smallest_covering,
    supervised_token_counts,
)

counts_strategy = st.lists(st.integers(0, 50), min_size=1, max_size=60).map(
    lambda values: np.asarray(values, dtype=np.int64)
)


@settings(max_examples=200, deadline=None)
@given(counts=counts_strategy, data=st.data())
def test_the_vocabulary_holds_the_most_frequent_labels(counts, data):
    size = data.draw(st.integers(1, len(counts)))
    vocab = choose_draft_vocab(counts, size)
    ids = np.asarray(vocab.ids)
    assert vocab.size == size and list(ids) == sorted(set(vocab.ids))
    # No other set of `size` tokens covers more labels: the kept counts are the top `size`.
    assert counts[ids].sum() == np.sort(counts)[::-1][:size].sum()
    # Ties go to the lower id: a kept token is never outranked by an unkept lower one.
    unkept = np.setdiff1d(np.arange(len(counts)), ids)
    for token in unkept:
        assert all(counts[k] > counts[token] or k < token for k in ids)
    assert vocab.train_coverage == pytest.approx(coverage(counts, ids))


@settings(max_examples=200, deadline=None)
@given(counts=counts_strategy, share=st.sampled_from([0.5, 0.9, 0.95, 0.98, 0.99, 1.0]))
def test_the_smallest_covering_size_is_minimal(counts, share):
    if counts.sum() == 0:
        assert smallest_covering(counts, share) == 1
        return
    size = smallest_covering(counts, share)
    assert coverage(counts, choose_draft_vocab(counts, size).ids) >= share - 1e-12
    if size > 1:
        assert coverage(counts, choose_draft_vocab(counts, size - 1).ids) < share


def test_only_supervised_positions_are_counted():
    counts = supervised_token_counts([5, 1, 5, 2, 5], [0, 1, 1, 1, 0], vocab_size=6)
    assert counts.tolist() == [0, 1, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        supervised_token_counts([9], [1], vocab_size=6)


def test_a_size_above_the_target_vocabulary_is_refused():
    with pytest.raises(ValueError, match="between 1 and the target vocabulary"):
        choose_draft_vocab(np.ones(8, dtype=np.int64), 9)
