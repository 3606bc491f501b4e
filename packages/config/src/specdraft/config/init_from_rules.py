"""Lint of `model.init_from`: the draft folder against the config and the target (SD330-SD333).

The folder is read without torch (draft_folder.py). Each `[model]` field the folder disagrees
with is one SD332 at that field, naming the folder's value; each setting specdraft cannot
train is one SD333 at `model.init_from`, naming the folder's key. `specdraft train` refuses the
same findings before it loads a weight (`init_from_refusals`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .attention_layers import LAYER_TYPES, causal_layers_for, draft_layer_types, layer_causal
from .draft_folder import DraftFolder, DraftFolderError, read_draft_folder
from .families import family_rules
from .finding import Problem, key_text
from .positions import KeyPath
from .schema import Config, ModelConfig
from .target_info import TargetInfo

_KEY = ("model", "init_from")
# The target's decoder facts the draft copies: (TargetInfo field, DraftFolder shape key).
_TARGET_SHAPE = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "num_key_value_heads"),
    ("head_dim", "head_dim"),
)


def init_from_problems(config: Config, info: TargetInfo | None) -> list[Problem]:
    """Every finding on model.init_from; a folder missing here is a note (a cluster path)."""
    path = config.model.init_from
    if path is None:
        return []
    if not Path(path).is_dir():
        return [
            Problem(
                "SD330",
                _KEY,
                f"model.init_from = {path!r} is not a folder on this machine, so it was not "
                "checked against the config; `specdraft train` refuses a missing folder",
            )
        ]
    try:
        folder = read_draft_folder(path)
    except DraftFolderError as exc:
        return [Problem("SD331", _KEY, str(exc))]
    return folder_problems(config.model, folder, info)


def folder_problems(
    model: ModelConfig, folder: DraftFolder, info: TargetInfo | None
) -> list[Problem]:
    """What specdraft cannot train in `folder`, and where the config (and target) differ."""
    problems = [
        Problem(
            "SD333",
            _KEY,
            f"{folder.described} has {key} = {value!r}, which specdraft cannot train: its "
            "draft layers are full or sliding-window attention, without attention biases or "
            "sinks other than the per-head attention_sink_bias; start from fresh weights (drop "
            "model.init_from)",
        )
        for key, value in folder.untrainable
    ]
    for key, current, stated in compared_fields(model, folder, info):
        if current == stated:
            continue
        field = key_text(key)
        if key == ("model", "target"):
            problems.append(Problem("SD332", key, _target_message(folder, current, stated)))
            continue
        problems.append(
            Problem(
                "SD332",
                key,
                f"{field} = {_toml(current)} but {folder.described} has {_toml(stated)}: "
                f"{_fix(key[-1], stated)} to start from it, or drop model.init_from",
            )
        )
    return problems


def compared_fields(
    model: ModelConfig, folder: DraftFolder, info: TargetInfo | None
) -> list[tuple[KeyPath, Any, Any]]:
    """(key path, the config's value, the folder's value) of every field the folder states."""
    rows: list[tuple[KeyPath, Any, Any]] = [
        (("model", "algorithm"), model.algorithm, folder.algorithm),
        (("model", "block_size"), model.block_size, folder.block_size),
        (("model", "num_draft_layers"), model.num_draft_layers, folder.num_layers),
        (("model", "target_layer_ids"), list(model.target_layer_ids), folder.target_layer_ids),
        (("model", "mask_token_id"), model.mask_token_id, folder.mask_token_id),
        (("model", "draft_vocab_size"), model.draft_vocab_size, folder.draft_vocab_size),
        (("model", "sliding_window"), model.sliding_window, folder.sliding_window),
        (
            ("model", "attention_sink_bias"),
            model.attention_sink_bias,
            folder.attention_sink_bias,
        ),
    ]
    # Each layer's attention type, as both sides resolve it (a window and no list: all slide).
    # (Only layer types specdraft trains: another kind is already refused, SD333.)
    if (
        folder.layer_types is not None
        and set(folder.layer_types) <= set(LAYER_TYPES)
        and model.num_draft_layers == folder.num_layers
    ):
        types = list(draft_layer_types(model))
        rows.append((("model", "layer_types"), types, list(folder.layer_types)))
        if folder.causal is not None and tuple(types) == folder.layer_types:
            rows.append(_causal_row(model, folder))
    # The draft's MLP width: the config's, else the target's.
    width = model.draft_intermediate_size or (info.intermediate_size if info else None)
    if width is not None:
        rows.append(
            (("model", "draft_intermediate_size"), width, folder.shape["intermediate_size"])
        )
    options = family_rules(model.algorithm).options_of(model)
    if model.algorithm == folder.algorithm and options is not None:
        for name, stated in folder.options.items():
            rows.append((("model", model.algorithm, name), getattr(options, name), stated))
    if info is not None:
        for fact, shape_key in _TARGET_SHAPE:
            rows.append(
                (("model", "target"), (fact, getattr(info, fact)), (fact, folder.shape[shape_key]))
            )
        rows.append((("model", "target"), ("rope_theta", info.rope_theta), _theta(folder)))
    return [row for row in rows if _stated(*row)]


def _causal_row(model: ModelConfig, folder: DraftFolder) -> tuple[KeyPath, Any, Any]:
    """model.causal_layers against the folder's per-layer causality (equal when both resolve
    to the same layers: 'sliding' over full layers is 'none')."""
    assert folder.causal is not None and folder.layer_types is not None
    if layer_causal(model) == folder.causal:
        return (("model", "causal_layers"), model.causal_layers, model.causal_layers)
    stated = causal_layers_for(folder.causal, folder.layer_types)
    return (("model", "causal_layers"), model.causal_layers, stated)


# Fields whose absence in a folder states something: the whole vocabulary, full attention.
_ABSENT_STATES = (("model", "draft_vocab_size"), ("model", "sliding_window"))


def _stated(key: KeyPath, current: Any, stated: Any) -> bool:
    """Whether the folder states the field (a target fact, a (name, value) pair, on both
    sides); an absent draft_vocab_size states the whole vocabulary, an absent window full
    attention."""
    if isinstance(stated, tuple):
        return stated[1] is not None and current[1] is not None
    return stated is not None or key in _ABSENT_STATES


def _theta(folder: DraftFolder) -> tuple[str, float | None]:
    return ("rope_theta", folder.rope_theta)


def _target_message(folder: DraftFolder, current: Any, stated: Any) -> str:
    """A draft made for another target: which fact differs."""
    fact = current[0]
    return (
        f"the target has {fact} = {current[1]} but {folder.described} has {stated[1]}: it was "
        "made for another target; start from a draft of this target, or drop model.init_from"
    )


def init_from_refusals(
    model: ModelConfig, folder: DraftFolder, info: TargetInfo | None
) -> list[str]:
    """The errors `specdraft train` refuses model.init_from with (lint's messages, keyed)."""
    return [
        f"{key_text(problem.key)}: {problem.message}"
        for problem in folder_problems(model, folder, info)
    ]


def _fix(name: Any, stated: Any) -> str:
    """How to make the config agree: set the folder's value, or drop the field."""
    return f"drop {name}" if stated is None else f"set {name} = {_toml(stated)}"


def _toml(value: Any) -> str:
    """A value as TOML spells it (lists, strings, booleans, none)."""
    if value is None:
        return "none (unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)
