"""Plain DFlash: the shared backbone alone, the draft z-lab, SGLang and vLLM serve today.

Block slot k = 1..bs-1 predicts the token at anchor + k (slot 0 holds the anchor). Loss per kept
block: the decayed and loss-masked cross-entropy of offsets.py, which DFlash2 extends with its
selector term. Greedy proposals are the argmax of each slot on its own (no path search, no
previous-token bias). The class name is the `architectures` entry SGLang (models/dflash.py) and
vLLM (registry: qwen3_dflash) load the draft by.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..backbone import BlockTargets, DraftModel
from ..layers import plain_layer
from ..losses import DraftLoss, chunked_sums
from ..offsets import offset_ce, offset_metrics, offset_slots, soft_slots
from ..spec import DraftTrainSpec
from ..target import TargetHead
from .hf_config import DFlashConfig


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
        """The decayed CE (mixed with the soft labels' KL when on) as sums over offsets
        1..bs-1 of the kept blocks."""
        slots = offset_slots(targets, self.block_size, spec.loss_decay_gamma, hidden, self)
        weight = spec.soft_label_weight
        soft = soft_slots(batch, targets, 1, self.block_size, self) if weight > 0 else ()

        def logits_of(rows: Tensor) -> Tensor:
            return self.vocab_logits(rows, head)

        def chunk_sums(hidden_c, labels_c, weights_c, supervised_c, *soft_c):
            ce = offset_ce(
                hidden_c, labels_c, weights_c, supervised_c, logits_of, soft_c or None, weight
            )
            return ce.sums if ce.soft_kl is None else (*ce.sums, ce.soft_kl)

        sums = chunked_sums(
            chunk_sums,
            (hidden, slots.labels, slots.weights, slots.supervised, *soft),
            spec.logits_chunk_blocks,
        )
        metrics = offset_metrics(sums[1:5], targets, sums[5] if soft else None)
        return DraftLoss(sums[0], slots.weights.sum().detach(), metrics)

    def greedy_tokens(self, hidden: Tensor, anchor_tokens: Tensor, head: TargetHead) -> Tensor:
        """The argmax of each slot 1..bs-1, one slot at a time (one slot's logits at a time)."""
        slots = [
            self.vocab_logits(hidden[:, :, slot], head).argmax(-1)
            for slot in range(1, self.block_size)
        ]
        return self.to_target_ids(torch.stack(slots, dim=-1))
