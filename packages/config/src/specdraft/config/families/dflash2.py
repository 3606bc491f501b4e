"""DFlash2, config side: `[model.dflash2]`, the rule that it names a gold policy, its lint
checks (SD317 against the target, SD325 against the draft vocabulary, SD326, shared, against
llama.cpp's selector when `serve.engines` names it) and their codes.

The trainer's half (model, HF config keys, metrics, export layouts) is
`specdraft/trainer/models/dflash2/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from ..finding import Problem
from ..lint_code import Code
from ..section import MAX_WIDTH, PositiveInt, Section, rule
from ..serve import LLAMA_CPP
from ..target_info import TargetInfo
from .base import FamilyRules

if TYPE_CHECKING:
    from ..schema import Config


class DFlash2Options(Section):
    """`[model.dflash2]`: the DFlash2 in-block convolution and pairwise path selector."""

    conv_group_size: PositiveInt = Field(
        16,
        le=MAX_WIDTH,
        description="Channels that share one dynamic correction of the two-tap in-block "
        "depthwise convolution. Must divide the hidden size.",
    )
    selector_top_k: PositiveInt = Field(
        16,
        le=MAX_WIDTH,
        description="Candidates kept per block position by the pairwise path selector.",
    )
    selector_rank: PositiveInt = Field(
        256,
        le=MAX_WIDTH,
        description="Rank of the selector's pairwise bilinear score <A(a)*H(h), B(b)>.",
    )
    selector_loss_weight: float = Field(
        0.1, ge=0.0, description="Weight of the selector cross-entropy added to the DFlash loss."
    )
    selector_gold_policy: Literal["exclude", "insert"] | None = Field(
        None,
        description="What the selector loss does when the gold token is not among the top-k "
        "candidates: 'exclude' drops that position from the selector loss, 'insert' puts the "
        "gold token into the candidate set in place of the weakest candidate. Required for "
        "dflash2: there is no silent default.",
    )


def dflash2_options(model: Any) -> DFlash2Options:
    """The `[model.dflash2]` table of a ModelConfig (the schema mounts it from RULES)."""
    return cast(DFlash2Options, model.dflash2)


def _gold_policy_named(model: Any) -> None:
    """DFlash2 has no silent default for what the selector does without the gold token."""
    if dflash2_options(model).selector_gold_policy is None:
        raise rule(
            "selector_gold_policy_missing",
            "algorithm 'dflash2' needs model.dflash2.selector_gold_policy = 'exclude' or "
            "'insert' (what the selector loss does when the gold token is not in the top-k)",
            key="model.dflash2.selector_gold_policy",
        )


def _conv_group_divides_hidden(config: Config, info: TargetInfo) -> list[Problem]:
    """DFlash2's conv groups split the hidden size: a group size must divide it."""
    group, hidden = dflash2_options(config.model).conv_group_size, info.hidden_size or 0
    if hidden <= 0 or hidden % group == 0:
        return []
    return [
        Problem(
            "SD317",
            ("model", "dflash2", "conv_group_size"),
            f"model.dflash2.conv_group_size {group} does not divide the hidden size "
            f"{hidden} of the target ({info.folder}); try {_divisor_below(hidden, group)}",
        )
    ]


def _target_checks(config: Config, info: TargetInfo) -> list[Problem]:
    """DFlash2's options against the target's hidden size: conv groups, llama.cpp's selector."""
    return _conv_group_divides_hidden(config, info) + _top_k_fits_llama_cpp(config, info)


def _top_k_fits_llama_cpp(config: Config, info: TargetInfo) -> list[Problem]:
    """llama.cpp's DFlash2 selector packs a position's k candidates and k x k pair scores into
    one hidden-state row (src/models/dflash.cpp refuses hidden_size < k (k + 1) at load)."""
    top_k, hidden = dflash2_options(config.model).selector_top_k, info.hidden_size or 0
    if not config.serve.named(LLAMA_CPP) or hidden <= 0 or hidden >= top_k * (top_k + 1):
        return []
    most = max((k for k in range(1, top_k) if hidden >= k * (k + 1)), default=1)
    return [
        Problem(
            "SD326",
            ("model", "dflash2", "selector_top_k"),
            f"serve.engines names llama.cpp, whose DFlash2 selector needs hidden_size >= "
            f"selector_top_k * (selector_top_k + 1) = {top_k * (top_k + 1)}; the target "
            f"({info.folder}) has hidden size {hidden}: use selector_top_k <= {most}",
        )
    ]


def _top_k_within_draft_vocab(config: Config) -> list[Problem]:
    """The selector picks its top-k candidates among the draft vocabulary: k must fit in it."""
    size, top_k = config.model.draft_vocab_size, dflash2_options(config.model).selector_top_k
    if size is None or size >= top_k:
        return []
    return [
        Problem(
            "SD325",
            ("model", "draft_vocab_size"),
            f"draft_vocab_size {size} is below model.dflash2.selector_top_k {top_k}: the "
            "selector picks its candidates among the draft vocabulary; raise the size",
        )
    ]


def _divisor_below(total: int, limit: int) -> int:
    """The largest divisor of `total` that is at most `limit` (a suggested group size)."""
    return next(d for d in range(min(limit, total), 0, -1) if total % d == 0)


# DFlash2's lint codes (numbers in the shared ranges: SD3xx the model and its target).
CODES = (
    Code("SD303", "selector-gold-policy-missing", "error",
         "algorithm = 'dflash2' without model.dflash2.selector_gold_policy.",
         ("selector_gold_policy_missing",)),
    Code("SD317", "conv-group-not-divisor", "error",
         "model.dflash2.conv_group_size does not divide the target's hidden size."),
    Code("SD325", "draft-vocab-below-top-k", "error",
         "model.draft_vocab_size is below model.dflash2.selector_top_k."),
)  # fmt: skip

RULES = FamilyRules(
    name="dflash2",
    title="DFlash2",
    summary="DFlash + in-block convolutions + pairwise path selector",
    options=DFlash2Options,
    option_rules=_gold_policy_named,
    rule_types=("selector_gold_policy_missing",),
    target_checks=_target_checks,
    config_checks=_top_k_within_draft_vocab,
    codes=CODES,
    # Only llama.cpp: its selector takes the top-k of the logits scattered through d2t (target
    # ids); vLLM's takes draft ids as target ids, speculators' needs the full vocabulary.
    draft_vocab_engines=("llama.cpp",),
    architecture="DFlash2DraftModel",
    speculators_type="dflash2",
    folder_keys=(
        ("conv_group_size", "conv_group_size"),
        ("selector_rank", "selector_rank"),
        ("selector_top_k", "selector_top_k"),
    ),
)
