"""DFlash2's HF config: architecture `DFlash2DraftModel`, the conv and selector keys.

SGLang's `parse_dflash_draft_config` reads the nested `dflash_config` first (block_size,
target_layer_ids, mask_token_id, conv_kernel_size, conv_group_size, selector_rank,
selector_top_k; the conv and selector keys only there), then top-level `block_size`,
`target_layer_ids`, `mask_token_id`, `num_target_layers`.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict

from ..config import DFlashDraftConfig

DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
# Taps of the DFlash2 in-block convolution: y_t = k_t0 * x_t + k_t1 * x_(t-1).
DFLASH2_CONV_TAPS = 2


@strict
class DFlash2Config(DFlashDraftConfig):
    """DFlash2: backbone + two-tap dynamic depthwise conv + pairwise path selector."""

    conv_kernel_size: int = DFLASH2_CONV_TAPS
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    selector_loss_weight: float = 0.1
    selector_gold_policy: str = "exclude"

    def __post_init__(self, **kwargs: Any) -> None:
        if self.architectures is None:
            self.architectures = [DFLASH2_ARCHITECTURE]
        super().__post_init__(**kwargs)

    def _serving_keys(self) -> dict:
        keys = super()._serving_keys()
        keys.update(
            conv_kernel_size=self.conv_kernel_size,
            conv_group_size=self.conv_group_size,
            selector_rank=self.selector_rank,
            selector_top_k=self.selector_top_k,
        )
        return keys
