"""How often each target token is a supervised label in a corpus (the answers the draft learns).

A label is a token at a position whose loss_mask is set: exactly the positions the objectives
supervise (models/losses.block_targets), so the counts are what the draft vocabulary has to
cover. Read from Arrow (tokenised conversations) or from the feature shards in one vectorised
pass, without materialising Python rows.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np


def supervised_token_counts(input_ids: Any, loss_mask: Any, vocab_size: int) -> np.ndarray:
    """Counts [vocab_size] (int64) of the tokens at supervised positions.

    `input_ids` and `loss_mask` are flat arrays of equal length (every sample concatenated).
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    mask = np.asarray(loss_mask).astype(bool)
    if ids.shape != mask.shape:
        raise ValueError(f"input_ids {ids.shape} and loss_mask {mask.shape} differ in length")
    labels = ids[mask]
    if labels.size and (labels.min() < 0 or labels.max() >= vocab_size):
        raise ValueError(
            f"a supervised token id ({int(labels.max())}) is outside the target vocabulary "
            f"({vocab_size}): the data was tokenised for another target"
        )
    return np.bincount(labels, minlength=vocab_size).astype(np.int64)


def arrow_token_counts(dataset: Any, vocab_size: int) -> np.ndarray:
    """Counts of a tokenised dataset (`data.build_dataset`), read from its Arrow columns."""
    table = dataset.with_format("arrow")[:]
    ids = table["input_ids"].combine_chunks().flatten()
    mask = table["loss_mask"].combine_chunks().flatten()
    return supervised_token_counts(ids, mask, vocab_size)


def shard_token_counts(dataset: Any, vocab_size: int) -> np.ndarray:
    """Counts of offline feature shards (`features.shards.FeatureShardDataset`)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in dataset.token_columns():
        counts += supervised_token_counts(ids, mask, vocab_size)
    return counts


def corpus_token_counts(
    config: Any, vocab_size: int, *, split: Literal["train", "eval"] = "train", progress: bool
) -> np.ndarray | None:
    """The supervised-token counts of a config's train or held-out corpus, as training reads it.

    None for `split="eval"` without data.eval_paths.
    """
    data = config.data
    if split == "eval" and not data.eval_paths:
        return None
    if split == "train" and data.format == "features":
        from ..features.meta import expected_feature_meta
        from ..features.shards import FeatureShardDataset

        shards = FeatureShardDataset(data.train_paths, expected=expected_feature_meta(config))
        return shard_token_counts(shards, vocab_size)
    from ..data import build_dataset

    dataset, _ = build_dataset(config, split=split, progress=progress)
    return arrow_token_counts(dataset, vocab_size)
