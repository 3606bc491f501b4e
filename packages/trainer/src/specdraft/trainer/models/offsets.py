"""The block-offset cross-entropy DFlash and DFlash2 share (block slot k predicts anchor + k).

Per kept block, over offsets k = 1..bs-1:

    w_k = exp(-(k-1)/gamma) * loss_mask[anchor + k] * [token at anchor + k in the draft vocab]
    numerator   = sum w_k * CE(logits_k, token at anchor + k)
    denominator = sum w_k

Logits, labels and top-k are in draft ids (draft_vocab.py; the target's ids without a draft
vocabulary). A supervised position whose token is outside the draft vocabulary has no logit to
train, so it leaves the loss, and it counts as a miss in accuracy and in the acceptance estimate,
as at serving time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch.nn.functional as F
from torch import Tensor

from .losses import LOSS_WEIGHT, MetricRatios, decay_weights, leading_run, upcast

if TYPE_CHECKING:
    from .backbone import BlockTargets, DraftModel

# Logged rate -> (numerator, denominator) sums of the offset objective (see losses.MetricRatios).
OFFSET_METRIC_RATIOS: MetricRatios = {
    # The decayed cross-entropy per unit of loss weight.
    "loss/dflash_ce": ("weighted_ce", LOSS_WEIGHT),
}


class OffsetSlots(NamedTuple):
    """What block slots 1..bs-1 predict, each [B, N, bs-1]."""

    labels: Tensor  # draft id of the token at anchor + k (0 where outside the draft vocab)
    previous: Tensor  # target id of the token at anchor + k - 1 (DFlash2's selector reads it)
    weights: Tensor  # exp(-(k-1)/gamma) where the label is supervised and proposable, else 0
    supervised: Tensor  # bool: the label is supervised (proposable or not): the accuracy count


def offset_slots(
    targets: BlockTargets, block_size: int, gamma: float, hidden: Tensor, draft: DraftModel
) -> OffsetSlots:
    """The labels and decayed, loss-masked weights of offsets k = 1..bs-1 (DFlash, DFlash2)."""
    loss_dtype = upcast(hidden).dtype
    decay = decay_weights(block_size - 1, gamma, hidden.device, loss_dtype)
    labels, in_vocab = draft.to_draft_labels(targets.gold[:, :, 1:block_size])
    supervised = targets.supervised[:, :, 1:block_size]
    return OffsetSlots(
        labels,
        targets.gold[:, :, : block_size - 1],
        (supervised & in_vocab).to(loss_dtype) * decay,
        supervised,
    )


class OffsetCE(NamedTuple):
    """One chunk's per-slot cross-entropy pieces, flattened to rows, and its five base sums."""

    predicted: Tensor  # [rows, H] draft hidden states of slots 1..bs-1
    logits: Tensor  # [rows, D] at least fp32, over the draft vocabulary
    labels: Tensor  # [rows] draft ids
    weights: Tensor  # [rows]
    trained: Tensor  # [rows] bool: supervised and proposable (weight > 0)
    # (weighted CE with grad, the same detached, correct per position, count per position,
    # accepted tokens): what `offset_metrics` turns into the metric sums.
    sums: tuple[Tensor, ...]


def offset_ce(
    hidden_c: Tensor,
    labels_c: Tensor,
    weights_c: Tensor,
    supervised_c: Tensor,
    logits_of: Callable[[Tensor], Tensor],
) -> OffsetCE:
    """The decayed CE of a chunk of blocks: hidden [B, chunk, bs, H], the rest [.., bs-1]."""
    grid = labels_c.shape  # [B, chunk, bs-1]
    # One contiguous [rows, H] matrix: on the strided slice the head would run a batched matmul
    # over per-block matrices instead of a single mm (forward and backward).
    predicted = hidden_c[:, :, 1:].reshape(-1, hidden_c.shape[-1])
    labels, weights = labels_c.reshape(-1), weights_c.reshape(-1)
    logits = upcast(logits_of(predicted))
    token_ce = F.cross_entropy(logits, labels, reduction="none")
    # The loss before the metrics: a checkpointed chunk's recompute stops after the last op
    # whose tensors the backward needs, so the argmax below is not run a second time.
    weighted = (token_ce * weights).sum()
    trained = weights > 0
    correct = ((logits.argmax(-1) == labels) & trained).view(grid)
    sums = (
        weighted,
        weighted.detach(),
        correct.sum((0, 1)).float(),
        supervised_c.sum((0, 1)).float(),
        leading_run(correct).sum().float(),
    )
    return OffsetCE(predicted, logits, labels, weights, trained, sums)


def offset_metrics(sums: tuple[Tensor, ...], targets: BlockTargets) -> dict[str, Tensor]:
    """The metric sums of `OffsetCE.sums[1:]`, added up over the chunks."""
    weighted_ce, correct_pos, count_pos, accepted = sums
    return {
        "weighted_ce": weighted_ce,
        "correct": correct_pos.sum(),
        "count": count_pos.sum(),
        "correct_per_pos": correct_pos,
        "count_per_pos": count_pos,
        "accepted": accepted,
        "blocks": targets.keep.sum().float(),
    }
