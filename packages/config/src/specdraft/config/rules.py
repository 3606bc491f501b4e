"""Soft findings on a valid config: notes and warnings, and the checks that need the target.

Hard rules that need only the config live in `schema.py` as validators (no invalid `Config` can
exist). The rules here either do not make a config unusable (a note that max_length is appended,
a warning that compile with dynamic shapes recompiles) or need the target model's files, which
are read here without torch when the target folder is readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .attention_rules import attention_problems
from .draft_vocab_rules import draft_vocab_problems, draft_vocab_target_problems
from .families import family_rules, options_tables_ignored
from .finding import Problem
from .init_from_rules import init_from_problems
from .label_rules import label_problems, label_target_problems
from .sampler_mode import sampler_mode
from .schema import Config
from .shape_policy import ShapePolicy
from .stores import settings_tables_ignored
from .target_info import (
    TargetInfo,
    TargetUnreadable,
    read_target_info,
    suggest_target_layer_ids,
)
from .tracking import tracking_problems

_BUCKETS = ("training", "static_shape_buckets")


def check_config(
    config: Config, document: Mapping[str, Any], *, target: str | None = None
) -> list[Problem]:
    """Every soft finding of a valid config; `target` overrides model.target for target checks."""
    problems = shape_problems(config) + unused_table_problems(config, document)
    problems += tracking_problems(config) + draft_vocab_problems(config)
    problems += label_problems(config) + attention_problems(config)
    problems += family_rules(config.model.algorithm).config_checks(config)
    info, unreadable = load_target(config, target)
    if unreadable is not None:
        problems.append(unreadable)
    if info is not None:
        problems += target_problems(config, info)
    return problems + init_from_problems(config, info)


def shape_problems(config: Config) -> list[Problem]:
    """Notes and warnings about shape buckets, static shapes, compile and fp8."""
    training, problems = config.training, []
    shapes = ShapePolicy.from_config(config)  # the notes say what the run will use
    if shapes.lengths_appended:
        problems.append(
            Problem(
                "SD210",
                _BUCKETS,
                f"data.max_length ({config.data.max_length}) is not the last shape bucket, so it "
                f"is appended: effective buckets are {list(shapes.lengths)}",
            )
        )
    if training.keep_every_n_steps and training.keep_last_checkpoints is None:
        problems.append(
            Problem(
                "SD223",
                ("training", "keep_every_n_steps"),
                "training.keep_every_n_steps has no effect without "
                "training.keep_last_checkpoints: every checkpoint is kept; set "
                "keep_last_checkpoints or drop keep_every_n_steps",
            )
        )
    most = config.data.max_length - 1  # an anchor needs its next token in the sample
    if training.num_anchors > most:
        problems.append(
            Problem(
                "SD224",
                ("training", "num_anchors"),
                f"training.num_anchors ({training.num_anchors}) is above data.max_length - 1 "
                f"({most}), the most anchors a sample can have: the extra anchor blocks are "
                f"padding computed every step; set num_anchors <= {most}",
            )
        )
    if shapes.anchors_appended:
        problems.append(
            Problem(
                "SD217",
                ("training", "static_anchor_buckets"),
                f"training.num_anchors ({training.num_anchors}) is not the last anchor bucket, "
                f"so it is appended: effective anchor buckets are {list(shapes.anchor_widths)}",
            )
        )
    if training.fp8_linear and not training.static_shapes:
        problems.append(
            Problem(
                "SD211",
                ("training", "fp8_linear"),
                "fp8_linear without static_shapes: float8 matmuls need token counts that are "
                "multiples of 16 but will see ragged lengths; set training.static_shapes = true",
            )
        )
    if training.compile_blocks and not training.static_shapes:
        problems.append(
            Problem(
                "SD212",
                ("training", "compile_blocks"),
                "compile_blocks with dynamic shapes recompiles each block for every new sequence "
                "length; set training.static_shapes = true (and static_shape_buckets)",
            )
        )
    problems += anchor_grouping_problems(config)
    if sampler_mode(config) == "packed":
        for name in ("length_grouped", "anchor_grouped", "bucket_synchronized"):
            if getattr(config.data, name):
                problems.append(
                    Problem(
                        "SD219",
                        ("data", name),
                        f"data.{name} is ignored with training.packing: packed plans shuffle "
                        f"windows of conversations into full rows (first-fit-decreasing) and the "
                        f"last, partly filled rows pad to a shape bucket on their own",
                    )
                )
    if training.fp8_linear:
        problems.append(
            Problem(
                "SD316",
                ("training", "fp8_linear"),
                "fp8_linear needs CUDA GPUs with float8 support (torchao Float8Linear); it "
                "cannot run on CPU",
            )
        )
    return problems


def anchor_grouping_problems(config: Config) -> list[Problem]:
    """Warnings about data.anchor_grouped where it has no effect or overrides length grouping."""
    training, data = config.training, config.data
    if sampler_mode(config) != "anchor_grouped":
        return []  # off, or ignored by packing (SD219)
    problems = []
    if training.static_shapes and not training.static_anchor_buckets:
        problems.append(
            Problem(
                "SD221",
                ("data", "anchor_grouped"),
                "data.anchor_grouped has no effect: with static_shapes and no "
                "training.static_anchor_buckets every micro-batch computes num_anchors "
                f"({training.num_anchors}) anchor blocks; set static_anchor_buckets (see "
                "`specdraft explain-buckets --suggest-anchors K`) or drop anchor_grouped",
            )
        )
    if data.length_grouped:
        problems.append(
            Problem(
                "SD222",
                ("data", "length_grouped"),
                "data.length_grouped is ignored: data.anchor_grouped sorts each mega-batch by "
                "shape bucket, then anchor count"
                + (
                    ""
                    if training.static_shapes
                    else " (with pad-to-longest by anchor count only, so lengths mix)"
                ),
            )
        )
    return problems


def unused_table_problems(config: Config, document: Mapping[str, Any]) -> list[Problem]:
    """Warn about tables the file sets but the chosen algorithm, mode or store ignores."""
    problems = []
    model = _table(document, "model")
    for unused in options_tables_ignored(config.model.algorithm):
        if unused in model:
            problems.append(
                Problem(
                    "SD319",
                    ("model", unused),
                    f"[model.{unused}] is ignored: model.algorithm = '{config.model.algorithm}'",
                    at="key",
                )
            )
    dis = _table(_table(document, "deployment"), "disaggregated")
    if dis and config.deployment.mode != "disaggregated":
        problems.append(
            Problem(
                "SD403",
                ("deployment", "disaggregated"),
                "[deployment.disaggregated] is ignored: deployment.mode = "
                f"'{config.deployment.mode}'; set mode = 'disaggregated' or drop the table",
                at="key",
            )
        )
    else:
        store = config.deployment.disaggregated.store
        for unused in settings_tables_ignored(store):
            if unused in dis:
                problems.append(
                    Problem(
                        "SD403",
                        ("deployment", "disaggregated", unused),
                        f"[deployment.disaggregated.{unused}] is ignored: store = '{store}'; "
                        f"set store = '{unused}' or drop it",
                        at="key",
                    )
                )
    return problems


def load_target(config: Config, target: str | None) -> tuple[TargetInfo | None, Problem | None]:
    """The target's facts, if readable; a warning when it was given but cannot be read.

    An explicit `target` (`--target`) must be readable. `model.target` is only read when the
    folder exists: configs usually name a path on the training cluster, not on the machine that
    runs pre-commit.
    """
    folder = target if target is not None else config.model.target
    key = ("model", "target")
    if target is None and not Path(folder).is_dir():
        return None, None
    try:
        return read_target_info(folder), None
    except TargetUnreadable as exc:
        return None, Problem(
            "SD315", key, f"cannot read the target's config ({exc}); target checks skipped"
        )


def target_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """Layer ids and mask token id against the target's own config, then the family's checks."""
    problems = layer_id_problems(config, info) + mask_token_problems(config, info)
    problems += draft_vocab_target_problems(config, info)
    problems += label_target_problems(config, info)
    return problems + family_rules(config.model.algorithm).target_checks(config, info)


# Below this depth (the tiny test targets) the first-half note says nothing useful.
_DEEP_TARGET = 8


def layer_id_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """Layer ids out of range or on the last layer (with the suggested taps), and a note when
    a deep target is tapped in its first half only."""
    ids = config.model.target_layer_ids
    problems: list[Problem] = []
    if info.num_layers is None:
        return problems
    where, last = f"the target ({info.folder})", info.num_layers - 1
    suggestion = layer_suggestion(info.num_layers, len(ids))
    for i, layer in enumerate(ids):
        path = ("model", "target_layer_ids", i)
        if layer > last:
            problems.append(
                Problem(
                    "SD310",
                    path,
                    f"target layer id {layer} is out of range: {where} has {info.num_layers} "
                    f"decoder layers, ids 0..{last}{suggestion}",
                )
            )
        elif layer == last:
            problems.append(
                Problem(
                    "SD311",
                    path,
                    f"target layer id {layer} is the last layer of {where}; the draft needs "
                    f"intermediate features: pick ids below {last}{suggestion}",
                )
            )
    half = info.num_layers // 2
    if info.num_layers >= _DEEP_TARGET and max(ids) < half:
        problems.append(
            Problem(
                "SD320",
                ("model", "target_layer_ids"),
                f"every target layer id is below {half}, in the first half of the "
                f"{info.num_layers} layers of {where}: the draft never sees the later layers, "
                f"whose features are closest to the target's next token{suggestion}",
            )
        )
    return problems


def layer_suggestion(num_layers: int, count: int) -> str:
    """A message clause with the DFlash drafts' `count` taps for the depth ('' when none fit)."""
    try:
        ids = suggest_target_layer_ids(num_layers, count)
    except ValueError:
        return ""
    taps = "1 tap" if count == 1 else f"{count} taps"
    return f"; {taps} spread over its depth as the DFlash drafts do: {ids}"


def mask_token_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """mask_token_id outside the vocabulary, or one of the target's pad, eos or bos tokens."""
    mask, problems = config.model.mask_token_id, []
    where, key = f"the target ({info.folder})", ("model", "mask_token_id")
    advice = mask_token_advice(info)
    if info.vocab_size is not None and mask >= info.vocab_size:
        problems.append(
            Problem(
                "SD312",
                key,
                f"mask_token_id {mask} is outside the vocabulary of {where} (vocab_size "
                f"{info.vocab_size}); {advice}",
            )
        )
    text = info.token_text(mask)
    named = f"mask_token_id {mask}" + (f" ({text})" if text else "")
    for code, ids, what in (
        ("SD313", info.pad_ids, "the pad token id"),
        ("SD314", info.eos_ids, "an eos token id"),
        ("SD318", info.bos_ids, "the bos token id"),
    ):
        if mask in ids:
            problems.append(Problem(code, key, f"{named} is {what} of {where}; {advice}"))
    return problems


def mask_token_advice(info: TargetInfo) -> str:
    """How to pick model.mask_token_id, with this target's candidate when one is known."""
    advice = (
        "pick a token the target never emits in its chat answers and that is not its pad, eos "
        "or bos token (the draft reads that token's row of the target's frozen embedding)"
    )
    candidate = mask_token_candidate(info)
    if candidate is None:
        return advice
    token_id, text = candidate
    return f"{advice}, such as {text} (mask_token_id = {token_id})"


def mask_token_candidate(info: TargetInfo) -> tuple[int, str] | None:
    """A special token fit for the mask: one named like a mask, else a ChatML target's
    `<|endoftext|>` (SmolLM2's id 0; its answers end with `<|im_end|>`), if neither pad, eos
    nor bos."""
    taken = info.pad_ids | info.eos_ids | info.bos_ids
    free = [(token_id, text) for token_id, text in info.special_tokens if token_id not in taken]
    for token_id, text in free:
        if "mask" in text.lower():
            return token_id, text
    texts = {text for _, text in info.special_tokens}
    if {"<|im_start|>", "<|im_end|>"} <= texts:
        for token_id, text in free:
            if text == "<|endoftext|>":
                return token_id, text
    return None


def _table(document: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = document.get(name) if isinstance(document, Mapping) else None
    return value if isinstance(value, Mapping) else {}
