"""Offline target features: prepare them once with the target, then train without it.

`prepare_features` runs the target over the training corpus and writes safetensors shards plus
an `index.json` (`shards.py`: the file format, atomic writes, checksums, resumable);
`FeatureShardDataset` reads them back for training. What a folder records about how it was made
(target, layer ids, whether DSpark's final hidden state is there, tokenizer, max_length) lives
in `meta.py`: `expected_feature_meta(config)` is what a training config checks a folder against,
and `FeatureMismatch` names each differing field and the config key to change.
"""

from .meta import FeatureMismatch, expected_feature_meta, feature_meta
from .prepare import PrepareResult, prepare_features
from .shards import FeatureShardDataset

__all__ = [
    "FeatureMismatch",
    "FeatureShardDataset",
    "PrepareResult",
    "expected_feature_meta",
    "feature_meta",
    "prepare_features",
]
