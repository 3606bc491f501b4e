"""Draft models of the DFlash family (DFlash, DFlash2, DSpark), their objectives and the target.

Each family is a folder (`dflash/`, `dflash2/`, `dspark/`: model, HF config, `family.py`);
`family.py` here collects them. The modules at this level are what the families share.
"""

from .anchors import sample_anchors, valid_anchor_positions
from .backbone import BlockTargets, DraftModel
from .config import DFlashDraftConfig
from .dflash import DFlashDraftModel
from .dflash.hf_config import DFLASH_ARCHITECTURE, DFlashConfig
from .dflash2 import DFlash2DraftModel
from .dflash2.hf_config import DFLASH2_ARCHITECTURE, DFlash2Config
from .documents import DocumentLayout, document_layout
from .dspark import Qwen3DSparkModel
from .dspark.hf_config import DSPARK_ARCHITECTURE, DSparkConfig
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
    "DFLASH2_ARCHITECTURE",
    "DFLASH_ARCHITECTURE",
    "DSPARK_ARCHITECTURE",
    "BlockTargets",
    "DFlash2Config",
    "DFlash2DraftModel",
    "DFlashConfig",
    "DFlashDraftConfig",
    "DFlashDraftModel",
    "DSparkConfig",
    "DocumentLayout",
    "DraftFamily",
    "DraftLoss",
    "DraftModel",
    "DraftTrainSpec",
    "Qwen3DSparkModel",
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
