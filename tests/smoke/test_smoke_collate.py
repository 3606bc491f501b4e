"""specdraft-collate as installed: every public module imports, and the collator pads a batch to
the smallest bucket that holds its longest sample, with zeros."""

from __future__ import annotations

import torch
from smoke_support import assert_every_public_module_imports

from specdraft.collate import DataCollatorWithPadding


def test_every_public_module_imports():
    assert_every_public_module_imports("specdraft.collate")


def test_the_collator_pads_to_the_smallest_fitting_bucket():
    features = [
        {
            "input_ids": torch.arange(1, length + 1),
            "loss_mask": torch.ones(length, dtype=torch.long),
            "hidden_states": torch.rand(length, 6) + 1,
            "sample_id": torch.tensor(index),
        }
        for index, length in enumerate((130, 7))
    ]
    batch = DataCollatorWithPadding(pad_to=(128, 256, 384))(features)
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (2, 256)
    assert batch["hidden_states"].shape == (2, 256, 6)
    assert batch["sample_id"].tolist() == [0, 1]
    for row, feature in enumerate(features):
        length = feature["input_ids"].shape[0]
        for key in ("input_ids", "loss_mask", "hidden_states"):
            assert torch.equal(batch[key][row, :length], feature[key])
            assert not batch[key][row, length:].any()
