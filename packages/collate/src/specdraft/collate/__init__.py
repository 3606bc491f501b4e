"""specdraft collate: static pad lengths, collators, samplers, padding accounting and suggestion."""

from specdraft.config import ShapePolicy

from .accounting import BucketStats, PaddingReport, account_padding, plan_micro_batches
from .lengths import resolve_static_length, static_pad_length
from .packed import (
    DOCUMENT_IDS,
    DOCUMENT_SAMPLE_IDS,
    NUM_DOCUMENTS,
    PACKED_KEYS,
    POSITION_IDS,
    packed_anchor_counts,
)
from .packing import pack_first_fit_decreasing, split_rows
from .padding import (
    ANCHOR_WIDTH,
    DataCollatorWithPadding,
    anchor_counts,
    batch_anchor_width,
    pad_and_concatenate_features,
    valid_anchor_count,
)
from .samplers import MicroBatchSampler, sampler_from_config
from .suggest import bucket_cost, grid_weights, optimal_buckets, suggest_buckets

__version__ = "0.1.0"

__all__ = [
    "ANCHOR_WIDTH",
    "DOCUMENT_IDS",
    "DOCUMENT_SAMPLE_IDS",
    "NUM_DOCUMENTS",
    "PACKED_KEYS",
    "POSITION_IDS",
    "BucketStats",
    "DataCollatorWithPadding",
    "MicroBatchSampler",
    "PaddingReport",
    "ShapePolicy",
    "account_padding",
    "anchor_counts",
    "batch_anchor_width",
    "bucket_cost",
    "grid_weights",
    "optimal_buckets",
    "pack_first_fit_decreasing",
    "packed_anchor_counts",
    "pad_and_concatenate_features",
    "plan_micro_batches",
    "resolve_static_length",
    "sampler_from_config",
    "split_rows",
    "static_pad_length",
    "suggest_buckets",
    "valid_anchor_count",
]
