"""Draft models of the DFlash family (DFlash, DFlash2, DSpark), their objectives and the target.

Each family is a folder (`dflash/`, `dflash2/`, `dspark/`: model, HF config, `family.py`);
`family.py` here collects them (by name: nothing outside a family's folder imports its
classes). The modules at this level are what the families share.
"""

from .anchors import sample_anchors, valid_anchor_positions
from .backbone import BlockTargets, DraftModel
from .config import DFlashDraftConfig
from .documents import DocumentLayout, document_layout
from .factory import build_draft, draft_config_from
from .family import DraftFamily, family_for, family_of, family_of_architecture, metric_ratios
from .losses import DraftLoss
from .masks import both_block_masks, build_block_mask, dense_block_mask, flex_block_mask
from .spec import DraftTrainSpec, resolve_attention_backend
from .target import (
    TargetFeatureExtractor,
    TargetHead,
    load_target_config,
    load_target_head,
    target_dtype,
)

__all__ = [
    "BlockTargets",
    "DFlashDraftConfig",
    "DocumentLayout",
    "DraftFamily",
    "DraftLoss",
    "DraftModel",
    "DraftTrainSpec",
    "TargetFeatureExtractor",
    "TargetHead",
    "both_block_masks",
    "build_block_mask",
    "build_draft",
    "dense_block_mask",
    "document_layout",
    "draft_config_from",
    "family_for",
    "family_of",
    "family_of_architecture",
    "flex_block_mask",
    "load_target_config",
    "load_target_head",
    "metric_ratios",
    "resolve_attention_backend",
    "sample_anchors",
    "target_dtype",
    "valid_anchor_positions",
]
