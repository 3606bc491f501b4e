"""`--format vllm`: the layout vLLM 0.32's own draft loaders read.

Read in the installed vLLM: `model_executor/models/registry.py` routes `architectures`
`DFlashDraftModel` -> qwen3_dflash, `DFlash2DraftModel` -> qwen3_dflash2 and `Qwen3DSparkModel`
-> qwen3_dspark. `qwen3_dflash.py` reads `dflash_config` (mask_token_id, target_layer_ids in the
SGLang convention, see layer_ids.py) and the top-level `is_causal`; `qwen3_dflash2.py` the conv
and selector keys from `dflash_config` only; `qwen3_dspark.py` `markov_rank`,
`enable_confidence_head` and `confidence_head_with_markov` at the top level and builds the
vanilla Markov head only. `v1/worker/gpu/spec_decode/dflash/speculator.py` refuses
`dflash_config.sample_from_anchor = true` (DFlash's anchor is the bonus token), while the DSpark
speculator reads a top-level `sample_from_anchor`, default true. Weights: the loaders prefix
every name with `model.` and read the draft's own modules; embed_tokens and lm_head are shared
from the target when absent, as specdraft's drafts have none.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from ...models.backbone import DraftModel
from .layer_ids import engine_layer_ids
from .options import ExportOptions
from .source import ExportRefused

# specdraft family name -> vLLM's `architectures` entry (the registry key of its loader).
VLLM_ARCHITECTURES = {
    "dflash": "DFlashDraftModel",
    "dflash2": "DFlash2DraftModel",
    "dspark": "Qwen3DSparkModel",
}
# Tensors vLLM's loaders read, per family (beyond the backbone's).
_BACKBONE = (
    r"fc\.weight",
    r"(hidden_norm|norm)\.weight",
    r"layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight",
    r"layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight",
    r"layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.weight",
)
_FAMILY_TENSORS = {
    "dflash": (),
    "dflash2": (
        r"layers\.\d+\.(attention_conv|mlp_conv)\.(base_kernel|kernel_projection\.weight)",
        r"candidate_selector\.(predecessor_codebook|successor_codebook|hidden_projection\.weight)",
    ),
    "dspark": (
        r"markov_head\.markov_w[12]\.weight",
        r"confidence_head\.proj\.(weight|bias)",
    ),
}
# Training-only keys of specdraft's configs that no engine reads.
_TRAINING_KEYS = (
    "selector_loss_weight",
    "selector_gold_policy",
    "ce_weight",
    "l1_weight",
    "confidence_weight",
)


def loaded_by_vllm(family: str, name: str) -> bool:
    """Whether vLLM's loader of `family` reads the draft tensor `name`."""
    patterns = _BACKBONE + _FAMILY_TENSORS[family]
    return any(re.fullmatch(pattern, name) for pattern in patterns)


def check_vllm_can_build(family: str, config: Any, checkpoint: str) -> None:
    """Refuse a draft whose heads vLLM's loader cannot build (DSpark's gated and rnn heads)."""
    if family not in VLLM_ARCHITECTURES:
        raise ExportRefused(
            f"cannot export {checkpoint} as --format vllm: vLLM has no loader for the "
            f"{family!r} family; use --format sglang"
        )
    head = getattr(config, "markov_head_type", "vanilla")
    if family == "dspark" and head != "vanilla":
        raise ExportRefused(
            f"cannot export {checkpoint} as --format vllm: its DSpark Markov head is {head!r} "
            f"(model.dspark.markov_type = {head!r}) and vLLM's Qwen3DSparkModel builds only the "
            "'vanilla' head; train with model.dspark.markov_type = \"vanilla\" to serve with "
            "vLLM, or export --format sglang or --format speculators, whose loaders build it"
        )


def vllm_config(family: str, config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's config.json from the draft's own (the dict `save_pretrained` wrote)."""
    out = {k: v for k, v in config.items() if k not in _TRAINING_KEYS}
    out["architectures"] = [VLLM_ARCHITECTURES[family]]
    # DFlash and DFlash2 slot k predicts anchor + k (the anchor is the bonus token); DSpark's
    # slot k predicts anchor + k + 1, so its anchor is the first prediction.
    sample_from_anchor = family == "dspark"
    dflash_config: dict[str, Any] = {
        "block_size": int(config["block_size"]),
        "target_layer_ids": engine_layer_ids(config["target_layer_ids"]),
        "mask_token_id": int(config["mask_token_id"]),
    }
    if family == "dflash2":
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            dflash_config[key] = int(config[key])
    if not sample_from_anchor:
        # The DSpark speculator subclasses DFlash's, which refuses this key when true.
        dflash_config["sample_from_anchor"] = False
    out["dflash_config"] = dflash_config
    out["sample_from_anchor"] = sample_from_anchor
    out["is_causal"] = False  # blocks attend both ways (qwen3_dflash._dflash_layer_causal)
    if family == "dspark":
        for key in ("markov_rank", "enable_confidence_head", "confidence_head_with_markov"):
            out[key] = config[key]
    return out


def write_vllm(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write vLLM's config.json and the tensors it loads; return the names left out."""
    from ...models import family_of_architecture

    family = family_of_architecture(type(model).__name__).name
    check_vllm_can_build(family, model.config, options.checkpoint)
    model.save_pretrained(str(folder), safe_serialization=True)
    config_file, weights_file = folder / "config.json", folder / "model.safetensors"
    config = vllm_config(family, json.loads(config_file.read_text()))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = load_file(str(weights_file))
    left_out = sorted(name for name in tensors if not loaded_by_vllm(family, name))
    if left_out:
        kept = {name: t for name, t in tensors.items() if name not in left_out}
        save_file(kept, str(weights_file), metadata={"format": "pt"})
    return left_out
