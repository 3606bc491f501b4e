"""Anchor sampling: valid positions only, fixed slot count with a keep-mask, padding-blind."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.models import sample_anchors, valid_anchor_positions


def _valid_set(mask: list[int]) -> set[int]:
    return {a for a in range(len(mask) - 1) if mask[a] and mask[a + 1]}


masks = st.lists(st.integers(0, 1), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    mask=masks,
    num_anchors=st.integers(1, 12),
    seed=st.integers(0, 2**40),
    sample_id=st.integers(-(2**62), 2**62),
)
def test_anchors_are_distinct_valid_positions_with_a_correct_keep_mask(
    mask, num_anchors, seed, sample_id
):
    loss_mask = torch.tensor([mask])
    anchors, keep = sample_anchors(loss_mask, torch.tensor([sample_id]), num_anchors, seed)
    assert anchors.shape == keep.shape == (1, num_anchors)
    valid = _valid_set(mask)
    kept = anchors[0][keep[0]].tolist()
    # Never more than available, never fewer than asked when enough are valid.
    assert len(kept) == min(num_anchors, len(valid))
    assert set(kept) <= valid
    assert len(set(kept)) == len(kept)
    # Kept slots first, ascending; unused slots are at the end and point at position 0.
    assert keep[0].tolist() == [True] * len(kept) + [False] * (num_anchors - len(kept))
    assert kept == sorted(kept)
    assert anchors[0][~keep[0]].eq(0).all()


@settings(max_examples=150, deadline=None)
@given(
    mask=masks,
    extra=st.integers(1, 60),
    num_anchors=st.integers(1, 12),
    seed=st.integers(0, 2**31),
)
def test_same_sample_gets_same_anchors_whatever_its_padding(mask, extra, num_anchors, seed):
    short = torch.tensor([mask])
    padded = torch.nn.functional.pad(short, (0, extra))
    sample_id = torch.tensor([12345])
    a_short, k_short = sample_anchors(short, sample_id, num_anchors, seed)
    a_long, k_long = sample_anchors(padded, sample_id, num_anchors, seed)
    assert torch.equal(a_short, a_long)
    assert torch.equal(k_short, k_long)


def test_rows_of_a_batch_are_drawn_independently_of_each_other():
    mask = torch.ones(1, 64, dtype=torch.long)
    alone, _ = sample_anchors(mask, torch.tensor([7]), 5, seed=3)
    batch = torch.cat([torch.ones(1, 64, dtype=torch.long), torch.zeros(1, 64, dtype=torch.long)])
    together, _ = sample_anchors(torch.cat([mask, batch[1:]]), torch.tensor([7, 8]), 5, seed=3)
    assert torch.equal(alone[0], together[0])


def test_a_sample_without_valid_anchor_gets_an_all_false_keep_row():
    # Isolated supervised tokens: no two consecutive, so no anchor is valid.
    loss_mask = torch.tensor([[0, 1, 0, 1, 0, 1, 0, 0]])
    anchors, keep = sample_anchors(loss_mask, torch.tensor([1]), 4, seed=0)
    assert not keep.any()
    assert anchors.eq(0).all()


def test_seed_and_sample_id_change_the_draw():
    mask = torch.ones(1, 200, dtype=torch.long)
    base, _ = sample_anchors(mask, torch.tensor([1]), 8, seed=0)
    other_seed, _ = sample_anchors(mask, torch.tensor([1]), 8, seed=1)
    other_sample, _ = sample_anchors(mask, torch.tensor([2]), 8, seed=0)
    assert not torch.equal(base, other_seed)
    assert not torch.equal(base, other_sample)


def test_draws_are_uniform_over_valid_positions():
    # One anchor among 10 valid positions for 4000 sample ids: each position should win about
    # 400 times. The bounds are ~6 standard deviations wide; the draw is deterministic anyway.
    loss_mask = torch.zeros(4000, 16, dtype=torch.long)
    loss_mask[:, 3:14] = 1  # valid anchors 3..12
    anchors, keep = sample_anchors(loss_mask, torch.arange(4000), 1, seed=11)
    assert keep.all()
    counts = torch.bincount(anchors[:, 0], minlength=16)
    assert counts[:3].sum() == 0 and counts[13:].sum() == 0
    assert counts[3:13].min() > 280 and counts[3:13].max() < 520


def test_valid_positions_need_the_anchor_and_its_successor_supervised():
    loss_mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0]])
    assert valid_anchor_positions(loss_mask).tolist() == [
        [True, False, False, True, True, False, False]
    ]


def test_more_anchor_slots_than_positions_keeps_the_fixed_width():
    loss_mask = torch.ones(2, 5, dtype=torch.long)
    anchors, keep = sample_anchors(loss_mask, torch.tensor([1, 2]), 9, seed=0)
    assert anchors.shape == (2, 9)
    assert keep.sum(1).tolist() == [4, 4]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(masks, min_size=1, max_size=4),
    num_anchors=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_the_anchors_never_depend_on_the_width(rows, num_anchors, seed, data):
    length = max(len(r) for r in rows)
    loss_mask = torch.tensor([r + [0] * (length - len(r)) for r in rows])
    sample_id = torch.arange(len(rows)) * 31 + 5
    # The width the collator picks: the largest per-row min(num_anchors, valid anchors), >= 1.
    need = max(1, max(min(num_anchors, len(_valid_set(r))) for r in rows))
    width = data.draw(st.integers(need, num_anchors + 3))
    full, full_keep = sample_anchors(loss_mask, sample_id, num_anchors, seed)
    cut, cut_keep = sample_anchors(loss_mask, sample_id, num_anchors, seed, width)
    assert cut.shape == cut_keep.shape == (len(rows), width)
    # Same kept anchors in the same slots; every slot past them is unkept and points at 0.
    for row in range(len(rows)):
        assert cut[row][cut_keep[row]].tolist() == full[row][full_keep[row]].tolist()
    assert int(cut_keep.sum()) == int(full_keep.sum())
    assert cut[~cut_keep].eq(0).all()


def test_a_width_of_zero_is_refused():
    import pytest

    with pytest.raises(ValueError, match="at least 1"):
        sample_anchors(torch.ones(1, 4, dtype=torch.long), torch.tensor([1]), 4, 0, width=0)
