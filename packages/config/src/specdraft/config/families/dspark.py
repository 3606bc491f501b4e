"""DSpark, config side: `[model.dspark]` (Markov head, confidence head, loss weights).

The trainer's half (model, HF config keys, metrics, export layouts) is
`specdraft/trainer/models/dspark/`.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import Field

from ..section import MAX_WIDTH, PositiveInt, Section
from .base import FamilyRules


class DSparkOptions(Section):
    """`[model.dspark]`: the DSpark Markov head, confidence head and loss weights."""

    markov_rank: PositiveInt = Field(
        256,
        le=MAX_WIDTH,
        description="Rank of the low-rank previous-token bias W2(E1[prev]) on the logits.",
    )
    markov_type: Literal["vanilla", "gated", "rnn"] = Field(
        "vanilla",
        description="Markov head variant: 'vanilla' adds W2(E1[prev]); 'gated' scales it by a "
        "gate from the draft hidden state; 'rnn' carries a recurrent state along the block.",
    )
    confidence_head: bool = Field(
        True, description="Train a head that predicts each position's acceptance probability."
    )
    confidence_uses_markov: bool = Field(
        False, description="Feed the Markov embedding of the previous token to the confidence head."
    )
    ce_weight: float = Field(0.1, ge=0.0, description="Weight of the cross-entropy term.")
    l1_weight: float = Field(
        0.9, ge=0.0, description="Weight of the L1 distance between draft and target distributions."
    )
    confidence_weight: float = Field(
        1.0,
        ge=0.0,
        description="Weight of the confidence BCE against accept = clamp(1 - L1/2, 0, 1).",
    )


def dspark_options(model: Any) -> DSparkOptions:
    """The `[model.dspark]` table of a ModelConfig (the schema mounts it from RULES)."""
    return cast(DSparkOptions, model.dspark)


RULES = FamilyRules(
    name="dspark",
    title="DSpark",
    summary="shifted labels, Markov and confidence heads",
    options=DSparkOptions,
    # vLLM's qwen3_dspark maps draft ids through d2t; speculators' DSpark takes t2d/d2t.
    draft_vocab_served=True,
)
