"""DFlash2 as a draft family: its options as HF keys, its checks, layouts and extra FLOPs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdraft.config import ModelConfig
from specdraft.config.families.dflash2 import dflash2_options

from ..family_spec import (
    TRAINABLE,
    DraftFamily,
    FlopTerms,
    SpeculatorsLayout,
    VllmLayout,
)
from .hf_config import DFLASH2_ARCHITECTURE, DFLASH2_CONV_TAPS, DFlash2Config
from .model import DFLASH2_METRIC_RATIOS, DFlash2DraftModel

# The conv and selector keys engines read (vLLM and speculators copy them as ints).
SERVING_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _options(model_cfg: ModelConfig) -> dict[str, Any]:
    opts = dflash2_options(model_cfg)
    if opts.selector_gold_policy is None:
        raise ValueError("model.dflash2.selector_gold_policy is required: 'exclude' or 'insert'")
    return {
        "conv_kernel_size": DFLASH2_CONV_TAPS,
        "conv_group_size": opts.conv_group_size,
        "selector_rank": opts.selector_rank,
        "selector_top_k": opts.selector_top_k,
        "selector_loss_weight": opts.selector_loss_weight,
        "selector_gold_policy": opts.selector_gold_policy,
    }


def _check_target(model_cfg: ModelConfig, backbone: dict[str, Any]) -> None:
    """Errors that would otherwise surface as a shape mismatch inside the conv or selector."""
    opts = dflash2_options(model_cfg)
    group = opts.conv_group_size
    if backbone["hidden_size"] % group:
        raise ValueError(
            f"model.dflash2.conv_group_size = {group} does not divide the target hidden size "
            f"{backbone['hidden_size']}; use a divisor such as 16"
        )
    # The candidates are a top-k of the draft's logits: over the draft vocabulary when set.
    vocab = backbone.get("draft_vocab_size") or backbone["vocab_size"]
    if opts.selector_top_k > vocab:
        raise ValueError(
            f"model.dflash2.selector_top_k = {opts.selector_top_k} exceeds the "
            f"vocabulary size {vocab} the draft proposes from; use 16"
        )


def _serving_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: int(config[key]) for key in SERVING_KEYS}


def _layer_flops(config: DFlash2Config, tokens: int) -> FlopTerms:
    """The two kernel projections of the attention and MLP convs: 2 * 2 T H (2 taps H / group)."""
    groups = config.hidden_size // config.conv_group_size
    conv = 2 * 2 * tokens * config.hidden_size * 2 * config.conv_kernel_size * groups
    return {"conv": (conv, TRAINABLE)}


def _head_flops(config: DFlash2Config, slots: int) -> FlopTerms:
    """The selector's hidden projection 2 R H r (skipped when its loss weight is 0)."""
    if config.selector_loss_weight == 0:
        return {}
    return {"selector": (2 * slots * config.hidden_size * config.selector_rank, TRAINABLE)}


FAMILY = DraftFamily(
    name="dflash2",
    config_class=DFlash2Config,
    model_class=DFlash2DraftModel,
    needs_last_hidden=False,
    sglang_algorithm="DFLASH",
    config_options=_options,
    check_target=_check_target,
    metric_ratios=DFLASH2_METRIC_RATIOS,
    vllm=VllmLayout(
        architecture=DFLASH2_ARCHITECTURE,
        method="dflash",
        tensors=(
            r"layers\.\d+\.(attention_conv|mlp_conv)\.(base_kernel|kernel_projection\.weight)",
            r"candidate_selector\.(predecessor_codebook|successor_codebook|hidden_projection\.weight)",
        ),
        training_keys=("selector_loss_weight", "selector_gold_policy"),
        dflash_config_keys=_serving_keys,
        no_draft_vocab=(
            "vLLM 0.32's DFlash2 speculator takes its top-k candidates from the draft head "
            "(compute_candidates) without mapping them through d2t, so a pruned head would "
            "propose draft ids as target ids"
        ),
    ),
    speculators=SpeculatorsLayout(
        model_type="dflash2",
        architecture="DFlash2DraftModel",
        keys=_serving_keys,
        no_draft_vocab="speculators 0.9.0's DFlash2DraftModel requires the full verifier "
        "vocabulary (draft_vocab_size = vocab_size)",
    ),
    layer_flops=_layer_flops,
    head_flops=_head_flops,
)
