"""The block-offset cross-entropy DFlash and DFlash2 share (block slot k predicts anchor + k).

Per kept block, over offsets k = 1..bs-1:

    w_k = exp(-(k-1)/gamma) * loss_mask[anchor + k] * [token at anchor + k in the draft vocab]
    numerator   = sum w_k * CE(logits_k, token at anchor + k)
    denominator = sum w_k

With soft labels (weight w = training.soft_label_weight > 0) each slot's CE becomes
(1 - w) CE + w KL, the KL against the target's top-K distribution at the label's position
(target_labels.topk_kl), under the same weights.

Logits, labels and top-k are in draft ids (draft_vocab.py; the target's ids without a draft
vocabulary). A supervised position whose token is outside the draft vocabulary has no logit to
train, so it leaves the loss, and it counts as a miss in accuracy and in the acceptance estimate,
as at serving time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .losses import LOSS_WEIGHT, MetricRatios, decay_weights, leading_run, upcast
from .target_labels import SOFT_IDS, SOFT_LOGPROBS, topk_kl

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


class SoftSlots(NamedTuple):
    """Soft labels of block slots 1..bs-1, each [B, N, bs-1, K] (see target_labels.topk_kl)."""

    ids: Tensor  # the target's top-K tokens as draft ids (0 where outside the draft vocab)
    logprobs: Tensor  # their log-probabilities under the target
    in_vocab: Tensor  # bool: the draft can propose the token


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


def soft_slots(
    batch: dict[str, Tensor], targets: BlockTargets, first: int, stop: int, draft: DraftModel
) -> SoftSlots:
    """The batch's soft labels at the label positions anchor + first .. anchor + stop - 1."""
    positions = targets.positions[:, :, first:stop]
    rows, blocks, width = positions.shape

    def at_positions(values: Tensor) -> Tensor:
        index = positions.reshape(rows, -1, 1).expand(-1, -1, values.shape[-1])
        return torch.gather(values, 1, index).view(rows, blocks, width, -1)

    ids, in_vocab = draft.to_draft_labels(at_positions(batch[SOFT_IDS]))
    return SoftSlots(ids, at_positions(batch[SOFT_LOGPROBS]), in_vocab)


class OffsetCE(NamedTuple):
    """One chunk's per-slot cross-entropy pieces, flattened to rows, and its five base sums."""

    predicted: Tensor  # [rows, H] draft hidden states of slots 1..bs-1
    logits: Tensor  # [rows, D] at least fp32, over the draft vocabulary
    labels: Tensor  # [rows] draft ids
    weights: Tensor  # [rows]
    trained: Tensor  # [rows] bool: supervised and proposable (weight > 0)
    # (the loss with grad, the weighted CE detached, correct per position, count per position,
    # accepted tokens): what `offset_metrics` turns into the metric sums. Without soft labels
    # the loss is the weighted CE.
    sums: tuple[Tensor, ...]
    # The weighted KL of the soft labels, detached (None without them).
    soft_kl: Tensor | None = None


def offset_ce(
    hidden_c: Tensor,
    labels_c: Tensor,
    weights_c: Tensor,
    supervised_c: Tensor,
    logits_of: Callable[[Tensor], Tensor],
    soft: tuple[Tensor, Tensor, Tensor] | None = None,
    soft_weight: float = 0.0,
) -> OffsetCE:
    """The decayed CE of a chunk of blocks: hidden [B, chunk, bs, H], the rest [.., bs-1].

    `soft` (a chunk of `SoftSlots`, each [B, chunk, bs-1, K]) mixes in the soft labels' KL
    with weight `soft_weight`.
    """
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
    loss, soft_kl = weighted, None
    if soft is not None:
        ids, logprobs, in_vocab = (t.reshape(-1, t.shape[-1]) for t in soft)
        weighted_kl = (topk_kl(logits, ids, logprobs, in_vocab) * weights).sum()
        loss = (1.0 - soft_weight) * weighted + soft_weight * weighted_kl
        soft_kl = weighted_kl.detach()
    trained = weights > 0
    correct = ((logits.argmax(-1) == labels) & trained).view(grid)
    sums = (
        loss,
        weighted.detach(),
        correct.sum((0, 1)).float(),
        supervised_c.sum((0, 1)).float(),
        leading_run(correct).sum().float(),
    )
    return OffsetCE(predicted, logits, labels, weights, trained, sums, soft_kl)


def offset_metrics(
    sums: tuple[Tensor, ...], targets: BlockTargets, soft_kl: Tensor | None = None
) -> dict[str, Tensor]:
    """The metric sums of `OffsetCE.sums[1:]` (and the soft labels' KL), over the chunks."""
    weighted_ce, correct_pos, count_pos, accepted = sums
    metrics = {
        "weighted_ce": weighted_ce,
        "correct": correct_pos.sum(),
        "count": count_pos.sum(),
        "correct_per_pos": correct_pos,
        "count_per_pos": count_pos,
        "accepted": accepted,
        "blocks": targets.keep.sum().float(),
    }
    if soft_kl is not None:
        metrics["soft_weighted_kl"] = soft_kl
    return metrics
