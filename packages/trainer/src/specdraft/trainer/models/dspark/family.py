"""DSpark as a draft family: options as HF keys, layouts, extra FLOPs; slot k -> anchor + k + 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdraft.config import ModelConfig
from specdraft.config.families.dspark import dspark_options

from ..draft_vocab import logits_size
from ..family_spec import (
    NO_GRAD,
    TRAINABLE,
    DraftFamily,
    FlopTerms,
    SpeculatorsLayout,
    VllmLayout,
    no_target_check,
)
from .hf_config import DSPARK_ARCHITECTURE, DSparkConfig
from .model import DSPARK_METRIC_RATIOS, Qwen3DSparkModel


def _options(model_cfg: ModelConfig) -> dict[str, Any]:
    opts = dspark_options(model_cfg)
    return {
        "markov_rank": opts.markov_rank,
        "markov_head_type": opts.markov_type,
        "enable_confidence_head": opts.confidence_head,
        "confidence_head_with_markov": opts.confidence_uses_markov,
        "ce_weight": opts.ce_weight,
        "l1_weight": opts.l1_weight,
        "confidence_weight": opts.confidence_weight,
    }


def _vllm_top_level(config: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("markov_rank", "enable_confidence_head", "confidence_head_with_markov")
    return {key: config[key] for key in keys}


def _vllm_cannot_build(config: Any) -> str | None:
    """vLLM's Qwen3DSparkModel builds only the vanilla Markov head."""
    head = getattr(config, "markov_head_type", "vanilla")
    if head == "vanilla":
        return None
    return (
        f"its DSpark Markov head is {head!r} (model.dspark.markov_type = {head!r}) and vLLM's "
        "Qwen3DSparkModel builds only the 'vanilla' head; train with model.dspark.markov_type "
        '= "vanilla" to serve with vLLM, or export --format sglang or --format speculators, '
        "whose loaders build it"
    )


def _speculators_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "markov_rank": int(config["markov_rank"]),
        "markov_head_type": config["markov_head_type"],
        "enable_confidence_head": bool(config["enable_confidence_head"]),
        "confidence_head_with_markov": bool(config["confidence_head_with_markov"]),
    }


def _head_flops(config: DSparkConfig, slots: int) -> FlopTerms:
    """Markov 2 R r V (+ gate 2 R (H + r) r, or rnn 2 R (2r + H) 3r), confidence, target head."""
    hidden, rank, vocab = config.hidden_size, config.markov_rank, config.vocab_size
    markov = 2 * slots * rank * logits_size(config)
    if config.markov_head_type == "gated":
        markov += 2 * slots * (hidden + rank) * rank
    elif config.markov_head_type == "rnn":
        markov += 2 * slots * (2 * rank + hidden) * 3 * rank
    terms = {"markov": (markov, TRAINABLE)}
    if config.enable_confidence_head:
        width = hidden + (rank if config.confidence_head_with_markov else 0)
        terms["confidence"] = (2 * slots * width, TRAINABLE)
    if config.l1_weight != 0 or config.enable_confidence_head:
        # The target's distribution over the same slots, under no_grad.
        terms["target_head"] = (2 * slots * hidden * vocab, NO_GRAD)
    return terms


FAMILY = DraftFamily(
    name="dspark",
    config_class=DSparkConfig,
    model_class=Qwen3DSparkModel,
    needs_last_hidden=True,
    sglang_algorithm="DSPARK",
    config_options=_options,
    check_target=no_target_check,
    metric_ratios=DSPARK_METRIC_RATIOS,
    vllm=VllmLayout(
        architecture=DSPARK_ARCHITECTURE,
        method="dspark",
        tensors=(
            r"markov_head\.markov_w[12]\.weight",
            r"confidence_head\.proj\.(weight|bias)",
        ),
        training_keys=("ce_weight", "l1_weight", "confidence_weight"),
        top_level_keys=_vllm_top_level,
        cannot_build=_vllm_cannot_build,
    ),
    speculators=SpeculatorsLayout(
        model_type="dspark", architecture="DSparkSpeculator", keys=_speculators_keys
    ),
    sample_from_anchor=True,
    head_flops=_head_flops,
)
