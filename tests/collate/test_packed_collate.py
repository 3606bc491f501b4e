"""The packed collator: rows of whole documents, their ids and positions, per-row anchor widths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import (
    ANCHOR_WIDTH,
    PACKED_KEYS,
    DataCollatorWithPadding,
    ShapePolicy,
    packed_anchor_counts,
)

LAYERS_X_HIDDEN, HIDDEN = 6, 2


def doc(length: int, sample_id: int, mask: list[int] | None = None) -> dict[str, torch.Tensor]:
    """A document with distinct non-zero values, so padding and neighbours are easy to tell."""
    return {
        "input_ids": torch.arange(1, length + 1, dtype=torch.long) + 1000 * sample_id,
        "loss_mask": torch.tensor(mask if mask is not None else [1] * length, dtype=torch.long),
        "hidden_states": torch.rand(length, LAYERS_X_HIDDEN, dtype=torch.bfloat16) + 1,
        "target_last_hidden_states": torch.rand(length, HIDDEN) + 1,
        "sample_id": torch.tensor(sample_id),
    }


def packing(max_length: int = 256, buckets=None, num_anchors: int | None = 8, anchors=None):
    return ShapePolicy.from_parts(
        static_shapes=True,
        max_length=max_length,
        buckets=buckets,
        num_anchors=num_anchors,
        anchor_buckets=anchors,
        packing=True,
    )


def test_documents_are_concatenated_row_by_row_and_zero_padded():
    docs = [doc(100, 7), doc(120, 3), doc(200, 5), doc(30, 9)]
    batch = DataCollatorWithPadding(packing(256))(docs)
    # next-fit at 256: [100, 120] | [200, 30]
    assert batch["input_ids"].shape == (2, 256)
    assert batch["hidden_states"].shape == (2, 256, LAYERS_X_HIDDEN)
    assert batch["hidden_states"].dtype == torch.bfloat16
    rows = [[0, 1], [2, 3]]
    for r, row in enumerate(rows):
        start = 0
        for d, i in enumerate(row):
            n = docs[i]["input_ids"].shape[0]
            for key in ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"):
                assert torch.equal(batch[key][r, start : start + n], docs[i][key])
            assert (batch["document_ids"][r, start : start + n] == d).all()
            assert torch.equal(batch["position_ids"][r, start : start + n], torch.arange(n))
            assert (
                batch["document_sample_ids"][r, start : start + n] == int(docs[i]["sample_id"])
            ).all()
            start += n
        for key in ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"):
            assert not batch[key][r, start:].any(), key
        assert (batch["document_ids"][r, start:] == -1).all()
        assert not batch["position_ids"][r, start:].any()
        assert not batch["document_sample_ids"][r, start:].any()
    assert batch["sample_id"].tolist() == [7, 5]
    assert batch["num_documents"] == 4
    for key in ("document_ids", "position_ids", "document_sample_ids", "sample_id"):
        assert batch[key].dtype == torch.int64


def test_a_feature_shorter_than_its_document_keeps_the_next_one_aligned():
    first, second = doc(10, 1), doc(10, 2)
    first["hidden_states"] = first["hidden_states"][:6]
    batch = DataCollatorWithPadding(packing(128))([first, second])
    assert batch["input_ids"].shape == (1, 128)
    assert not batch["hidden_states"][0, 6:10].any()
    assert torch.equal(batch["hidden_states"][0, 10:20], second["hidden_states"])


def test_anchor_width_counts_valid_anchors_per_document_and_row():
    # Row 0: docs of 5 and 4 supervised tokens -> 4 + 3 anchors, not 8 (the boundary is not one).
    # Row 1: one doc, 6 tokens, mask 011011 -> 2 anchors.
    docs = [doc(5, 1), doc(4, 2), doc(6, 3, [0, 1, 1, 0, 1, 1])]
    policy = packing(128, num_anchors=16, anchors=[2, 7])
    batch = DataCollatorWithPadding(policy)([*docs[:2], doc(119, 4, [0] * 119), docs[2]])
    counts = packed_anchor_counts(batch["loss_mask"], batch["document_ids"])
    assert counts == [7, 2]
    assert batch[ANCHOR_WIDTH] == 7  # the fullest row's count, bucketed (7 is a bucket)
    # Alone, the three documents share one row: 4 + 3 + 2 = 9 anchors -> bucket 10.
    bucketed = DataCollatorWithPadding(packing(128, num_anchors=16, anchors=[4, 10]))(docs)
    assert bucketed[ANCHOR_WIDTH] == 10
    # Without anchor buckets a static run computes num_anchors blocks, packed or not.
    assert DataCollatorWithPadding(packing(128, num_anchors=16))(docs)[ANCHOR_WIDTH] == 16


def test_a_partly_filled_micro_batch_pads_to_the_bucket_of_its_fullest_row():
    policy = packing(1024, buckets=[256, 512])
    batch = DataCollatorWithPadding(policy)([doc(200, 1), doc(100, 2)])
    assert batch["input_ids"].shape == (1, 512)  # one row of 300 tokens -> bucket 512
    small = DataCollatorWithPadding(policy)([doc(100, 1), doc(50, 2)])
    assert small["input_ids"].shape == (1, 256)
    full = DataCollatorWithPadding(policy)([doc(1000, 1), doc(100, 2)])
    assert full["input_ids"].shape == (2, 1024)


def test_more_rows_than_a_micro_batch_are_not_the_collators_business():
    batch = DataCollatorWithPadding(packing(128))([doc(100, i) for i in range(5)])
    assert batch["input_ids"].shape == (5, 128) and batch["num_documents"] == 5


def test_packed_documents_need_a_sample_id():
    plain = doc(10, 1)
    del plain["sample_id"]
    with pytest.raises(KeyError, match="sample_id"):
        DataCollatorWithPadding(packing(128))([plain])


def test_packed_feature_errors_name_the_sample():
    long = doc(10, 1)
    long["hidden_states"] = torch.rand(12, LAYERS_X_HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must not be longer"):
        DataCollatorWithPadding(packing(128))([doc(5, 0), long])
    other = doc(10, 1)
    other["hidden_states"] = other["hidden_states"].float()
    with pytest.raises(ValueError, match="dtype"):
        DataCollatorWithPadding(packing(128))([doc(5, 0), other])
    with pytest.raises(ValueError, match="more than a row holds"):
        DataCollatorWithPadding(packing(128))([doc(129, 0)])


def test_unpacked_batches_are_unchanged_and_carry_no_packing_keys():
    docs = [doc(100, 7), doc(60, 3)]
    policy = ShapePolicy.from_parts(static_shapes=True, max_length=256, num_anchors=8)
    batch = DataCollatorWithPadding(policy)(docs)
    assert not set(PACKED_KEYS) & set(batch)
    assert batch["input_ids"].shape == (2, 256)
    assert batch["sample_id"].tolist() == [7, 3]
    assert torch.equal(batch["input_ids"][1, :60], docs[1]["input_ids"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 128), min_size=1, max_size=12), st.integers(0, 2**16))
def test_every_token_lands_once_in_document_order(lengths, seed):
    torch.manual_seed(seed)
    docs = [doc(n, i, torch.randint(0, 2, (n,)).tolist()) for i, n in enumerate(lengths)]
    batch = DataCollatorWithPadding(packing(128, num_anchors=64))(docs)
    keep = batch["document_ids"] >= 0
    assert int(keep.sum()) == sum(lengths)
    assert torch.equal(batch["input_ids"][keep], torch.cat([d["input_ids"] for d in docs]))
    assert torch.equal(batch["loss_mask"][keep], torch.cat([d["loss_mask"] for d in docs]))
    expected = sum(
        int((d["loss_mask"][:-1].bool() & d["loss_mask"][1:].bool()).sum()) for d in docs
    )
    assert sum(packed_anchor_counts(batch["loss_mask"], batch["document_ids"])) == expected
    assert batch["num_documents"] == len(lengths)
