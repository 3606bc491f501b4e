"""The draft layers' attention: full or sliding-window, per layer (`model.sliding_window`,
`model.layer_types`), and the hard rules on them.

The names are the HF / engine config keys: `sliding_window` (tokens, the current one included)
and `layer_types` entries "full_attention" / "sliding_attention", which vLLM 0.32
(`qwen3_dflash._resolve_layer_attention`), SGLang and llama.cpp's converter read from a draft's
config.json. With `sliding_window` set and no `layer_types`, every layer slides (vLLM's
`dflash_config.use_swa`).

The window is a rule of the mask, not of the shapes: a draft query at position p (anchor + slot
k) sees a context key at position j only when p - j < sliding_window, as vLLM's FlashAttention
window (sliding_window - 1 to the left) and llama.cpp's standard SWA mask cut it; every key of
its own block stays visible in both directions. That holds because the window must hold a whole
block (`sliding_window >= block_size`): ModelOpt's DFlash training enforces the same, and vLLM
makes a non-causal window symmetric, so a shorter window would cut keys inside the block that
one engine sees and another does not.

Causal layers (`model.causal_layers`) cut one more thing: in a causal layer a draft token sees
only the tokens of its own block at or before it (and the context as above), as vLLM's and
llama.cpp's causal DFlash attention does. "none" is DFlash's bidirectional block; "all" makes
every layer causal (the engines' `is_causal = true`); "sliding" makes exactly the sliding-window
layers causal, which is what vLLM 0.32 (`_dflash_layer_causal`) and SGLang assume of a draft
with `layer_types` that states no causality (z-lab's Gemma-4 drafts are trained so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from .section import rule

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
CAUSAL_LAYERS = ("none", "sliding", "all")

if TYPE_CHECKING:
    LayerType = str
    CausalLayers = str
else:
    LayerType = Literal[LAYER_TYPES]
    CausalLayers = Literal[CAUSAL_LAYERS]

# The schema rule types raised here (each has its code in codes.py).
ATTENTION_RULE_TYPES = ("layer_types_length", "window_below_block", "sliding_without_window")


def draft_layer_types(model: Any) -> tuple[str, ...]:
    """Each draft layer's attention type ('full_attention' / 'sliding_attention')."""
    if model.layer_types is not None:
        return tuple(model.layer_types)
    kind = SLIDING_ATTENTION if model.sliding_window is not None else FULL_ATTENTION
    count: int = model.num_draft_layers
    return (kind,) * count


def layer_windows(model: Any) -> tuple[int | None, ...]:
    """Each draft layer's window in tokens (None: full attention)."""
    return tuple(
        model.sliding_window if kind == SLIDING_ATTENTION else None
        for kind in draft_layer_types(model)
    )


def layer_causal(model: Any) -> tuple[bool, ...]:
    """Whether each draft layer sees its own block causally (`model.causal_layers`)."""
    mode = getattr(model, "causal_layers", "none")
    types = draft_layer_types(model)
    if mode == "all":
        return (True,) * len(types)
    if mode == "sliding":
        return tuple(kind == SLIDING_ATTENTION for kind in types)
    return (False,) * len(types)


def causal_layers_for(causal: tuple[bool, ...], types: tuple[str, ...]) -> str | None:
    """The `model.causal_layers` value that gives this per-layer causality (None: none does)."""
    for mode in CAUSAL_LAYERS:
        resolved = {
            "none": (False,) * len(types),
            "all": (True,) * len(types),
            "sliding": tuple(kind == SLIDING_ATTENTION for kind in types),
        }[mode]
        if resolved == tuple(causal):
            return mode
    return None


def is_mixed(model: Any) -> bool:
    """Whether the draft has both sliding-window and full-attention layers."""
    return len(set(draft_layer_types(model))) > 1


def attention_layer_rules(model: Any) -> None:
    """The hard rules on `[model]`'s sliding_window and layer_types (raise a rule error)."""
    types, window = model.layer_types, model.sliding_window
    if types is not None and len(types) != model.num_draft_layers:
        raise rule(
            "layer_types_length",
            f"model.layer_types lists {len(types)} layer types but the draft has "
            f"num_draft_layers = {model.num_draft_layers}: give one type per draft layer",
            key="model.layer_types",
        )
    if types is not None and window is None and SLIDING_ATTENTION in types:
        raise rule(
            "sliding_without_window",
            f"model.layer_types[{types.index(SLIDING_ATTENTION)}] is 'sliding_attention' but "
            "model.sliding_window is unset: set the window (tokens), or make every layer "
            "'full_attention'",
            key="model.layer_types",
            index=types.index(SLIDING_ATTENTION),
        )
    if window is not None and window < model.block_size:
        raise rule(
            "window_below_block",
            f"model.sliding_window = {window} is smaller than model.block_size = "
            f"{model.block_size}: the window must hold a whole draft block, whose tokens see "
            "each other in both directions (engines disagree on a window that cuts a block)",
            key="model.sliding_window",
        )
