"""Lint of the draft layers' attention (SD334-SD339): the window and the causal layers against
the data and the engines in `serve.engines`.

What the engines do with a sliding-window DFlash-family draft, read in their sources:
- vLLM 0.32 (`models/qwen3_dflash.py`, `_resolve_layer_attention`): the window from
  `dflash_config.swa_window_size` or `sliding_window`, per layer from `layer_types` (all layers
  under `dflash_config.use_swa`), non-causal with `is_causal = false`; mixed sliding and full
  layers raise NotImplementedError unless the V2 model runner is on (SD336).
- llama.cpp build 11434: its converter (conversion/qwen.py, `DFlashModel`, also DSpark's)
  writes the window and the per-layer pattern from `use_sliding_window`, `sliding_window` and
  `layer_types`; dflash.cpp masks keys with q - k >= n_swa (LLAMA_SWA_TYPE_STANDARD), the rule
  specdraft trains.
- SGLang 0.5.23: reads `layer_types`, `sliding_window` and `is_causal` (full layers), but its
  torch-native backend's window mask keeps the keys with q - window <= k <= q: causal whatever
  the draft says, and one key wider than the window vLLM, llama.cpp and training use, so it does
  not serve a windowed draft as trained (SD335), causal or not.
- Causality: vLLM resolves it per layer (`is_causal`, `dflash_config.causal`, else the sliding
  layers); llama.cpp's converter writes one `attention.causal` for the whole draft, so a draft
  whose layers differ in causality is not served there (SD339).
"""

from __future__ import annotations

from .attention_layers import SLIDING_ATTENTION, draft_layer_types, is_mixed, layer_causal
from .finding import Problem
from .schema import Config
from .serve import LLAMA_CPP

_WINDOW = ("model", "sliding_window")
# Engines that do not serve a sliding-window layer as specdraft trains it, and why.
_NOT_SERVED = {
    "sglang": "SGLang 0.5.23 masks a sliding-window layer causally (its torch-native backend's "
    "_make_sliding_window_mask keeps only keys at or before the query), so a block's later "
    "tokens are hidden from its earlier ones, which see them in training",
}
# The same engine when the draft's sliding layers are causal (model.causal_layers).
_NOT_SERVED_CAUSAL = {
    "sglang": "SGLang 0.5.23's window mask keeps the keys with q - window <= k <= q "
    "(torch_native_backend._make_sliding_window_mask), one key more than the q - k < window "
    "that training, vLLM and llama.cpp use",
}
_CAUSAL = ("model", "causal_layers")


def attention_problems(config: Config) -> list[Problem]:
    """Findings on model.sliding_window, layer_types and causal_layers against the data and
    engines."""
    model = config.model
    problems = causal_problems(config)
    window = model.sliding_window
    if window is None:
        return problems
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
    sliding_causal = all(
        causal
        for causal, kind in zip(layer_causal(model), draft_layer_types(model), strict=True)
        if kind == SLIDING_ATTENTION
    )
    reasons = _NOT_SERVED_CAUSAL if sliding_causal else _NOT_SERVED
    for index, engine in enumerate(config.serve.engines):
        if engine in reasons:
            problems.append(
                Problem(
                    "SD335",
                    ("serve", "engines", index),
                    f"{reasons[engine]}: serve this draft with vLLM or llama.cpp, or drop "
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


def causal_problems(config: Config) -> list[Problem]:
    """model.causal_layers that changes nothing (SD338), or that llama.cpp cannot serve
    (SD339)."""
    model = config.model
    causal = layer_causal(model)
    problems: list[Problem] = []
    if model.causal_layers == "sliding" and not any(causal):
        problems.append(
            Problem(
                "SD338",
                _CAUSAL,
                'model.causal_layers = "sliding" but no draft layer slides (model.sliding_window '
                "is unset or layer_types lists none), so no layer is causal: drop it, or use "
                '"all" for causal blocks in every layer',
            )
        )
    if len(set(causal)) > 1 and LLAMA_CPP in config.serve.engines:
        index = config.serve.engines.index(LLAMA_CPP)
        problems.append(
            Problem(
                "SD339",
                ("serve", "engines", index),
                f"the draft's layers differ in causality (model.causal_layers = "
                f'"{model.causal_layers}" over layer_types {list(draft_layer_types(model))}), '
                "and llama.cpp build 11434 reads one attention.causal for the whole draft: "
                'use "all" or "none", make every layer slide, or serve it with vLLM',
            )
        )
    return problems
