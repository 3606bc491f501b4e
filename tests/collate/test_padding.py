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
