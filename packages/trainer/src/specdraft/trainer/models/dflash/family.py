"""Plain DFlash as a draft family: the backbone alone, the layout every engine reads as is."""

from __future__ import annotations

from ..family_spec import DraftFamily, SpeculatorsLayout, VllmLayout, no_options, no_target_check
from ..offsets import OFFSET_METRIC_RATIOS
from .hf_config import DFLASH_ARCHITECTURE, DFlashConfig
from .model import DFlashDraftModel

FAMILY = DraftFamily(
    name="dflash",
    config_class=DFlashConfig,
    model_class=DFlashDraftModel,
    needs_last_hidden=False,
    # SGLang serves plain DFlash drafts with the DFLASH worker (DFlashDraftModel is its base
    # class; DFlash2DraftModel extends it with the selector).
    sglang_algorithm="DFLASH",
    config_options=no_options,
    check_target=no_target_check,
    metric_ratios=OFFSET_METRIC_RATIOS,
    vllm=VllmLayout(architecture=DFLASH_ARCHITECTURE, method="dflash"),
    speculators=SpeculatorsLayout(model_type="dflash", architecture="DFlashSpeculator"),
)
