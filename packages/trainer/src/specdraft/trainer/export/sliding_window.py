"""A draft's window and causal layers in each export format (config/attention_layers.py has the
rule).

The draft's own config.json (the sglang layout, checkpoints, llama.cpp's converter input) holds
Qwen3's `use_sliding_window`, `sliding_window` and `layer_types`, and `is_causal`: false or true
when every layer agrees, null when only the sliding layers are causal (`model.causal_layers =
"sliding"` over mixed layers). What else each engine reads, from its source:

- vLLM 0.32, `qwen3_dflash._resolve_layer_attention`: `dflash_config.swa_window_size` (before
  `sliding_window`), `dflash_config.use_swa` (every layer slides) and, through
  `_dflash_layer_causal`, `is_causal` then `dflash_config.causal`; a sliding layer with neither is
  causal, so both state the draft's one causality, and neither is written when the layers differ.
- speculators 0.9.0 as vLLM converts it: the decoder keys under `transformer_layer_config`, and
  `dflash_config.causal = not sliding_window_non_causal` for every layer: a draft whose layers
  differ in causality is refused.
- llama.cpp's converter (conversion/qwen.py, `DFlashModel.set_gguf_parameters`): the window
  when `use_sliding_window` or `dflash_config.use_swa`, the pattern from `layer_types`, the
  causality from `is_causal` (one for all layers: gguf.py refuses a mixed one).
- SGLang 0.5.23 masks a sliding layer causally and one key wider in its torch-native backend,
  so `--format sglang` refuses a windowed draft (lint SD335 says so before training).
"""

from __future__ import annotations

from typing import Any

from specdraft.config.attention_layers import SLIDING_ATTENTION

# Qwen3's keys of the window, as the draft's config.json holds them.
WINDOW_KEYS = ("use_sliding_window", "sliding_window", "layer_types")


def sliding_layers(config: dict[str, Any]) -> list[bool]:
    """Which layers of a draft config.json slide (all False without a window)."""
    if not config.get("use_sliding_window") or config.get("sliding_window") is None:
        return [False] * int(config["num_hidden_layers"])
    return [kind == SLIDING_ATTENTION for kind in config.get("layer_types") or []]


def vllm_window_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The `dflash_config` keys vLLM reads for a windowed draft ({} without a window)."""
    layers = sliding_layers(config)
    if not any(layers):
        return {}
    keys: dict[str, Any] = {
        "swa_window_size": int(config["sliding_window"]),
        "use_swa": all(layers),
    }
    if config.get("is_causal", False) is not None:
        keys["causal"] = bool(config.get("is_causal", False))
    return keys


def speculators_non_causal(config: dict[str, Any], checkpoint: str) -> bool:
    """speculators' `sliding_window_non_causal` (one for every layer); refuse mixed layers."""
    causal = config.get("is_causal", False)
    if causal is None:
        from .source import ExportRefused

        raise ExportRefused(
            f'{checkpoint}: its layers differ in causality (model.causal_layers = "sliding" '
            f"over layer_types {config.get('layer_types')}) and speculators states one "
            "causality for all layers (sliding_window_non_causal); export it with --format vllm"
        )
    return not causal


def layer_window_keys(config: dict[str, Any]) -> dict[str, Any]:
    """speculators' `transformer_layer_config` keys of the window (full attention without)."""
    if not any(sliding_layers(config)):
        return {
            "use_sliding_window": False,
            "sliding_window": None,
            "layer_types": ["full_attention"] * int(config["num_hidden_layers"]),
        }
    return {key: config[key] for key in WINDOW_KEYS}


def sglang_refusal(config: Any) -> str | None:
    """Why SGLang cannot serve this draft as trained (a sliding window), or None."""
    types = getattr(config, "layer_types", None) or []
    if getattr(config, "sliding_window", None) is None or SLIDING_ATTENTION not in types:
        return None
    sliding_causal = all(
        causal
        for causal, kind in zip(config.layer_causal(), types, strict=True)
        if kind == SLIDING_ATTENTION
    )
    why = (
        "SGLang 0.5.23's sliding-window mask (torch_native_backend._make_sliding_window_mask) "
        "keeps the keys with q - window <= k <= q, one more than the q - k < window training "
        "used"
        if sliding_causal
        else "SGLang 0.5.23 masks a sliding-window layer causally (torch_native_backend."
        "_make_sliding_window_mask), hiding a block's later tokens from its earlier ones, which "
        "see them in training"
    )
    return (
        f"its layers {list(types)} slide over a {config.sliding_window}-token window, and "
        f"{why}; export it with --format vllm, speculators or gguf"
    )
