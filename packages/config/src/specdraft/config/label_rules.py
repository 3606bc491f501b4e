"""Lint findings on labels from the target's own predictions (`data.labels`, soft labels).

The hard rules (a soft-label weight without top-K: SD340; target labels in the disaggregated
mode, whose capture servers return features but no logits: SD410) are schema validators. The
findings here do not make a config unusable (SD341, SD343) or need the target's files (SD342).
"""

from __future__ import annotations

from .finding import Problem
from .schema import Config
from .target_info import TargetInfo

_TOPK = ("training", "soft_label_topk")


def label_problems(config: Config) -> list[Problem]:
    """Findings that need only the config: a top-K nothing uses, a vocabulary from tokens."""
    training, problems = config.training, []
    if training.soft_label_topk and training.soft_label_weight == 0:
        problems.append(
            Problem(
                "SD341",
                _TOPK,
                f"training.soft_label_topk = {training.soft_label_topk} with "
                "soft_label_weight = 0: this run trains on no soft labels (`specdraft "
                "prepare-features` still stores the top tokens, for a later run that does); set "
                "soft_label_weight to use them",
            )
        )
    if config.data.labels == "target_argmax" and config.model.draft_vocab_size is not None:
        # The vocabulary is counted from the data's supervised tokens before any target runs.
        problems.append(
            Problem(
                "SD343",
                ("model", "draft_vocab_size"),
                "the draft vocabulary is chosen from the corpus's own tokens at supervised "
                "positions, while data.labels = 'target_argmax' trains on the target's "
                "predictions there: a label outside the vocabulary is a miss; check the "
                "coverage on a corpus the target wrote (`specdraft explain-vocab`), or drop "
                "draft_vocab_size",
            )
        )
    return problems


def label_target_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """The soft labels' top-K against the target's vocabulary (torch.topk needs K <= V)."""
    topk, vocab = config.training.soft_label_topk, info.vocab_size
    if vocab is None or topk <= vocab:
        return []
    return [
        Problem(
            "SD342",
            _TOPK,
            f"training.soft_label_topk = {topk} is larger than the vocabulary of the target "
            f"({info.folder}: vocab_size {vocab}); 8 to 32 keep most of the target's mass",
        )
    ]
