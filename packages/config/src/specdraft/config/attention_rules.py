"""Lint of the draft layers' attention (SD334-SD337): the window against the data and the
engines in `serve.engines`.

What the engines do with a sliding-window DFlash-family draft, read in their sources:
- vLLM 0.32 (`models/qwen3_dflash.py`, `_resolve_layer_attention`): the window from
  `dflash_config.swa_window_size` or `sliding_window`, per layer from `layer_types` (all layers
  under `dflash_config.use_swa`), non-causal with `is_causal = false`; mixed sliding and full
  layers raise NotImplementedError unless the V2 model runner is on (SD336).
- llama.cpp build 11434: its converter (conversion/qwen.py, `DFlashModel`, also DSpark's)
  writes the window and the per-layer pattern from `use_sliding_window`, `sliding_window` and
  `layer_types`; dflash.cpp masks keys with q - k >= n_swa (LLAMA_SWA_TYPE_STANDARD), the rule
  specdraft trains.
- SGLang 0.5.23: reads `layer_types` and `sliding_window`, but its torch-native backend's
  window mask keeps only keys at or before the query, so a block's later tokens are hidden
  from its earlier ones, unlike training (SD335).
"""

from __future__ import annotations

from .attention_layers import SLIDING_ATTENTION, draft_layer_types, is_mixed
from .finding import Problem
from .schema import Config

_WINDOW = ("model", "sliding_window")
# Engines that do not serve a sliding-window layer as specdraft trains it, and why.
_NOT_SERVED = {
    "sglang": "SGLang 0.5.23 masks a sliding-window layer causally (its torch-native backend's "
    "_make_sliding_window_mask keeps only keys at or before the query), so a block's later "
    "tokens are hidden from its earlier ones, which see them in training",
}


def attention_problems(config: Config) -> list[Problem]:
    """Findings on model.sliding_window and model.layer_types against the data and engines."""
    model = config.model
    window = model.sliding_window
    if window is None:
        return []
    problems: list[Problem] = []
    if SLIDING_ATTENTION not in draft_layer_types(model):
        problems.append(
            Problem(
                "SD337",
                _WINDOW,
                f"model.sliding_window = {window} but model.layer_types has no "
                "'sliding_attention' layer, so no layer uses it: drop it, or mark the layers "
                "that slide",
            )
        )
        return problems
    max_length = config.data.max_length
    if window >= max_length:
        problems.append(
            Problem(
                "SD334",
                _WINDOW,
                f"model.sliding_window = {window} is at least data.max_length = {max_length}: "
                "a training sample is never longer than the window, so the window cuts (almost) "
                "no key and the draft trains as full attention, while the engines cut served "
                f"contexts longer than {window} tokens; use a window below {max_length}, or drop "
                "sliding_window",
            )
        )
    for index, engine in enumerate(config.serve.engines):
        if engine in _NOT_SERVED:
            problems.append(
                Problem(
                    "SD335",
                    ("serve", "engines", index),
                    f"{_NOT_SERVED[engine]}: serve this draft with vLLM or llama.cpp, or drop "
                    "model.sliding_window",
                )
            )
    if is_mixed(model) and "vllm" in config.serve.engines:
        problems.append(
            Problem(
                "SD336",
                ("model", "layer_types"),
                "the draft mixes sliding-window and full-attention layers: vLLM 0.32 builds it "
                "only under its V2 model runner (start it with VLLM_USE_V2_MODEL_RUNNER=1)",
            )
        )
    return problems
