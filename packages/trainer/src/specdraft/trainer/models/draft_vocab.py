"""The draft vocabulary: the target tokens a draft can propose and the maps between their ids.

With `model.draft_vocab_size` set the draft's LM head holds the target head's rows of the kept
tokens only (`DraftModel.lm_head`, frozen), so every logit, softmax and top-k of the objective
and of serving is over D draft ids instead of the V target ids. Draft id i is the i-th smallest
kept target id: speculators selects the head rows with a boolean `t2d` mask over the target
vocabulary, which keeps them in that order, and vLLM maps draft id i to target id i + d2t[i].

A gold token outside the draft vocabulary cannot be proposed, so at serving time it is simply
not accepted; the objective does the same: its cross-entropy is left out (there is no logit to
raise) and the position counts as wrong in accuracy and in the acceptance estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor


class VocabMap(NamedTuple):
    """The two directions between draft ids and target ids, on one device."""

    draft_to_target: Tensor  # [D] int64, ascending target ids
    target_to_draft: Tensor  # [V] int64, -1 for a target id outside the draft vocabulary


def check_draft_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Refuse ids that are not unique, ascending target ids (a corrupt or foreign config)."""
    if not ids:
        raise ValueError("draft_vocab_ids is empty: a draft vocabulary needs at least one token")
    previous = -1
    for token in ids:
        if not previous < token < vocab_size:
            raise ValueError(
                f"draft_vocab_ids must be ascending target ids below {vocab_size} "
                f"(the target vocabulary); found {token} after {previous}"
            )
        previous = token


def build_vocab_map(ids: Sequence[int], vocab_size: int, device: torch.device) -> VocabMap:
    """The maps of the draft vocabulary `ids` (ascending target ids) on `device`."""
    check_draft_ids(ids, vocab_size)
    draft_to_target = torch.tensor(list(ids), dtype=torch.int64, device=device)
    target_to_draft = torch.full((vocab_size,), -1, dtype=torch.int64, device=device)
    target_to_draft[draft_to_target] = torch.arange(len(ids), device=device)
    return VocabMap(draft_to_target, target_to_draft)


def to_draft_labels(labels: Tensor, vocab: VocabMap | None) -> tuple[Tensor, Tensor]:
    """Draft ids of target `labels` and where they exist; outside ones read as draft id 0.

    The 0 keeps gathers and cross-entropy in range; the caller masks those positions with the
    returned `in_vocab` (so they neither train nor count as correct).
    """
    if vocab is None:
        return labels, torch.ones_like(labels, dtype=torch.bool)
    mapped = vocab.target_to_draft[labels]
    in_vocab = mapped >= 0
    return mapped.clamp_min(0), in_vocab


def to_target_ids(ids: Tensor, vocab: VocabMap | None) -> Tensor:
    """Target ids of draft ids (the identity without a draft vocabulary)."""
    return ids if vocab is None else vocab.draft_to_target[ids]


def d2t_offsets(ids: Sequence[int]) -> Tensor:
    """vLLM's and speculators' `d2t`: target id of draft id i minus i (int64 [D])."""
    draft_to_target = torch.tensor(list(ids), dtype=torch.int64)
    return draft_to_target - torch.arange(len(ids), dtype=torch.int64)


def t2d_mask(ids: Sequence[int], vocab_size: int) -> Tensor:
    """speculators' `t2d`: True at the target ids the draft vocabulary keeps (bool [V])."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[torch.tensor(list(ids), dtype=torch.int64)] = True
    return mask


def logits_size(config: Any) -> int:
    """Entries of the draft's logits: its draft vocabulary's size, else the target's vocabulary."""
    return int(config.draft_vocab_size or config.vocab_size)
