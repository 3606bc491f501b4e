"""DSpark's HF config: architecture `Qwen3DSparkModel` (SGLang's entry class), the head keys.

`markov_rank`, `markov_head_type`, `enable_confidence_head` and `confidence_head_with_markov`
are read at the top level; SGLang enables the Markov confidence input when the key is missing,
so it is always written.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict

from ..config import DFlashDraftConfig

DSPARK_ARCHITECTURE = "Qwen3DSparkModel"


@strict
class DSparkConfig(DFlashDraftConfig):
    """DSpark: backbone + Markov head + confidence head, trained on shifted labels."""

    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = False
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0

    def __post_init__(self, **kwargs: Any) -> None:
        if self.architectures is None:
            self.architectures = [DSPARK_ARCHITECTURE]
        super().__post_init__(**kwargs)
