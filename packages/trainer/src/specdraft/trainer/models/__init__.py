"""Draft models of the DFlash family (DFlash2, DSpark), their objectives and the frozen target."""

from .anchors import sample_anchors, valid_anchor_positions
from .backbone import BlockTargets, DraftModel
from .config import (
    DFLASH2_ARCHITECTURE,
    DSPARK_ARCHITECTURE,
    DFlash2Config,
    DFlashDraftConfig,
    DSparkConfig,
    draft_config_from,
)
from .dflash2 import DFlash2Draft, DFlash2DraftModel
from .dspark import DSparkDraft, Qwen3DSparkModel
from .factory import build_draft
from .losses import DraftLoss
from .masks import build_block_mask, dense_block_mask, flex_block_mask
from .spec import DraftTrainSpec, resolve_attention_backend
from .target import TargetFeatureExtractor, TargetHead, load_target_config, load_target_head

__all__ = [
    "DFLASH2_ARCHITECTURE",
    "DSPARK_ARCHITECTURE",
    "BlockTargets",
    "DFlash2Config",
    "DFlash2Draft",
    "DFlash2DraftModel",
    "DFlashDraftConfig",
    "DSparkConfig",
    "DSparkDraft",
    "DraftLoss",
    "DraftModel",
    "DraftTrainSpec",
    "Qwen3DSparkModel",
    "TargetFeatureExtractor",
    "TargetHead",
    "build_block_mask",
    "build_draft",
    "dense_block_mask",
    "draft_config_from",
    "flex_block_mask",
    "load_target_config",
    "load_target_head",
    "resolve_attention_backend",
    "sample_anchors",
    "valid_anchor_positions",
]
