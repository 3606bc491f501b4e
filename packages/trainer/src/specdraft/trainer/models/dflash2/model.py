"""DFlash2: the DFlash backbone with in-block convolutions and a pairwise path selector.

Loss per kept block at offsets k = 1..bs-1 (offset k predicts the token at anchor + k):

    w_k = exp(-(k-1)/gamma) * loss_mask[anchor + k]   (offsets.py; 0 outside a draft vocab)
    numerator   = sum w_k * CE(logits_k, token_k) + selector_loss_weight * sum w_k * u_k * CE_sel
    denominator = sum w_k

where u_k is 1 when the position takes part in the selector loss (always with 'insert'; only
when the gold token is among the top-k with 'exclude'). With a draft vocabulary the top-k
candidates are draft ids; the codebooks are indexed by target ids (the previous token is any
target token), so candidates are mapped to target ids before their codebook rows are read.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask
from transformers import initialization as init

from ..backbone import BlockTargets, DraftModel
from ..layers import DFlashDecoderLayer, RotaryTables
from ..losses import LOSS_WEIGHT, DraftLoss, MetricRatios, chunked_sums
from ..offsets import OFFSET_METRIC_RATIOS, offset_ce, offset_metrics, offset_slots, soft_slots
from ..spec import DraftTrainSpec
from ..target import TargetHead
from .conv import BlockDepthwiseConv
from .hf_config import DFlash2Config
from .selector import CandidateSelector, candidate_set

# The DFlash rates plus the selector's (see losses.MetricRatios).
DFLASH2_METRIC_RATIOS: MetricRatios = {
    **OFFSET_METRIC_RATIOS,
    "loss/selector_ce": ("selector_weighted_ce", LOSS_WEIGHT),
    "selector/recall": ("selector_recall_hits", "count"),
    "selector/accuracy": ("selector_correct", "selector_count"),
}


class DFlash2DecoderLayer(DFlashDecoderLayer):
    """A DFlash layer whose attention and MLP are each wrapped by a BlockDepthwiseConv."""

    def __init__(self, config: DFlash2Config) -> None:
        super().__init__(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.attention_sink_bias,
        )
        conv_args = (
            config.hidden_size,
            config.block_size,
            config.conv_kernel_size,
            config.conv_group_size,
        )
        self.attention_conv = BlockDepthwiseConv(*conv_args)
        self.mlp_conv = BlockDepthwiseConv(*conv_args)

    def forward(
        self, hidden: Tensor, context: Tensor, rotary: RotaryTables, mask: Tensor | BlockMask
    ) -> Tensor:
        """One DFlash2 layer: conv -> sublayer -> conv, around attention and around the MLP."""
        x, finish = self.attention_conv.prepare(self.input_layernorm(hidden))
        hidden = hidden + self.attention_conv.finish(
            self.self_attn(x, context, rotary, mask), finish
        )
        x, finish = self.mlp_conv.prepare(self.post_attention_layernorm(hidden))
        return hidden + self.mlp_conv.finish(self.mlp(x), finish)


class DFlash2DraftModel(DraftModel):
    """The DFlash2 draft; the class name is the `architectures` entry SGLang loads it by."""

    config_class = DFlash2Config
    _no_split_modules: ClassVar[list[str]] = ["DFlash2DecoderLayer"]

    def __init__(self, config: DFlash2Config) -> None:
        super().__init__(config)
        self.candidate_selector = CandidateSelector(
            config.hidden_size, config.vocab_size, config.selector_rank, config.selector_top_k
        )
        self.post_init()

    def make_layer(self, config: DFlash2Config, index: int) -> nn.Module:
        """A DFlash2 decoder layer."""
        return DFlash2DecoderLayer(config)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, BlockDepthwiseConv):
            # Identity conv at start: base tap 0 = 1, others 0, no dynamic correction.
            base = torch.zeros_like(module.base_kernel)
            base[:, 0] = 1.0
            init.copy_(module.base_kernel, base)
            init.zeros_(module.kernel_projection.weight)
        elif isinstance(module, CandidateSelector):
            std = self.config.initializer_range
            init.normal_(module.predecessor_codebook, mean=0.0, std=std)
            init.normal_(module.successor_codebook, mean=0.0, std=std)

    def objective(
        self,
        hidden: Tensor,
        targets: BlockTargets,
        batch: dict[str, Tensor],
        head: TargetHead,
        spec: DraftTrainSpec,
    ) -> DraftLoss:
        """DFlash CE plus the selector CE, as sums over offsets 1..bs-1 of the kept blocks.

        With `selector_loss_weight = 0` the selector adds nothing to the loss, so its top-k,
        codebook lookups and backward are skipped: its parameters get no gradient and the
        selector metrics (`selector_*`) are left out rather than reported as zeros.
        """
        slots = offset_slots(targets, self.block_size, spec.loss_decay_gamma, hidden, self)
        config = self.config
        selector = self.candidate_selector if config.selector_loss_weight != 0 else None
        weight = spec.soft_label_weight
        soft = soft_slots(batch, targets, 1, self.block_size, self) if weight > 0 else ()

        def logits_of(rows: Tensor) -> Tensor:
            return self.vocab_logits(rows, head)

        def chunk_sums(hidden_c, labels_c, previous_c, weights_c, supervised_c, *soft_c):
            ce = offset_ce(
                hidden_c, labels_c, weights_c, supervised_c, logits_of, soft_c or None, weight
            )
            # The soft labels' KL rides last, after the selector's sums.
            tail = () if ce.soft_kl is None else (ce.soft_kl,)
            if selector is None:
                return (*ce.sums, *tail)
            cands = candidate_set(
                ce.logits, ce.labels, config.selector_top_k, config.selector_gold_policy
            )
            scores = selector.score(
                ce.predicted,
                previous_c.reshape(-1),
                self.to_target_ids(cands.tokens),
                cands.unary,
            )
            selector_ce = F.cross_entropy(scores, cands.target, reduction="none")
            # A gold token outside the draft vocabulary has weight 0: 'insert' puts draft id 0
            # in its place, which never trains and never counts.
            selector_sum = (selector_ce * (ce.weights * cands.usable)).sum()
            used = ce.trained & cands.usable
            selector_correct = (scores.argmax(-1) == cands.target) & used
            return (
                ce.sums[0] + config.selector_loss_weight * selector_sum,
                *ce.sums[1:],
                selector_sum.detach(),
                (cands.hit & ce.trained).sum().float(),
                used.sum().float(),
                selector_correct.sum().float(),
                *tail,
            )

        sums = chunked_sums(
            chunk_sums,
            (hidden, slots.labels, slots.previous, slots.weights, slots.supervised, *soft),
            spec.logits_chunk_blocks,
        )
        metrics = offset_metrics(sums[1:5], targets, sums[-1] if soft else None)
        if selector is not None:
            selector_sum, recall_hits, selector_count, selector_correct = sums[5:9]
            metrics.update(
                selector_weighted_ce=selector_sum,
                selector_recall_hits=recall_hits,
                selector_count=selector_count,
                selector_correct=selector_correct,
            )
        return DraftLoss(sums[0], slots.weights.sum().detach(), metrics)

    def greedy_tokens(self, hidden: Tensor, anchor_tokens: Tensor, head: TargetHead) -> Tensor:
        """Walk the selector's best path from the anchor over offsets 1..bs-1."""
        predicted = hidden[:, :, 1:]
        return self.candidate_selector.walk(
            predicted,
            lambda step: self.vocab_logits(predicted[:, :, step], head),
            anchor_tokens,
            self.to_target_ids,
        )
