"""Loss bookkeeping shared by the draft families: decay weights, chunked logits, sums.

Every objective returns sums, never means: `numerator` (weighted per-token losses, with grad)
and `denominator` (sum of the weights), plus metric sums. The trainer adds them up over the
accumulation window and the data-parallel ranks and divides once, so the loss is the exact
token-weighted mean whatever the micro-batch split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .documents import same_document

# The loss denominator (sum of loss weights) as a ratio's denominator.
LOSS_WEIGHT = "@loss_weight"

# Logged metric -> (summed numerator, summed denominator) from a draft's metric sums. A ratio is
# logged when its numerator is present; the sums are all-reduced before division, so every rate
# is exact over the window and the ranks. Each family declares the ratios of its own sums.
MetricRatios = Mapping[str, tuple[str, str]]

# The rates every family's objective reports.
COMMON_METRIC_RATIOS: MetricRatios = {
    "accuracy": ("correct", "count"),
    "accuracy_per_pos": ("correct_per_pos", "count_per_pos"),
    # Mean run of leading correct tokens per kept block: an offline estimate of tau - 1.
    "accept_len": ("accepted", "blocks"),
    # Soft labels (training.soft_label_weight > 0): the decayed KL per unit of loss weight.
    "loss/soft_kl": ("soft_weighted_kl", LOSS_WEIGHT),
}


@dataclass
class DraftLoss:
    """Sums of one draft forward: numerator (grad), denominator (no grad), metric sums."""

    numerator: Tensor
    denominator: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)

    def mean(self) -> Tensor:
        """numerator / denominator of this micro-batch alone (for tests and single steps)."""
        return self.numerator / self.denominator.clamp_min(1e-12)


def upcast(x: Tensor) -> Tensor:
    """x in at least fp32: bf16/fp16 logits become fp32, fp32/fp64 stay (float64 tests)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def decay_weights(
    num_slots: int, gamma: float, device: torch.device, dtype: torch.dtype = torch.float32
) -> Tensor:
    """exp(-j / gamma) for the j-th supervised slot of a block, j = 0..num_slots-1.

    DFlash2 supervises offsets k = 1..bs-1 with exp(-(k-1)/gamma); DSpark supervises offsets
    k = 0..bs-1 with exp(-k/gamma). Both are exp(-j/gamma) over their own slots.
    """
    slots = torch.arange(num_slots, dtype=dtype, device=device)
    return torch.exp(-slots / gamma)


def block_targets(
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Tensor,
    keep: Tensor,
    block_size: int,
    document_ids: Tensor | None = None,
    labels: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gold tokens, supervision flags and positions at anchor + j, j = 0..block_size.

    Returns `gold` [B, N, bs+1] (int64), `supervised` [B, N, bs+1] (bool: inside the sequence,
    loss_mask set, block kept) and `positions` [B, N, bs+1] (clamped into the sequence). With
    `document_ids` (a packed batch) a slot is supervised only inside its anchor's document: a
    block never learns the next document's tokens. `labels` [B, S] (the target's argmax,
    label-aligned: target_labels.py) replace the tokens at j >= 1; j = 0 stays the anchor's
    own token, the block's input. A family that feeds a slot the token before it (DFlash2's
    selector, DSpark's Markov head) then reads the chain of labels, as it reads the chain of
    tokens without them: teacher forcing on what it is trained to propose.
    """
    length = input_ids.shape[1]
    offsets = torch.arange(block_size + 1, device=anchors.device)
    raw = anchors[:, :, None] + offsets
    positions = raw.clamp(max=length - 1)
    flat = positions.flatten(1)
    gold = torch.gather(input_ids, 1, flat).view_as(positions)
    if labels is not None:
        relabelled = torch.gather(labels.to(gold.dtype), 1, flat).view_as(positions)
        gold = torch.cat([gold[:, :, :1], relabelled[:, :, 1:]], dim=-1)
    labelled = torch.gather(loss_mask, 1, flat).view_as(positions).bool()
    supervised = labelled & (raw < length) & keep[:, :, None]
    if document_ids is not None:
        supervised = supervised & same_document(document_ids, positions, anchors)
    return gold, supervised, positions


def chunked_sums(
    fn: Callable[..., tuple[Tensor, ...]],
    per_block: tuple[Tensor, ...],
    chunk_blocks: int,
) -> tuple[Tensor, ...]:
    """Sum `fn(*chunk)` over chunks of `chunk_blocks` blocks (dim 1 of every tensor).

    With grad enabled every chunk but the last runs under activation checkpointing, so its
    full-vocabulary logits are freed after the forward and recomputed in the backward: peak
    logits memory is one chunk, never all blocks. The last chunk keeps what its backward needs
    instead: the backward starts with it, so holding its tensors from the forward costs the
    peak a recompute there would reach anyway (one chunk), and saves that recompute (all of it
    when the blocks fit one chunk). The chunk count depends on static shapes only.
    """
    num_blocks = per_block[0].shape[1]
    last = (num_blocks - 1) // chunk_blocks * chunk_blocks
    totals: tuple[Tensor, ...] | None = None
    for start in range(0, num_blocks, chunk_blocks):
        chunk = tuple(t[:, start : start + chunk_blocks] for t in per_block)
        recompute = torch.is_grad_enabled() and start != last
        out = checkpoint(fn, *chunk, use_reentrant=False) if recompute else fn(*chunk)
        totals = out if totals is None else tuple(a + b for a, b in zip(totals, out, strict=True))
    assert totals is not None
    return totals


def leading_run(flags: Tensor) -> Tensor:
    """Length of the leading run of True along the last dim (accepted tokens of a block)."""
    return torch.cumprod(flags.to(torch.int64), dim=-1).sum(-1)
