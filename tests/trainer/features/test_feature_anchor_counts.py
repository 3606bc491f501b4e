"""Offline feature shards give an anchor-grouped run the anchor counts of their loss masks,
sample by sample in dataset order, without reading the hidden states into the plan."""

from __future__ import annotations

from dataclasses import asdict

import torch

from specdraft.collate import valid_anchor_count
from specdraft.trainer.features.shards import FeatureShardDataset, write_index, write_shard


def sample(length: int, supervised_from: int) -> dict[str, torch.Tensor]:
    mask = torch.zeros(length, dtype=torch.long)
    mask[supervised_from:] = 1
    return {
        "input_ids": torch.arange(length),
        "loss_mask": mask,
        "hidden_states": torch.zeros(length, 4),
    }


def test_anchor_counts_come_from_the_shards_loss_masks_in_order(tmp_path):
    shards = [
        [sample(10, 2), sample(6, 5), sample(8, 8)],
        [sample(12, 0), sample(3, 1)],
    ]
    records = [write_shard(tmp_path, i, samples) for i, samples in enumerate(shards)]
    write_index(
        tmp_path,
        {"meta": {}, "complete": True, "shards": [asdict(r) for r in records], "shard_size": 3},
    )
    dataset = FeatureShardDataset([tmp_path], expected=None)
    expected = [valid_anchor_count(s["loss_mask"].tolist()) for group in shards for s in group]
    assert expected == [7, 0, 0, 11, 1]
    assert dataset.anchor_counts() == expected
    assert dataset.lengths == [10, 6, 8, 12, 3]
