"""The one-pass Arrow count of valid anchors (for anchor-grouped plans) equals the per-row count
on real HF datasets, also after the selections and filters training applies (sliced columns)."""

from __future__ import annotations

from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import valid_anchor_count
from specdraft.trainer.data import sample_anchor_counts

masks = st.lists(st.lists(st.integers(0, 1), max_size=24), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(rows=masks, data=st.data())
def test_arrow_counts_equal_row_counts_after_select_and_filter(rows, data):
    dataset = Dataset.from_dict({"loss_mask": rows, "input_ids": rows})
    picked = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=len(rows)))
    start = data.draw(st.integers(0, len(rows) - 1))
    views = [
        dataset,
        dataset.select(picked),
        dataset.select(range(start, len(rows))),
        dataset.filter(lambda row: len(row["loss_mask"]) % 2 == 0),
    ]
    for view in views:
        expected = [valid_anchor_count(row["loss_mask"]) for row in view]
        assert sample_anchor_counts(view) == expected
