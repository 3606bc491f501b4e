"""The draft families (DFlash, DFlash2, DSpark): the one place that says what each needs and builds.

A `DraftFamily` binds a `model.algorithm` name to its HF config class, its model class (named as
SGLang's loader expects, since `save_pretrained` writes the class name into `architectures`),
the family options it reads from the specdraft config, the target features it consumes and the
rates its metric sums log as. Everything else asks `family_of(config)` (or iterates over
`FAMILIES`) instead of comparing `model.algorithm` to a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdraft.config import Config, ModelConfig

from .backbone import DraftModel
from .config import (
    DFLASH2_CONV_TAPS,
    DFlash2Config,
    DFlashConfig,
    DFlashDraftConfig,
    DSparkConfig,
)
from .dflash.model import DFLASH_METRIC_RATIOS, DFlashDraftModel
from .dflash2.model import DFLASH2_METRIC_RATIOS, DFlash2DraftModel
from .dspark.model import DSPARK_METRIC_RATIOS, Qwen3DSparkModel
from .losses import COMMON_METRIC_RATIOS, MetricRatios

# The batch key of the target's normed final hidden state (DSpark's extra input).
LAST_HIDDEN_KEY = "target_last_hidden_states"


@dataclass(frozen=True)
class DraftFamily:
    """What defines one draft family: classes, its config options, the target features it reads."""

    name: str
    config_class: type[DFlashDraftConfig]
    model_class: type[DraftModel]
    # DSpark also trains on the target's final (normed) hidden state; DFlash(2) only on the taps.
    needs_last_hidden: bool
    # SGLang's --speculative-algorithm for this family (lower-cased: --aux-hidden-state-capture).
    sglang_algorithm: str
    # Family options of the specdraft ModelConfig -> the family's extra HF config keys.
    config_options: Callable[[ModelConfig], dict[str, Any]]
    # Family-specific checks against the target's backbone keys (vocab, hidden size).
    check_target: Callable[[ModelConfig, dict[str, Any]], None]
    # The rates of this family's metric sums, besides COMMON_METRIC_RATIOS (trainer logging).
    metric_ratios: MetricRatios

    def __post_init__(self) -> None:
        # The model class lists the batch keys its forward requires: the family must agree.
        if self.needs_last_hidden != (LAST_HIDDEN_KEY in self.model_class.extra_batch_keys):
            raise TypeError(
                f"draft family {self.name!r}: needs_last_hidden = {self.needs_last_hidden} but "
                f"{self.model_class.__name__}.extra_batch_keys = "
                f"{self.model_class.extra_batch_keys}; make them agree"
            )

    @property
    def architecture(self) -> str:
        """The `architectures` entry of this family's config.json (SGLang picks the class by it)."""
        return self.model_class.__name__

    @property
    def extra_feature_keys(self) -> tuple[str, ...]:
        """Target feature keys a sample carries besides `hidden_states`."""
        return tuple(self.model_class.extra_batch_keys)

    def feature_width(self, hidden_size: int, num_target_layers: int) -> int:
        """Width of the concatenated `hidden_states` taps (one hidden state per target layer id)."""
        return hidden_size * num_target_layers

    def input_width(self, hidden_size: int, num_target_layers: int) -> int:
        """Target-feature values per token the draft reads: the taps (+ the final state)."""
        extra = hidden_size if self.needs_last_hidden else 0
        return self.feature_width(hidden_size, num_target_layers) + extra

    def build_config(self, model_cfg: ModelConfig, backbone: dict[str, Any]) -> DFlashDraftConfig:
        """The HF draft config from the backbone keys (target-derived) and the family options."""
        self.check_target(model_cfg, backbone)
        return self.config_class(**self.config_options(model_cfg), **backbone)


def _dflash2_options(model_cfg: ModelConfig) -> dict[str, Any]:
    opts = model_cfg.dflash2
    if opts.selector_gold_policy is None:
        raise ValueError("model.dflash2.selector_gold_policy is required: 'exclude' or 'insert'")
    return {
        "conv_kernel_size": DFLASH2_CONV_TAPS,
        "conv_group_size": opts.conv_group_size,
        "selector_rank": opts.selector_rank,
        "selector_top_k": opts.selector_top_k,
        "selector_loss_weight": opts.selector_loss_weight,
        "selector_gold_policy": opts.selector_gold_policy,
    }


def _dflash2_check(model_cfg: ModelConfig, backbone: dict[str, Any]) -> None:
    """Errors that would otherwise surface as a shape mismatch inside the conv or selector."""
    group = model_cfg.dflash2.conv_group_size
    if backbone["hidden_size"] % group:
        raise ValueError(
            f"model.dflash2.conv_group_size = {group} does not divide the target hidden size "
            f"{backbone['hidden_size']}; use a divisor such as 16"
        )
    if model_cfg.dflash2.selector_top_k > backbone["vocab_size"]:
        raise ValueError(
            f"model.dflash2.selector_top_k = {model_cfg.dflash2.selector_top_k} exceeds the "
            f"vocabulary size {backbone['vocab_size']}; use 16"
        )


def _dspark_options(model_cfg: ModelConfig) -> dict[str, Any]:
    opts = model_cfg.dspark
    return {
        "markov_rank": opts.markov_rank,
        "markov_head_type": opts.markov_type,
        "enable_confidence_head": opts.confidence_head,
        "confidence_head_with_markov": opts.confidence_uses_markov,
        "ce_weight": opts.ce_weight,
        "l1_weight": opts.l1_weight,
        "confidence_weight": opts.confidence_weight,
    }


def _no_check(model_cfg: ModelConfig, backbone: dict[str, Any]) -> None:
    return None


def _no_options(model_cfg: ModelConfig) -> dict[str, Any]:
    return {}


DFLASH = DraftFamily(
    name="dflash",
    config_class=DFlashConfig,
    model_class=DFlashDraftModel,
    needs_last_hidden=False,
    # SGLang serves plain DFlash drafts with the DFLASH worker (DFlashDraftModel is its base
    # class; DFlash2DraftModel extends it with the selector).
    sglang_algorithm="DFLASH",
    config_options=_no_options,
    check_target=_no_check,
    metric_ratios=DFLASH_METRIC_RATIOS,
)
DFLASH2 = DraftFamily(
    name="dflash2",
    config_class=DFlash2Config,
    model_class=DFlash2DraftModel,
    needs_last_hidden=False,
    sglang_algorithm="DFLASH",
    config_options=_dflash2_options,
    check_target=_dflash2_check,
    metric_ratios=DFLASH2_METRIC_RATIOS,
)
DSPARK = DraftFamily(
    name="dspark",
    config_class=DSparkConfig,
    model_class=Qwen3DSparkModel,
    needs_last_hidden=True,
    sglang_algorithm="DSPARK",
    config_options=_dspark_options,
    check_target=_no_check,
    metric_ratios=DSPARK_METRIC_RATIOS,
)

FAMILIES: dict[str, DraftFamily] = {family.name: family for family in (DFLASH, DFLASH2, DSPARK)}


def metric_ratios() -> dict[str, tuple[str, str]]:
    """Every rate the trainer may log: the common ones, then each family's, in family order.

    Two families may share a rate (DFlash2 reports DFlash's CE) only with the same sums.
    """
    ratios: dict[str, tuple[str, str]] = dict(COMMON_METRIC_RATIOS)
    for family in FAMILIES.values():
        for name, sums in family.metric_ratios.items():
            if ratios.setdefault(name, sums) != sums:
                raise TypeError(
                    f"draft family {family.name!r} logs {name!r} from {sums}, another family "
                    f"from {ratios[name]}; give one of them another name"
                )
    return ratios


def family_for(algorithm: str) -> DraftFamily:
    """The family of a `model.algorithm` value."""
    try:
        return FAMILIES[algorithm]
    except KeyError:
        raise ValueError(
            f"model.algorithm = {algorithm!r} is not a draft family: use one of {sorted(FAMILIES)}"
        ) from None


def family_of(config: Config | ModelConfig) -> DraftFamily:
    """The family of a specdraft `Config` or its `ModelConfig` section."""
    model_cfg = config.model if isinstance(config, Config) else config
    return family_for(model_cfg.algorithm)


def family_of_architecture(architecture: str) -> DraftFamily:
    """The family whose config.json `architectures` entry is `architecture` (export, eval)."""
    for family in FAMILIES.values():
        if family.architecture == architecture:
            return family
    known = sorted(family.architecture for family in FAMILIES.values())
    raise ValueError(f"unknown draft architecture {architecture!r}; expected one of {known}")
