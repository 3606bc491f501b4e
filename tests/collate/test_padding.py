"""Collators: zero padding to the longest sample, a fixed length or the smallest fitting bucket."""

from __future__ import annotations

import pytest
import torch

from specdraft.collate import DataCollatorWithPadding, pad_and_concatenate_features

LAYERS_X_HIDDEN, HIDDEN = 6, 2


def sample(length: int, sample_id: int, *, dspark: bool = True) -> dict[str, torch.Tensor]:
    """A sample with distinct non-zero values, so padding is easy to tell apart."""
    out = {
        "input_ids": torch.arange(1, length + 1, dtype=torch.long) + 100 * sample_id,
        "loss_mask": torch.ones(length, dtype=torch.long),
        "hidden_states": torch.rand(length, LAYERS_X_HIDDEN, dtype=torch.bfloat16) + 1,
        "sample_id": torch.tensor(sample_id),
    }
    if dspark:
        out["target_last_hidden_states"] = torch.rand(length, HIDDEN) + 1
    return out


@pytest.mark.parametrize(
    ("pad_to", "expected"),
    [(None, 300), (512, 512), ((256, 384, 512), 384), ((128, 256, 300), 300)],
)
def test_collator_pads_every_key_with_zeros(pad_to: object, expected: int) -> None:
    features = [sample(300, 0), sample(5, 1)]
    batch = DataCollatorWithPadding(pad_to=pad_to)(features)  # type: ignore[arg-type]

    assert batch["input_ids"].shape == (2, expected)
    assert batch["loss_mask"].shape == (2, expected)
    assert batch["hidden_states"].shape == (2, expected, LAYERS_X_HIDDEN)
    assert batch["target_last_hidden_states"].shape == (2, expected, HIDDEN)
    assert batch["sample_id"].tolist() == [0, 1]
    assert batch["input_ids"].dtype == batch["loss_mask"].dtype == torch.long
    assert batch["hidden_states"].dtype == torch.bfloat16
    for row, feature in enumerate(features):
        n = feature["input_ids"].shape[0]
        for key in ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"):
            assert torch.equal(batch[key][row, :n], feature[key])
            assert not batch[key][row, n:].any(), f"{key} padding of row {row} is not zero"


def test_dflash2_samples_have_no_last_hidden_state_key() -> None:
    batch = DataCollatorWithPadding(pad_to=(128,))([sample(9, 0, dspark=False)])
    assert "target_last_hidden_states" not in batch
    assert batch["input_ids"].shape == (1, 128)


def test_plain_lists_from_a_dataset_become_int64() -> None:
    features = [
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
        {"input_ids": [8], "loss_mask": [1]},
    ]
    batch = DataCollatorWithPadding(pad_to=None)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].dtype == torch.long


def test_feature_longer_than_input_ids_is_an_error() -> None:
    bad = sample(10, 0)
    bad["hidden_states"] = torch.ones(11, LAYERS_X_HIDDEN)
    with pytest.raises(ValueError, match=r"'hidden_states' has 11 rows but input_ids has 10"):
        pad_and_concatenate_features([bad], ["input_ids", "hidden_states"], None)


def test_batch_longer_than_the_last_bucket_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"300 tokens.*256"):
        DataCollatorWithPadding(pad_to=(128, 256))([sample(300, 0)])


def test_a_key_that_only_some_samples_carry_is_an_error() -> None:
    with pytest.raises(KeyError, match="target_last_hidden_states"):
        DataCollatorWithPadding()([sample(4, 0, dspark=False), sample(4, 1)])


def test_mismatched_feature_width_is_an_error() -> None:
    other = sample(4, 1)
    other["hidden_states"] = torch.ones(4, LAYERS_X_HIDDEN + 1)
    with pytest.raises(ValueError, match="feature width"):
        DataCollatorWithPadding()([sample(4, 0), other])


def test_pad_and_concatenate_only_the_requested_keys() -> None:
    batch = pad_and_concatenate_features([sample(3, 0), sample(2, 1)], ["loss_mask"], 128)
    assert list(batch) == ["loss_mask"]
    assert batch["loss_mask"].sum().item() == 5


def test_a_seed_pad_to_collates_without_an_anchor_width() -> None:
    from specdraft.collate import ANCHOR_WIDTH

    batch = DataCollatorWithPadding(pad_to=(128, 256))([sample(20, 1), sample(30, 2)])
    assert batch["input_ids"].shape[1] == 128
    assert ANCHOR_WIDTH not in batch  # a pad-only policy knows no num_anchors


@pytest.mark.parametrize(
    ("anchor_buckets", "masks", "width"),
    [
        (None, [[1] * 10, [1] * 4], 9),  # pad-to-longest: exactly the largest count
        ((4, 16), [[1] * 5, [0, 1, 1, 0, 1, 1]], 4),  # counts 4 and 2 -> bucket 4
        ((4, 16), [[1] * 6, [1] * 2], 16),  # count 5 -> the next bucket, num_anchors
        ((4, 16), [[1] * 40], 16),  # more valid anchors than num_anchors: capped
    ],
)
def test_the_run_policy_sets_the_anchor_width_from_the_loss_masks(
    anchor_buckets, masks, width
) -> None:
    from specdraft.collate import ANCHOR_WIDTH, ShapePolicy, anchor_counts

    rows = []
    for i, mask in enumerate(masks):
        row = sample(len(mask) + 2, i)
        row["loss_mask"] = torch.tensor([*mask, 0, 0])
        rows.append(row)
    policy = ShapePolicy.from_parts(
        static_shapes=anchor_buckets is not None,
        max_length=128,
        num_anchors=16,
        anchor_buckets=anchor_buckets,
    )
    batch = DataCollatorWithPadding(pad_to=policy)(rows)
    assert batch[ANCHOR_WIDTH] == width
    counts = anchor_counts(batch["loss_mask"])
    assert counts == [sum(a and b for a, b in zip(m, [*m[1:], 0], strict=True)) for m in masks]
