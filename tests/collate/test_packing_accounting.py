"""Packing accounting: positions, fill and anchors per conversation of the sampler's rows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import MicroBatchSampler, ShapePolicy, split_rows
from specdraft.collate.packing_accounting import FILL_BINS, account_packing


def packing(max_length=2048, buckets=None, num_anchors=None) -> ShapePolicy:
    return ShapePolicy.from_parts(
        static_shapes=True,
        max_length=max_length,
        buckets=buckets,
        num_anchors=num_anchors,
        packing=True,
    )


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=120),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from([None, (512, 1024)]),
)
def test_positions_are_those_of_the_sampler_rows(lengths, size, accum, buckets):
    shapes = packing(buckets=buckets)
    stats = account_packing(lengths, shapes, micro_batch_size=size, grad_accum_steps=accum, seed=5)
    clipped = [min(n, 2048) for n in lengths]
    plan = MicroBatchSampler(
        clipped, micro_batch_size=size, grad_accum_steps=accum, seed=5, pad_to=shapes
    ).epoch_plan(0)
    batches = [b for rank in plan for b in rank if b]
    rows = [split_rows([clipped[i] for i in b], 2048) for b in batches]
    computed = sum(
        size * shapes.pad_length(max(sum(clipped[b[p]] for p in row) for row in groups))
        for b, groups in zip(batches, rows, strict=True)
    )
    assert stats.computed_positions == computed
    assert stats.real_tokens == sum(clipped)
    assert stats.documents == len(lengths)
    assert stats.rows == sum(map(len, rows)) == sum(stats.fill_histogram)
    assert stats.optimizer_steps == len(plan[0]) // accum
    assert stats.fill == pytest.approx(sum(clipped) / computed)
    assert len(stats.fill_histogram) == FILL_BINS


def test_many_short_conversations_pack_nearly_full():
    lengths = [(53 * i) % 700 + 30 for i in range(4000)]
    stats = account_packing(lengths, packing(), micro_batch_size=2, grad_accum_steps=4)
    assert stats.positions_per_real_token < 1.02
    data = stats.to_dict()
    assert data["documents_per_row"] > 4
    assert data["rows_per_optimizer_step"] == pytest.approx(stats.rows / stats.optimizer_steps)


def test_anchors_per_conversation_share_a_rows_num_anchors():
    # Four documents of 10 valid anchors each, two per row (capacity 256, 100 + 100 tokens).
    lengths, counts = [100, 100, 100, 100], [10, 10, 10, 10]
    few = account_packing(
        lengths,
        packing(256, num_anchors=8),
        micro_batch_size=2,
        grad_accum_steps=1,
        counts=counts,
    ).to_dict()["anchors"]
    # A row draws 8 of its 20 valid anchors: 4 per conversation; alone each would get 8.
    assert few["anchors_per_conversation"] == pytest.approx(4.0)
    assert few["anchors_per_conversation_unpacked"] == pytest.approx(8.0)
    assert few["valid_anchors"] == 40
    assert few["computed_blocks"] == 2 * 8
    many = account_packing(
        lengths, packing(256, num_anchors=64), micro_batch_size=2, grad_accum_steps=1, counts=counts
    ).to_dict()["anchors"]
    # Enough anchors for every valid position: capped by the valid anchors, as unpacked.
    assert many["anchors_per_conversation"] == many["anchors_per_conversation_unpacked"] == 10


def test_accounting_needs_a_packing_policy():
    with pytest.raises(ValueError, match="packing"):
        account_packing([1], ShapePolicy(pad_to=128), micro_batch_size=1, grad_accum_steps=1)
