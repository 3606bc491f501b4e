"""What a family folder declares: `DraftFamily` and the export layouts and FLOP terms in it.

Each `models/<family>/family.py` builds one `DraftFamily` named `FAMILY` from these types; the
registry (`family.py`) collects them. A module of its own so that the family folders import
the types, never the registry that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from specdraft.config import ModelConfig
from specdraft.config.families import FAMILY_RULES, FamilyRules

from .backbone import DraftModel
from .config import DFlashDraftConfig
from .losses import MetricRatios

# The batch key of the target's normed final hidden state (DSpark's extra input).
LAST_HIDDEN_KEY = "target_last_hidden_states"

# Forward + backward over forward of a FLOP term, by what the backward computes.
TRAINABLE = 3  # input and weight gradients
ONE_GRAD = 2  # only one of them (frozen weight, or an input that is data)
NO_GRAD = 1


def no_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """A layout that adds no keys for this family."""
    return {}


def builds_anything(config: Any) -> str | None:
    """An engine that builds every variant of the family."""
    return None


@dataclass(frozen=True)
class VllmLayout:
    """How vLLM 0.32 loads a family (`--format vllm`)."""

    # vLLM's `architectures` entry, the registry key of its loader, and the
    # `speculative_config` method that serves it.
    architecture: str
    method: str
    # Regexes of the draft tensors its loader reads beyond the backbone's.
    tensors: tuple[str, ...] = ()
    # Keys of the draft's config.json no engine reads (training only): left out.
    training_keys: tuple[str, ...] = ()
    # The family's keys inside `dflash_config`, and at the top level, from the draft's config.
    dflash_config_keys: Callable[[Mapping[str, Any]], dict[str, Any]] = no_keys
    top_level_keys: Callable[[Mapping[str, Any]], dict[str, Any]] = no_keys
    # Why vLLM cannot build this draft (its HF config), or None when it can.
    cannot_build: Callable[[Any], str | None] = builds_anything
    # Why vLLM cannot serve this family with a draft vocabulary (draft_vocab_size), or None.
    no_draft_vocab: str | None = None


@dataclass(frozen=True)
class SpeculatorsLayout:
    """How speculators 0.9.0 describes a family (`--format speculators`)."""

    # `speculators_model_type` (also the algorithm) and the config class's `architectures`.
    model_type: str
    architecture: str
    # The family's top-level keys, from the draft's config.json.
    keys: Callable[[Mapping[str, Any]], dict[str, Any]] = no_keys
    # Why speculators cannot load this family with a draft vocabulary, or None.
    no_draft_vocab: str | None = None


# FLOP terms a family adds: name -> (forward FLOPs, forward+backward multiplier).
FlopTerms = dict[str, tuple[int, int]]


def no_layer_flops(config: Any, tokens: int) -> FlopTerms:
    """A family whose layers are the shared backbone's."""
    return {}


def no_head_flops(config: Any, slots: int) -> FlopTerms:
    """A family with no heads beyond the frozen LM head."""
    return {}


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
    # How the vLLM and speculators exports lay the draft out; None: that engine has no
    # loader for the family (the export refuses, naming the formats that work).
    vllm: VllmLayout | None = None
    speculators: SpeculatorsLayout | None = None
    # Slot k predicts anchor + k + 1 (DSpark: bs predictions a block, the anchor's among
    # them) instead of anchor + k (DFlash, DFlash2: bs - 1, the anchor is the bonus token).
    sample_from_anchor: bool = False
    # Matmul FLOPs beyond the backbone's, per layer over `tokens` block tokens
    # (`train/flops.py` multiplies by the layer count), and of the family's heads over the
    # `slots` the objective computes (checkpointed: recomputed in the backward).
    layer_flops: Callable[[Any, int], FlopTerms] = no_layer_flops
    head_flops: Callable[[Any, int], FlopTerms] = no_head_flops

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
    def rules(self) -> FamilyRules:
        """The config package's half of this family: options table, lint checks."""
        return FAMILY_RULES[self.name]

    @property
    def extra_feature_keys(self) -> tuple[str, ...]:
        """Target feature keys a sample carries besides `hidden_states`."""
        return tuple(self.model_class.extra_batch_keys)

    def options(self, model_cfg: ModelConfig) -> Any:
        """This family's `[model.<name>]` options of a ModelConfig (None without options)."""
        return self.rules.options_of(model_cfg)

    def supervised_slots(self, block_size: int) -> int:
        """Predictions per block: bs with sample_from_anchor, else bs - 1."""
        return block_size if self.sample_from_anchor else block_size - 1

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


def no_options(model_cfg: ModelConfig) -> dict[str, Any]:
    """A family that adds no HF config keys."""
    return {}


def no_target_check(model_cfg: ModelConfig, backbone: dict[str, Any]) -> None:
    """A family with no checks of its own against the target."""
    return None
