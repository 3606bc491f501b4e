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
from the target when absent, as full-vocabulary drafts have none. A draft vocabulary ships its
`lm_head` rows, `draft_vocab_size` and `d2t` (draft_vocab.py). A sliding window adds its
`dflash_config` keys (sliding_window.py).

What differs per family (architecture, tensors, keys, what vLLM cannot build) is the family's
`VllmLayout` in models/<family>/family.py; this module applies it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from ..models.backbone import DraftModel
from ..models.family_spec import DraftFamily, VllmLayout
from .draft_vocab import refuse_draft_vocab, vocab_tensors, without_specdraft_keys
from .layer_ids import engine_layer_ids
from .options import ExportOptions
from .sliding_window import vllm_window_keys
from .source import ExportRefused

# Tensors every family's vLLM loader reads (the backbone); each family adds its own
# (`DraftFamily.vllm.tensors`, in models/<family>/family.py).
_BACKBONE = (
    r"fc\.weight",
    r"(hidden_norm|norm)\.weight",
    r"layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight",
    r"layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight",
    # The per-head sink logit (model.attention_sink_bias), a bare tensor in qwen3_dflash.
    r"layers\.\d+\.self_attn\.attention_sink_bias",
    r"layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.weight",
)


# A draft vocabulary's own head and its draft -> target offsets (draft_vocab.py).
_DRAFT_VOCAB = (r"lm_head\.weight", r"d2t")


def loaded_by_vllm(family: DraftFamily, name: str) -> bool:
    """Whether vLLM's loader of `family` reads the draft tensor `name`."""
    patterns = _BACKBONE + _DRAFT_VOCAB + vllm_layout(family, "the draft").tensors
    return any(re.fullmatch(pattern, name) for pattern in patterns)


def vllm_layout(family: DraftFamily, checkpoint: str) -> VllmLayout:
    """The family's vLLM layout; refused when vLLM has no loader for it."""
    if family.vllm is None:
        raise ExportRefused(
            f"cannot export {checkpoint} as --format vllm: vLLM has no loader for the "
            f"{family.name!r} family; use --format sglang"
        )
    return family.vllm


def check_vllm_can_build(family: DraftFamily, config: Any, checkpoint: str) -> None:
    """Refuse a draft whose heads vLLM's loader cannot build (DSpark's gated and rnn heads)."""
    reason = vllm_layout(family, checkpoint).cannot_build(config)
    if reason is not None:
        raise ExportRefused(f"cannot export {checkpoint} as --format vllm: {reason}")


def vllm_config(family: DraftFamily, config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's config.json from the draft's own (the dict `save_pretrained` wrote)."""
    layout = vllm_layout(family, "the draft")
    out = {k: v for k, v in without_specdraft_keys(config).items() if k not in layout.training_keys}
    out["architectures"] = [layout.architecture]
    # DFlash and DFlash2 slot k predicts anchor + k (the anchor is the bonus token); DSpark's
    # slot k predicts anchor + k + 1, so its anchor is the first prediction.
    sample_from_anchor = family.sample_from_anchor
    dflash_config: dict[str, Any] = {
        "block_size": int(config["block_size"]),
        "target_layer_ids": engine_layer_ids(config["target_layer_ids"]),
        "mask_token_id": int(config["mask_token_id"]),
        **layout.dflash_config_keys(config),
        **vllm_window_keys(config),
    }
    if config.get("attention_sink_bias"):
        # qwen3_dflash reads the sink flag here first (then add_swa_attention_sink_bias).
        dflash_config["attention_sink_bias"] = True
    if not sample_from_anchor:
        # The DSpark speculator subclasses DFlash's, which refuses this key when true.
        dflash_config["sample_from_anchor"] = False
    out["dflash_config"] = dflash_config
    out["sample_from_anchor"] = sample_from_anchor
    # The draft's one causality (qwen3_dflash._dflash_layer_causal); left out when only the
    # sliding layers are causal, which is what vLLM assumes of layer_types without it.
    causal = config.get("is_causal", False)
    if causal is None:
        out.pop("is_causal", None)
    else:
        out["is_causal"] = bool(causal)
    out.update(layout.top_level_keys(config))
    return out


def write_vllm(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write vLLM's config.json and the tensors it loads; return the names left out."""
    from ..models import family_of_architecture

    family = family_of_architecture(type(model).__name__)
    check_vllm_can_build(family, model.config, options.checkpoint)
    layout = vllm_layout(family, options.checkpoint)
    refuse_draft_vocab(model, "vllm", layout.no_draft_vocab, options.checkpoint)
    model.save_pretrained(str(folder), safe_serialization=True)
    config_file, weights_file = folder / "config.json", folder / "model.safetensors"
    config = vllm_config(family, json.loads(config_file.read_text()))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = load_file(str(weights_file))
    left_out = sorted(name for name in tensors if not loaded_by_vllm(family, name))
    added = vocab_tensors(model, with_t2d=False)  # t2d: vLLM skips it
    if left_out or added:
        kept = {name: t for name, t in tensors.items() if name not in left_out}
        save_file({**kept, **added}, str(weights_file), metadata={"format": "pt"})
    return left_out
