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

from .buckets import effective_buckets, max_length_appended
from .families import family_rules, options_tables_ignored
from .finding import Problem
from .schema import Config
from .stores import settings_tables_ignored
from .target_info import TargetInfo, TargetUnreadable, read_target_info
from .tracking import tracking_problems

_BUCKETS = ("training", "static_shape_buckets")


def check_config(
    config: Config, document: Mapping[str, Any], *, target: str | None = None
) -> list[Problem]:
    """Every soft finding of a valid config; `target` overrides model.target for target checks."""
    problems = shape_problems(config) + unused_table_problems(config, document)
    problems += tracking_problems(config)
    info, unreadable = load_target(config, target)
    if unreadable is not None:
        problems.append(unreadable)
    if info is not None:
        problems += target_problems(config, info)
    return problems


def shape_problems(config: Config) -> list[Problem]:
    """Notes and warnings about shape buckets, static shapes, compile and fp8."""
    training, problems = config.training, []
    if max_length_appended(config):
        problems.append(
            Problem(
                "SD210",
                _BUCKETS,
                f"data.max_length ({config.data.max_length}) is not the last shape bucket, so it "
                f"is appended: effective buckets are {list(effective_buckets(config) or ())}",
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
    anchors = training.static_anchor_buckets
    if anchors and anchors[-1] != training.num_anchors:
        problems.append(
            Problem(
                "SD217",
                ("training", "static_anchor_buckets"),
                f"training.num_anchors ({training.num_anchors}) is not the last anchor bucket, "
                f"so it is appended: effective anchor buckets are "
                f"{[*anchors, training.num_anchors]}",
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
    if training.packing:
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
    if not config.anchor_grouping:
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
    model, problems = config.model, []
    where = f"the target ({info.folder})"
    if info.num_layers is not None:
        last = info.num_layers - 1
        for i, layer in enumerate(model.target_layer_ids):
            path = ("model", "target_layer_ids", i)
            if layer > last:
                problems.append(
                    Problem(
                        "SD310",
                        path,
                        f"target layer id {layer} is out of range: {where} has {info.num_layers} "
                        f"decoder layers, ids 0..{last}",
                    )
                )
            elif layer == last:
                problems.append(
                    Problem(
                        "SD311",
                        path,
                        f"target layer id {layer} is the last layer of {where}; the draft needs "
                        f"intermediate features: pick ids below {last}",
                    )
                )
    mask = model.mask_token_id
    if info.vocab_size is not None and mask >= info.vocab_size:
        problems.append(
            Problem(
                "SD312",
                ("model", "mask_token_id"),
                f"mask_token_id {mask} is outside the vocabulary of {where} (vocab_size "
                f"{info.vocab_size}); pick an unused id below {info.vocab_size}",
            )
        )
    if mask in info.pad_ids:
        problems.append(
            Problem(
                "SD313",
                ("model", "mask_token_id"),
                f"mask_token_id {mask} is the pad token id of {where}; pick an unused id",
            )
        )
    if mask in info.eos_ids:
        problems.append(
            Problem(
                "SD314",
                ("model", "mask_token_id"),
                f"mask_token_id {mask} is an eos token id of {where}; pick an unused id",
            )
        )
    return problems + family_rules(model.algorithm).target_checks(config, info)


def _table(document: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = document.get(name) if isinstance(document, Mapping) else None
    return value if isinstance(value, Mapping) else {}
