"""Plain DFlash's HF config: the shared keys only, architecture `DFlashDraftModel`.

SGLang (models/dflash.py) and vLLM (registry entry qwen3_dflash) load the draft by that name.
With no `conv_kernel_size` / `selector_rank` in `dflash_config`, SGLang builds no convolution
and no selector.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict

from ..config import DFlashDraftConfig

DFLASH_ARCHITECTURE = "DFlashDraftModel"


@strict
class DFlashConfig(DFlashDraftConfig):
    """Plain DFlash: the backbone alone (no conv or selector keys, so engines build neither)."""

    def __post_init__(self, **kwargs: Any) -> None:
        if self.architectures is None:
            self.architectures = [DFLASH_ARCHITECTURE]
        super().__post_init__(**kwargs)
