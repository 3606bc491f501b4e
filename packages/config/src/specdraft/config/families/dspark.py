"""DSpark, config side: `[model.dspark]` (Markov head, confidence head, loss weights), and what
llama.cpp can load of it when `serve.engines` names llama.cpp (SD326, a shared code).

The trainer's half (model, HF config keys, metrics, export layouts) is
`specdraft/trainer/models/dspark/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from ..finding import Problem
from ..section import MAX_WIDTH, PositiveInt, Section
from ..serve import LLAMA_CPP
from .base import FamilyRules

if TYPE_CHECKING:
    from ..schema import Config


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


def _llama_cpp_loads(config: Config) -> list[Problem]:
    """What llama.cpp (build 11434) cannot load of a DSpark draft, when the config names it.

    Read in its source: conversion/qwen.py's DSparkModel refuses any `markov_head_type` but
    'vanilla', and src/models/dflash.cpp builds the confidence head as one projection of the
    draft state and the Markov embedding of the previous token (hidden + markov_rank inputs),
    so llama-server refuses a head trained on the state alone (conf_proj's shape).
    """
    if not config.serve.named(LLAMA_CPP):
        return []
    opts, problems = dspark_options(config.model), []
    if opts.markov_type != "vanilla":
        problems.append(
            Problem(
                "SD326",
                ("model", "dspark", "markov_type"),
                f"serve.engines names llama.cpp, which builds only the 'vanilla' DSpark Markov "
                f"head (its converter refuses {opts.markov_type!r}); set "
                'model.dspark.markov_type = "vanilla", or drop llama.cpp from serve.engines',
            )
        )
    if opts.confidence_head and not opts.confidence_uses_markov:
        problems.append(
            Problem(
                "SD326",
                ("model", "dspark", "confidence_uses_markov"),
                "serve.engines names llama.cpp, whose DSpark confidence head reads the draft "
                "state and the Markov embedding of the previous token (llama-server refuses a "
                "head of the state alone: conf_proj's shape); set "
                "model.dspark.confidence_uses_markov = true, or confidence_head = false",
            )
        )
    return problems


RULES = FamilyRules(
    name="dspark",
    title="DSpark",
    summary="shifted labels, Markov and confidence heads",
    options=DSparkOptions,
    config_checks=_llama_cpp_loads,
    # vLLM's qwen3_dspark maps draft ids through d2t (speculators' DSpark takes t2d/d2t);
    # llama.cpp's converter reads DSpark's d2t and its runtime scatters logits and Markov bias.
    draft_vocab_engines=("vllm", "llama.cpp"),
    architecture="Qwen3DSparkModel",
    speculators_type="dspark",
    folder_keys=(
        ("markov_rank", "markov_rank"),
        ("markov_head_type", "markov_type"),
        ("enable_confidence_head", "confidence_head"),
        ("confidence_head_with_markov", "confidence_uses_markov"),
    ),
)
