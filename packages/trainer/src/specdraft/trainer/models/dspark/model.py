"""DSpark: the DFlash backbone with shifted labels, a Markov head and a confidence head.

Offset k = 0..bs-1 of a block predicts the token at anchor + k + 1 (so the anchor slot is
supervised); supervision stops at the block's first unsupervised label. Per supervised slot:

    logits  = lm_head(h_k) + markov_bias(prev_k, h_k)       prev_k = token at anchor + k
    L1      = sum_v |p_draft(v) - p_target(v)|              p_target = softmax(lm_head(t_(a+k)))
    accept  = clamp(1 - L1 / 2, 0, 1), detached
    loss_k  = ce_w * CE + l1_w * L1 + conf_w * BCE(sigmoid(conf_k), accept)
    w_k     = exp(-k / gamma) * [labels at anchor+1..anchor+k+1 all supervised]

with t = `target_last_hidden_states` (the target's normed final state; its position anchor + k
holds the target's distribution of the token at anchor + k + 1) and every probability in fp32.
With soft labels (weight w = training.soft_label_weight > 0) the CE term becomes
(1 - w) CE + w KL, the KL against the target's top-K distribution of the label
(target_labels.topk_kl), still scaled by ce_w.

With a draft vocabulary (draft_vocab.py) the logits and the Markov bias are over the D draft
ids (markov_w2 has D rows; markov_w1 still embeds the previous token by its target id, as vLLM
and speculators build it). The draft puts no mass outside its vocabulary, so the L1 distance is
sum over the draft ids |p_draft - p_target| plus the target's mass outside them, and a label
outside the vocabulary adds no CE (it cannot be raised) and counts as a miss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backbone import BlockTargets, DraftModel
from ..layers import plain_layer
from ..losses import DraftLoss, MetricRatios, chunked_sums, decay_weights, leading_run, upcast
from ..offsets import soft_slots
from ..spec import DraftTrainSpec
from ..target import TargetHead
from ..target_labels import topk_kl
from .hf_config import DSparkConfig
from .markov import ConfidenceHead, build_markov_head

# DSpark's rates (see losses.MetricRatios): the three terms per supervised token, and the mean
# acceptance target.
DSPARK_METRIC_RATIOS: MetricRatios = {
    "loss/ce": ("ce_sum", "count"),
    "loss/l1": ("l1_sum", "count"),
    "loss/confidence_bce": ("confidence_bce_sum", "count"),
    "accept_target": ("accept_sum", "count"),
}


def block_slots(
    targets: BlockTargets, block: int, gamma: float, hidden: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each block slot's label, previous token, position and loss weight (DSpark's objective).

    A slot's weight is the position decay while the block's supervision is unbroken and 0 after
    the first unsupervised label: the draft cannot be accepted past it.
    """
    labels = targets.gold[:, :, 1:]
    previous = targets.gold[:, :, :block]
    positions = targets.positions[:, :, :block]
    contiguous = torch.cumprod(targets.supervised[:, :, 1:].to(torch.int64), dim=-1).bool()
    loss_dtype = upcast(hidden).dtype
    decay = decay_weights(block, gamma, hidden.device, loss_dtype)
    return labels, previous, positions, contiguous.to(loss_dtype) * decay


class Qwen3DSparkModel(DraftModel):
    """The DSpark draft; the class name is the `architectures` entry SGLang loads it by."""

    config_class = DSparkConfig
    extra_batch_keys = ("target_last_hidden_states",)

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        self.markov_head = build_markov_head(
            config.markov_head_type,
            config.vocab_size,
            config.markov_rank,
            config.hidden_size,
            config.draft_vocab_size or config.vocab_size,
        )
        self.confidence_head = None
        if config.enable_confidence_head:
            self.confidence_head = ConfidenceHead(
                config.hidden_size, config.markov_rank, config.confidence_head_with_markov
            )
        self.post_init()

    def make_layer(self, config: DSparkConfig, index: int) -> nn.Module:
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
        """The combined DSpark loss as sums over the contiguous supervised slots.

        The target distribution feeds only the L1 term and the confidence head's acceptance
        target: with `l1_weight = 0` and no confidence head its logits and softmax are skipped,
        and the metrics computed from it (`l1_sum`, `accept_sum`) are left out, not zeros.
        """
        block = self.block_size
        labels, previous, target_positions, weights = block_slots(
            targets, block, spec.loss_decay_gamma, hidden
        )
        target_last = batch["target_last_hidden_states"]
        config = self.config
        markov, confidence = self.markov_head, self.confidence_head
        use_target = config.l1_weight != 0 or confidence is not None
        vocab = self.vocab_map(hidden.device)
        soft_weight = spec.soft_label_weight
        # Slot k's label is the token at anchor + k + 1: its soft label sits there too.
        soft = soft_slots(batch, targets, 1, block + 1, self) if soft_weight > 0 else ()

        def chunk_sums(hidden_c, labels_c, previous_c, positions_c, weights_c, *soft_c):
            batch_size, chunk, slots, width = hidden_c.shape
            # One contiguous [rows, H] matrix: a chunk of blocks is a strided slice when B > 1,
            # and the head would run a batched matmul over it instead of a single mm.
            rows = hidden_c.reshape(-1, width)
            labels_f, in_vocab = self.to_draft_labels(labels_c.reshape(-1))
            weights_f = weights_c.reshape(-1)
            bias = upcast(markov.block_bias(hidden_c, previous_c)).reshape(rows.shape[0], -1)
            weight = self.head_weight(head)
            if weight.dtype == bias.dtype:
                # The Markov bias rides in the head's matmul (addmm) instead of a separate
                # vocabulary-wide add; a bf16 head keeps its bf16 logits + fp32 bias below.
                logits = torch.addmm(bias, rows.to(weight.dtype), weight.t())
            else:
                logits = upcast(self.vocab_logits(rows, head)) + bias
            supervised = weights_f > 0
            l1 = accept = None
            if use_target:
                log_probs = torch.log_softmax(logits, -1)
                token_ce = F.nll_loss(log_probs, labels_f, reduction="none")
                index = positions_c.reshape(batch_size, chunk * slots, 1).expand(-1, -1, width)
                target_hidden = torch.gather(target_last, 1, index).view(-1, width)
                with torch.no_grad():
                    target_probs = torch.softmax(upcast(head.logits(target_hidden)), -1)
                    outside = None
                    if vocab is not None:
                        target_probs = target_probs[:, vocab.draft_to_target]
                        outside = (1.0 - target_probs.sum(-1)).clamp_min(0.0)
                # One fused |.| + sum pass (same gradient as abs().sum(): sign * grad).
                l1 = torch.linalg.vector_norm(log_probs.exp() - target_probs, ord=1, dim=-1)
                if outside is not None:
                    l1 = l1 + outside  # the target's mass the draft cannot propose
                accept = (1.0 - l1.detach() / 2.0).clamp(0.0, 1.0)
            else:
                token_ce = F.cross_entropy(logits, labels_f, reduction="none")
            if vocab is not None:
                # A label the draft cannot propose: no CE to train, and never correct.
                token_ce = token_ce * in_vocab
                supervised_correct = supervised & in_vocab
            else:
                supervised_correct = supervised
            soft_kl = None
            if soft_c:
                ids_c, logprobs_c, in_vocab_c = (t.reshape(-1, t.shape[-1]) for t in soft_c)
                soft_kl = topk_kl(logits, ids_c, logprobs_c, in_vocab_c)
                mixed = (1.0 - soft_weight) * token_ce + soft_weight * soft_kl
                per_token = config.ce_weight * mixed
            else:
                per_token = config.ce_weight * token_ce
            if l1 is not None:
                per_token = per_token + config.l1_weight * l1
            bce = None
            if confidence is not None:
                logit = upcast(confidence(hidden_c, markov.embed(previous_c))).reshape(-1)
                bce = F.binary_cross_entropy_with_logits(logit, accept, reduction="none")
                per_token = per_token + config.confidence_weight * bce
            # The loss before the metrics: a checkpointed chunk's recompute stops after the last
            # op whose tensors the backward needs, so the argmax below is not run a second time.
            loss_sum = (per_token * weights_f).sum()
            correct = ((logits.argmax(-1) == labels_f) & supervised_correct).view(labels_c.shape)

            def masked(values: Tensor) -> Tensor:
                return (values.detach() * supervised).sum()

            sums = (
                loss_sum,
                masked(token_ce),
                # A head that is off contributes an exact zero, as its weight would.
                masked(bce) if bce is not None else logits.new_zeros(()),
                correct.sum((0, 1)).float(),
                supervised.view(labels_c.shape).sum((0, 1)).float(),
                leading_run(correct).sum().float(),
            )
            if use_target:
                sums = (*sums, masked(l1), masked(accept))
            # The soft labels' KL rides last, weighted like the loss (losses.LOSS_WEIGHT).
            return sums if soft_kl is None else (*sums, (soft_kl.detach() * weights_f).sum())

        sums = chunked_sums(
            chunk_sums,
            (hidden, labels, previous, target_positions, weights, *soft),
            spec.logits_chunk_blocks,
        )
        numerator, ce_sum, bce_sum, correct_pos, count_pos, accepted = sums[:6]
        metrics = {
            "ce_sum": ce_sum,
            "confidence_bce_sum": bce_sum,
            "correct": correct_pos.sum(),
            "count": count_pos.sum(),
            "correct_per_pos": correct_pos,
            "count_per_pos": count_pos,
            "accepted": accepted,
            "blocks": targets.keep.sum().float(),
        }
        if use_target:
            metrics.update(l1_sum=sums[6], accept_sum=sums[7])
        if soft:
            metrics["soft_weighted_kl"] = sums[-1]
        return DraftLoss(numerator, weights.sum().detach(), metrics)

    def greedy_tokens(self, hidden: Tensor, anchor_tokens: Tensor, head: TargetHead) -> Tensor:
        """Slots 0..bs-2 decoded in order, each Markov bias fed the token chosen before."""
        markov = self.markov_head
        previous = anchor_tokens
        state = markov.initial_state(hidden[:, :, 0])
        chosen = []
        for slot in range(self.block_size - 1):
            slot_hidden = hidden[:, :, slot]
            state, bias = markov.step(state, slot_hidden, previous)
            logits = upcast(self.vocab_logits(slot_hidden, head)) + upcast(bias)
            previous = self.to_target_ids(logits.argmax(-1))
            chosen.append(previous)
        return torch.stack(chosen, dim=-1)
