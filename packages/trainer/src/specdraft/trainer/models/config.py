"""HF configs of the draft families: the shared base, built from the ModelConfig and the target's.

All are Qwen3 configs (`model_type = "qwen3"`) with extra keys, like the published DFlash and
DSpark drafts, so SGLang (and vLLM) read them with a plain `AutoConfig` and pick the model class
from `architectures`. `DFlashDraftConfig` holds the keys every family shares (the nested
`dflash_config` SGLang reads first: block_size, target_layer_ids, mask_token_id); each family's
subclass, with its own keys and default `architectures`, is `models/<family>/hf_config.py`.

The draft's attention shape, norm eps and RoPE theta are the target's; the draft always uses
default RoPE (no scaling), which is what the checkpoint then declares. A sliding window
(`model.sliding_window`, `model.layer_types`) is Qwen3's own keys: `use_sliding_window`,
`sliding_window` and `layer_types`, the ones engines read; without one they keep Qwen3's
defaults, so a full-attention draft's config.json is what it was before windows existed.

Causal layers (`model.causal_layers`) are `is_causal`, the key vLLM and llama.cpp's converter
read first: false or true when every layer agrees, and null (unstated) when only the sliding
layers are causal, which is how vLLM and SGLang read a draft with `layer_types` and no
causality. `layer_causal()` resolves it per layer as vLLM 0.32's `_dflash_layer_causal` does.
"""

from __future__ import annotations

import logging
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

from specdraft.config.attention_layers import SLIDING_ATTENTION, draft_layer_types, layer_causal

logger = logging.getLogger(__name__)


@strict
class DFlashDraftConfig(Qwen3Config):
    """Shared keys of the DFlash-family drafts (the backbone)."""

    model_type = "qwen3"

    block_size: int = 16
    target_layer_ids: list[int] | None = None
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    # Draft blocks attend in both directions unless causal (null: the sliding layers are);
    # vLLM and llama.cpp read this key to pick the attention mode.
    is_causal: bool | None = False
    # A learned per-head sink logit in every layer's softmax (model.attention_sink_bias); vLLM
    # and SGLang read dflash_config.attention_sink_bias, vLLM also add_swa_attention_sink_bias.
    attention_sink_bias: bool = False
    dflash_config: dict | None = None
    # The draft vocabulary (models/draft_vocab.py): its size, the key vLLM and speculators read,
    # and its tokens as ascending target ids (specdraft's own key; the exports turn it into the
    # engines' d2t / t2d tensors). None: the target's whole vocabulary.
    draft_vocab_size: int | None = None
    draft_vocab_ids: list[int] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        self.dflash_config = self._serving_keys()
        ids, size = self.draft_vocab_ids, self.draft_vocab_size
        if ids is not None and len(ids) != size:
            raise ValueError(
                f"draft_vocab_ids holds {len(ids)} tokens but draft_vocab_size is {size}"
            )

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window in tokens (None: full attention)."""
        types = self.layer_types or ["full_attention"] * self.num_hidden_layers
        if SLIDING_ATTENTION in types and self.sliding_window is None:
            raise ValueError(
                "the draft config lists sliding_attention layers but has no sliding_window "
                "(use_sliding_window must be true, with the window in tokens)"
            )
        return tuple(self.sliding_window if kind == SLIDING_ATTENTION else None for kind in types)

    def layer_causal(self) -> tuple[bool, ...]:
        """Whether each layer sees its own block causally (vLLM's resolution of is_causal)."""
        types = self.layer_types or ["full_attention"] * self.num_hidden_layers
        if self.is_causal is not None:
            return (bool(self.is_causal),) * len(types)
        return tuple(kind == SLIDING_ATTENTION for kind in types)

    def to_dict(self) -> dict[str, Any]:
        """The config as a dict; without a draft vocabulary its two keys are left out, so a
        full-vocabulary draft's config.json is what it was before they existed."""
        out = super().to_dict()
        if not self.attention_sink_bias:
            out.pop("attention_sink_bias", None)
        if self.draft_vocab_size is None and self.draft_vocab_ids is None:
            out.pop("draft_vocab_size", None)
            out.pop("draft_vocab_ids", None)
        return out

    def _serving_keys(self) -> dict:
        """The nested `dflash_config` that SGLang reads first."""
        keys = {
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids or []),
            "mask_token_id": self.mask_token_id,
        }
        if self.attention_sink_bias:
            keys["attention_sink_bias"] = True
        return keys


def target_text_config(target_config: Any) -> Any:
    """The text part of a target config (itself for plain causal LMs)."""
    get_text_config = getattr(target_config, "get_text_config", None)
    return get_text_config() if callable(get_text_config) else target_config


def rope_theta_of(config: Any) -> float:
    """RoPE theta of a HF config (transformers 5 `rope_parameters` or the older `rope_theta`)."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in (None, "default"):
        logger.warning(
            "target uses rope_type %r; the draft trains with default RoPE at the same theta",
            rope_type,
        )
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the target config has no rope_theta (rope_parameters.rope_theta)")
    return float(theta)


def backbone_kwargs(model_cfg: Any, target_config: Any) -> dict:
    """The HF config keys every family shares, from the specdraft ModelConfig and the target."""
    text = target_text_config(target_config)
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    intermediate = model_cfg.draft_intermediate_size or int(text.intermediate_size)
    return {
        "vocab_size": int(text.vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(intermediate),
        "num_hidden_layers": int(model_cfg.num_draft_layers),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(text, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(text, "head_dim", None) or hidden // heads),
        "rms_norm_eps": float(text.rms_norm_eps),
        "max_position_embeddings": int(getattr(text, "max_position_embeddings", 32768)),
        "rope_parameters": {"rope_theta": rope_theta_of(text), "rope_type": "default"},
        "tie_word_embeddings": False,
        "dtype": model_cfg.dtype,
        "block_size": int(model_cfg.block_size),
        "target_layer_ids": [int(i) for i in model_cfg.target_layer_ids],
        "num_target_layers": int(text.num_hidden_layers),
        "mask_token_id": int(model_cfg.mask_token_id),
        "draft_vocab_size": model_cfg.draft_vocab_size,
        **sliding_kwargs(model_cfg),
        "is_causal": is_causal_key(model_cfg),
        "attention_sink_bias": bool(getattr(model_cfg, "attention_sink_bias", False)),
    }


def is_causal_key(model_cfg: Any) -> bool | None:
    """The draft config's `is_causal`: one value when every layer agrees, None (the sliding
    layers are causal) when they differ."""
    causal = set(layer_causal(model_cfg))
    return causal.pop() if len(causal) == 1 else None


def sliding_kwargs(model_cfg: Any) -> dict[str, Any]:
    """Qwen3's window keys for `model.sliding_window` / `model.layer_types` (none without)."""
    window = getattr(model_cfg, "sliding_window", None)
    if window is None:
        return {}
    return {
        "use_sliding_window": True,
        "sliding_window": int(window),
        "layer_types": list(draft_layer_types(model_cfg)),
    }


def check_backbone(backbone: dict[str, Any], model_cfg: Any) -> None:
    """Errors every family would otherwise hit as a shape mismatch deep inside the model."""
    vocab = backbone["vocab_size"]
    draft_vocab = backbone.get("draft_vocab_size")
    if draft_vocab is not None and draft_vocab > vocab:
        raise ValueError(
            f"model.draft_vocab_size = {draft_vocab} is larger than the target vocabulary "
            f"({vocab} tokens) of {model_cfg.target}; use at most {vocab}, or drop it"
        )
    if backbone["mask_token_id"] >= vocab:
        raise ValueError(
            f"model.mask_token_id = {backbone['mask_token_id']} is outside the target vocabulary "
            f"({vocab} tokens) of {model_cfg.target}; pick a reserved token below {vocab}"
        )
