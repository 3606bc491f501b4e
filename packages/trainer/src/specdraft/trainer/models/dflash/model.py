"""Plain DFlash: the shared backbone alone, the draft z-lab, SGLang and vLLM serve today.

Block slot k = 1..bs-1 predicts the token at anchor + k (slot 0 holds the anchor). Loss per kept
block, the decayed and loss-masked cross-entropy that DFlash2 extends with its selector term:

    w_k = exp(-(k-1)/gamma) * loss_mask[anchor + k]
    numerator   = sum w_k * CE(lm_head(h_k), token at anchor + k)
    denominator = sum w_k

Greedy proposals are the argmax of each slot on its own (no path search, no previous-token bias).
The class name is the `architectures` entry SGLang (models/dflash.py) and vLLM (registry:
qwen3_dflash) load the draft by.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backbone import BlockTargets, DraftModel
from ..config import DFlashDraftConfig
from ..layers import DFlashDecoderLayer
from ..losses import (
    LOSS_WEIGHT,
    DraftLoss,
    MetricRatios,
    chunked_sums,
    decay_weights,
    leading_run,
    upcast,
)
from ..spec import DraftTrainSpec
from ..target import TargetHead
from .hf_config import DFlashConfig

# Logged rate -> (numerator, denominator) sums of the DFlash objective (see losses.MetricRatios).
DFLASH_METRIC_RATIOS: MetricRatios = {
    # The decayed cross-entropy per unit of loss weight.
    "loss/dflash_ce": ("weighted_ce", LOSS_WEIGHT),
}


class OffsetSlots(NamedTuple):
    """What block slots 1..bs-1 predict: labels, previous tokens and loss weights [B, N, bs-1]."""

    labels: Tensor  # token at anchor + k
    previous: Tensor  # token at anchor + k - 1 (DFlash2's selector conditions on it)
    weights: Tensor  # exp(-(k-1)/gamma) where the label is supervised, else 0


def offset_slots(
    targets: BlockTargets, block_size: int, gamma: float, hidden: Tensor
) -> OffsetSlots:
    """The labels and decayed, loss-masked weights of offsets k = 1..bs-1 (DFlash, DFlash2)."""
    loss_dtype = upcast(hidden).dtype
    decay = decay_weights(block_size - 1, gamma, hidden.device, loss_dtype)
    return OffsetSlots(
        targets.gold[:, :, 1:block_size],
        targets.gold[:, :, : block_size - 1],
        targets.supervised[:, :, 1:block_size].to(loss_dtype) * decay,
    )


class OffsetCE(NamedTuple):
    """One chunk's per-slot cross-entropy pieces, flattened to rows, and its five base sums."""

    predicted: Tensor  # [rows, H] draft hidden states of slots 1..bs-1
    logits: Tensor  # [rows, V] at least fp32
    labels: Tensor  # [rows]
    weights: Tensor  # [rows]
    supervised: Tensor  # [rows] bool
    # (weighted CE with grad, the same detached, correct per position, count per position,
    # accepted tokens): what `offset_metrics` turns into the metric sums.
    sums: tuple[Tensor, ...]


def offset_ce(hidden_c: Tensor, labels_c: Tensor, weights_c: Tensor, head: TargetHead) -> OffsetCE:
    """The decayed CE of a chunk of blocks: hidden [B, chunk, bs, H], labels/weights [.., bs-1]."""
    grid = labels_c.shape  # [B, chunk, bs-1]
    # One contiguous [rows, H] matrix: on the strided slice the head would run a batched matmul
    # over per-block matrices instead of a single mm (forward and backward).
    predicted = hidden_c[:, :, 1:].reshape(-1, hidden_c.shape[-1])
    labels, weights = labels_c.reshape(-1), weights_c.reshape(-1)
    logits = upcast(head.logits(predicted))
    token_ce = F.cross_entropy(logits, labels, reduction="none")
    # The loss before the metrics: a checkpointed chunk's recompute stops after the last op
    # whose tensors the backward needs, so the argmax below is not run a second time.
    weighted = (token_ce * weights).sum()
    supervised = weights > 0
    correct = ((logits.argmax(-1) == labels) & supervised).view(grid)
    sums = (
        weighted,
        weighted.detach(),
        correct.sum((0, 1)).float(),
        supervised.view(grid).sum((0, 1)).float(),
        leading_run(correct).sum().float(),
    )
    return OffsetCE(predicted, logits, labels, weights, supervised, sums)


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


def plain_layer(config: DFlashDraftConfig) -> DFlashDecoderLayer:
    """A DFlash decoder layer of the config's shape (no in-block convolution)."""
    return DFlashDecoderLayer(
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.rms_norm_eps,
    )


class DFlashDraftModel(DraftModel):
    """The plain DFlash draft; the class name is the `architectures` entry engines route on."""

    config_class = DFlashConfig

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__(config)
        self.post_init()

    def make_layer(self, config: DFlashConfig, index: int) -> nn.Module:
        """A plain DFlash decoder layer."""
        return plain_layer(config)

    def objective(
        self,
        hidden: Tensor,
        targets: BlockTargets,
        batch: dict[str, Tensor],
        head: TargetHead,
        spec: DraftTrainSpec,
    ) -> DraftLoss:
        """The decayed CE as sums over offsets 1..bs-1 of the kept blocks."""
        slots = offset_slots(targets, self.block_size, spec.loss_decay_gamma, hidden)

        def chunk_sums(hidden_c: Tensor, labels_c: Tensor, weights_c: Tensor):
            return offset_ce(hidden_c, labels_c, weights_c, head).sums

        sums = chunked_sums(
            chunk_sums, (hidden, slots.labels, slots.weights), spec.logits_chunk_blocks
        )
        return DraftLoss(sums[0], slots.weights.sum().detach(), offset_metrics(sums[1:], targets))

    def greedy_tokens(self, hidden: Tensor, anchor_tokens: Tensor, head: TargetHead) -> Tensor:
        """The argmax of each slot 1..bs-1, one slot at a time (one slot's logits at a time)."""
        return torch.stack(
            [head.logits(hidden[:, :, slot]).argmax(-1) for slot in range(1, self.block_size)],
            dim=-1,
        )
