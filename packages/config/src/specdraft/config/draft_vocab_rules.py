"""Lint findings on `model.draft_vocab_size`: against the target's vocabulary and the engines.

What the engines read (vLLM 0.32, speculators 0.9.0, SGLang 0.5.23, read in their sources):
vLLM's qwen3_dflash and qwen3_dspark build the draft head with `draft_vocab_size` rows and map
draft ids to target ids through `d2t` offsets; its ParallelLMHead pads the rows to a multiple of
64, so any size loads. vLLM's DFlash2 speculator takes its candidates from the draft head without
that mapping, speculators' DFlash2 requires the full vocabulary and SGLang's DFlash loaders
project through the target's head: a DFlash2 draft vocabulary trains but no engine serves it.
"""

from __future__ import annotations

from .families import FAMILY_RULES
from .finding import Problem
from .schema import Config
from .target_info import TargetInfo

_KEY = ("model", "draft_vocab_size")
# vLLM's vocabulary padding (DEFAULT_VOCAB_PADDING_SIZE).
_VLLM_PADDING = 64


def served_with_draft_vocab() -> tuple[str, ...]:
    """The families some engine serves with a draft vocabulary (their `draft_vocab_served`)."""
    return tuple(name for name, rules in FAMILY_RULES.items() if rules.draft_vocab_served)


def draft_vocab_problems(config: Config) -> list[Problem]:
    """Findings that need only the config: padding, and whether an engine serves it."""
    size = config.model.draft_vocab_size
    if size is None:
        return []
    problems = []
    if size % _VLLM_PADDING:
        rounded = -(-size // _VLLM_PADDING) * _VLLM_PADDING
        problems.append(
            Problem(
                "SD323",
                _KEY,
                f"draft_vocab_size {size} is not a multiple of {_VLLM_PADDING}: vLLM pads the "
                f"draft head to {rounded} rows anyway, so {rounded} costs the same when served",
            )
        )
    algorithm, served = config.model.algorithm, served_with_draft_vocab()
    if algorithm not in served:
        problems.append(
            Problem(
                "SD324",
                _KEY,
                f"no serving engine reads a draft vocabulary for algorithm = {algorithm!r} "
                "(vLLM's DFlash2 takes its candidates from the head without the d2t mapping, "
                "speculators 0.9.0 requires the full vocabulary, SGLang projects through the "
                "target's head): the draft trains but `specdraft export` refuses it; drop "
                f"draft_vocab_size, or use {' or '.join(served)}",
            )
        )
    return problems


def draft_vocab_target_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """The draft vocabulary against the target's own vocabulary size."""
    size, vocab = config.model.draft_vocab_size, info.vocab_size
    if size is None or vocab is None:
        return []
    if size > vocab:
        return [
            Problem(
                "SD321",
                _KEY,
                f"draft_vocab_size {size} is larger than the vocabulary of the target "
                f"({info.folder}: vocab_size {vocab}); use at most {vocab}, or drop it for the "
                "full vocabulary (`specdraft explain-vocab` suggests a size)",
            )
        ]
    if size == vocab:
        return [
            Problem(
                "SD322",
                _KEY,
                f"draft_vocab_size {size} is the target's whole vocabulary ({info.folder}): "
                "nothing is pruned; drop it, or pick a smaller size (`specdraft explain-vocab`)",
            )
        ]
    return []
