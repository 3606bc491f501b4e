"""A published or exported DFlash-family draft folder, read without torch (`model.init_from`).

`specdraft export` writes three folder layouts, and published drafts follow the first:

- sglang (also specdraft's checkpoints and the z-lab drafts): the draft's own HF config, Qwen3
  keys at the top level, `dflash_config` holding block_size, target_layer_ids, mask_token_id;
- vllm: the same config plus a top-level `sample_from_anchor` and `is_causal`, without the
  training-only keys; a draft vocabulary travels as a `d2t` tensor;
- speculators: `speculators_model_type`, the decoder shape under `transformer_layer_config`,
  target layers as `aux_hidden_state_layer_ids` (specdraft's k + 1, export/layer_ids.py).

`read_draft_folder` turns any of them into the fields specdraft trains with (`DraftFolder`), and
lists what specdraft cannot train (attention biases, sinks other than the per-head
`attention_sink_bias` the engines read, layer types other than full and sliding-window
attention) by the folder's own key, so that nothing is dropped in silence.

Sliding-window layers are read as vLLM 0.32 resolves them (`qwen3_dflash._resolve_layer_attention`):
the window from `dflash_config.swa_window_size`, else `sliding_window`; the sliding layers from
`layer_types`, or every layer under `dflash_config.use_swa`. Each layer's causality is read as
`_dflash_layer_causal` reads it: `is_causal`, else `dflash_config.causal`, for every layer; a
folder that states neither has its sliding layers causal and its full ones not (speculators:
`sliding_window_non_causal` true or false for every layer, its sliding layers causal when
absent). specdraft trains each of those (`model.causal_layers`) unless the causality fits none
of its three settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .attention_layers import FULL_ATTENTION, LAYER_TYPES, SLIDING_ATTENTION
from .families import FAMILY_RULES

FORMATS = ("sglang", "vllm", "speculators")
WEIGHTS_SUFFIX = ".safetensors"
# The draft architecture fields, in specdraft's names (the sglang layout's keys).
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


class DraftFolderError(ValueError):
    """The folder is not a draft folder specdraft can read (missing, unknown format)."""


@dataclass(frozen=True)
class DraftFolder:
    """What a draft folder declares, in specdraft's terms (None: the folder does not say)."""

    path: str
    format: str
    algorithm: str
    block_size: int | None
    num_layers: int | None
    # specdraft's convention: k is the output of target decoder layer k.
    target_layer_ids: list[int] | None
    mask_token_id: int | None
    # None: the draft proposes from the target's whole vocabulary.
    draft_vocab_size: int | None
    shape: dict[str, int | None]
    rope_theta: float | None
    # The family's options under their `[model.<family>]` field names.
    options: dict[str, Any]
    # (folder key, its value) of each setting specdraft cannot train.
    untrainable: tuple[tuple[str, Any], ...] = ()
    # The sliding window (None: every layer is full attention) and each layer's type.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    # Whether each layer sees its own block causally (None: the layer count is unknown).
    causal: tuple[bool, ...] | None = None
    # A learned per-head sink logit in every layer (vLLM's and SGLang's attention_sink_bias).
    attention_sink_bias: bool = False
    weight_files: tuple[str, ...] = ()

    @property
    def described(self) -> str:
        """How messages name the folder: 'the dflash2 draft in PATH (vllm format)'."""
        return f"the {self.algorithm} draft in {self.path} ({self.format} format)"


def init_from_missing(path: str | Path) -> str:
    """The refusal of a model.init_from that is not a folder, with the fix."""
    return (
        f"model.init_from = {str(path)!r} is not a folder: give the folder of a draft exported "
        "by `specdraft export --format sglang|vllm|speculators` (or a published DFlash-family "
        "draft), or drop model.init_from to start from fresh weights"
    )


def read_draft_folder(path: str | Path) -> DraftFolder:
    """Read a draft folder's config.json; raise DraftFolderError naming what is wrong."""
    root = Path(path)
    if not root.is_dir():
        raise DraftFolderError(init_from_missing(path))
    config_file = root / "config.json"
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftFolderError(
            f"model.init_from = {str(path)!r} has no readable config.json ({exc}); it must be a "
            "draft folder written by `specdraft export --format sglang|vllm|speculators`"
        ) from None
    if not isinstance(raw, dict):
        raise DraftFolderError(f"{config_file} is not a JSON object")
    weights = tuple(sorted(p.name for p in root.glob(f"*{WEIGHTS_SUFFIX}") if p.is_file()))
    if not weights:
        raise DraftFolderError(
            f"model.init_from = {str(path)!r} holds no {WEIGHTS_SUFFIX} weights; export the "
            "draft with `specdraft export` (safetensors), or point at the folder that has them"
        )
    if "speculators_model_type" in raw:
        return _speculators(root, raw, weights)
    return _hf_layout(root, raw, weights)


def _family_by(attribute: str, value: Any, root: Path) -> str:
    """The family whose FamilyRules `attribute` is `value`, or a DraftFolderError."""
    for rules in FAMILY_RULES.values():
        if value and getattr(rules, attribute) == value:
            return rules.name
    known = sorted(str(getattr(r, attribute)) for r in FAMILY_RULES.values())
    raise DraftFolderError(
        f"model.init_from = {str(root)!r}: unknown draft format ({attribute.replace('_', ' ')} "
        f"{value!r}; specdraft reads {', '.join(known)}, as written by `specdraft export "
        "--format sglang|vllm|speculators`)"
    )


def _hf_layout(root: Path, raw: dict[str, Any], weights: tuple[str, ...]) -> DraftFolder:
    """The sglang and vllm layouts: the draft's HF config with `dflash_config`."""
    architectures = raw.get("architectures") or [None]
    algorithm = _family_by("architecture", architectures[0], root)
    found = raw.get("dflash_config")
    nested: dict[str, Any] = found if isinstance(found, dict) else {}

    def pick(key: str) -> Any:
        return nested[key] if nested.get(key) is not None else raw.get(key)

    fmt = "vllm" if "sample_from_anchor" in raw else "sglang"
    untrainable = _untrainable(raw, "")
    num_layers = _int(raw.get("num_hidden_layers"))
    window, types = _sliding(raw, nested, num_layers)
    stated = raw.get("is_causal")
    if stated is None:
        stated = nested.get("causal")
    ids = pick("target_layer_ids")
    return DraftFolder(
        path=str(root),
        format=fmt,
        algorithm=algorithm,
        block_size=_int(pick("block_size")),
        num_layers=num_layers,
        target_layer_ids=None if ids is None else [int(k) for k in ids],
        mask_token_id=_int(pick("mask_token_id")),
        draft_vocab_size=_draft_vocab(raw),
        shape=_shape(raw),
        rope_theta=_rope_theta(raw),
        options=_options(algorithm, raw, nested),
        untrainable=tuple(untrainable),
        sliding_window=window,
        layer_types=types,
        causal=_causal(types, stated),
        attention_sink_bias=_sink(raw, nested),
        weight_files=weights,
    )


def _speculators(root: Path, raw: dict[str, Any], weights: tuple[str, ...]) -> DraftFolder:
    """speculators' layout: the decoder under `transformer_layer_config`, aux layer ids."""
    algorithm = _family_by("speculators_type", raw.get("speculators_model_type"), root)
    layers = raw.get("transformer_layer_config")
    layers = layers if isinstance(layers, dict) else {}
    untrainable = _untrainable(raw, "") + _untrainable(layers, "transformer_layer_config.")
    num_layers = _int(layers.get("num_hidden_layers"))
    window, types = _sliding(layers, {}, num_layers)
    # vLLM turns `sliding_window_non_causal` into dflash_config.causal = not it (every layer).
    non_causal = raw.get("sliding_window_non_causal")
    stated = None if non_causal is None else not bool(non_causal)
    aux = raw.get("aux_hidden_state_layer_ids")
    draft_vocab = _int(raw.get("draft_vocab_size"))
    vocab = _int(layers.get("vocab_size"))
    return DraftFolder(
        path=str(root),
        format="speculators",
        algorithm=algorithm,
        block_size=_int(raw.get("block_size")),
        num_layers=num_layers,
        target_layer_ids=None if aux is None else [int(k) - 1 for k in aux],
        mask_token_id=_int(raw.get("mask_token_id")),
        draft_vocab_size=None if draft_vocab is None or draft_vocab == vocab else draft_vocab,
        shape=_shape(layers),
        rope_theta=_rope_theta(layers),
        options=_options(algorithm, raw, {}),
        untrainable=tuple(untrainable),
        sliding_window=window,
        layer_types=types,
        causal=_causal(types, stated),
        weight_files=weights,
    )


# The keys of the per-head sink logit specdraft trains (vLLM 0.32 reads the nested one first,
# then the top-level one; SGLang the nested one).
SINK_KEYS = ("attention_sink_bias", "add_swa_attention_sink_bias")


def _sink(raw: Mapping[str, Any], nested: Mapping[str, Any]) -> bool:
    """Whether the folder's layers carry the per-head sink logit."""
    stated = nested.get("attention_sink_bias")
    if stated is None:
        stated = raw.get("add_swa_attention_sink_bias", raw.get("attention_sink_bias"))
    return bool(stated)


def _untrainable(config: Mapping[str, Any], prefix: str) -> list[tuple[str, Any]]:
    """The keys of one config level that ask for attention specdraft cannot train."""
    found: list[tuple[str, Any]] = []
    # A `use_swa` outside `dflash_config` is read by no engine specdraft knows of (vLLM and
    # llama.cpp's converter read dflash_config.use_swa): which layers slide is unclear.
    for key in ("use_swa", "attention_bias"):
        if config.get(key):
            found.append((prefix + key, config[key]))
    layer_types = config.get("layer_types") or []
    for index, kind in enumerate(layer_types):
        if kind not in LAYER_TYPES:
            found.append((f"{prefix}layer_types[{index}]", kind))
    for key, value in config.items():
        # Attention sinks go by several names (attention_sink, num_sink_tokens, sink_size);
        # the per-head sink logit is trained (SINK_KEYS).
        if key in SINK_KEYS:
            continue
        if "sink" in key.lower() and value not in (None, False, 0, [], {}):
            found.append((prefix + key, value))
    return found


def _sliding(
    config: Mapping[str, Any], nested: Mapping[str, Any], num_layers: int | None
) -> tuple[int | None, tuple[str, ...] | None]:
    """The folder's window and per-layer types, resolved as vLLM 0.32 does; (None, types)
    when no layer slides."""
    listed = config.get("layer_types")
    types = tuple(listed) if isinstance(listed, list) else None
    any_sliding = types is not None and SLIDING_ATTENTION in types
    if nested.get("use_swa") and not any_sliding and num_layers is not None:
        types, any_sliding = (SLIDING_ATTENTION,) * num_layers, True
    if types is None and num_layers is not None:
        types = (FULL_ATTENTION,) * num_layers
    if not any_sliding:
        return None, types
    window = nested.get("swa_window_size") or config.get("sliding_window")
    return _int(window), types


def _causal(types: tuple[str, ...] | None, stated: Any) -> tuple[bool, ...] | None:
    """Each layer's causality: the folder's one flag for all, else its sliding layers."""
    if types is None:
        return None
    if stated is not None:
        return (bool(stated),) * len(types)
    return tuple(kind == SLIDING_ATTENTION for kind in types)


def _shape(config: Mapping[str, Any]) -> dict[str, int | None]:
    """The decoder's widths and attention shape (head_dim defaults as in Qwen3)."""
    shape = {key: _int(config.get(key)) for key in SHAPE_KEYS}
    heads, hidden = shape["num_attention_heads"], shape["hidden_size"]
    if shape["num_key_value_heads"] is None:
        shape["num_key_value_heads"] = heads
    if shape["head_dim"] is None and heads and hidden:
        shape["head_dim"] = hidden // heads
    return shape


def _draft_vocab(raw: Mapping[str, Any]) -> int | None:
    """The draft vocabulary's size, None when it is the whole target vocabulary."""
    size = _int(raw.get("draft_vocab_size"))
    return None if size is None or size == _int(raw.get("vocab_size")) else size


def _rope_theta(config: Mapping[str, Any]) -> float | None:
    """RoPE theta from transformers 5's `rope_parameters` or the older `rope_theta`."""
    params = config.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = config.get("rope_theta") if theta is None else theta
    return None if theta is None else float(theta)


def _options(algorithm: str, raw: Mapping[str, Any], nested: Mapping[str, Any]) -> dict[str, Any]:
    """The family's options the folder states, by their `[model.<family>]` field names."""
    options = {}
    for key, name in FAMILY_RULES[algorithm].folder_keys:
        value = nested.get(key, raw.get(key))
        if value is not None:
            options[name] = value
    return options


def _int(value: Any) -> int | None:
    return None if value is None or isinstance(value, bool) else int(value)
