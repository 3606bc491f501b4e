"""Labels from the target's own predictions: its argmax (data.labels = "target_argmax") and its
top-K distribution (soft labels), and the KL divergence the objectives train soft labels with.

Two alignments of the same numbers:

- prediction-aligned, as the target computes them (and as HF logits and
  `target_last_hidden_states` are): position p holds the target's prediction of the token at
  p + 1. Offline shards store these: `target_argmax` [S] int32, `target_topk_ids` [S, K] int32
  and `target_topk_logprobs` [S, K] float32, most likely first.
- label-aligned, as the objectives read them (like `input_ids`): position q holds what the token
  at q should be, the prediction made at q - 1: `target_labels` [.., S] int64 and
  `target_soft_ids` / `target_soft_logprobs` [.., S, K]. Position 0 has no prediction before it:
  its label is its own token and its soft label a placeholder. Neither is ever read: a block's
  labels start after its anchor, inside the anchor's document.

`TargetLabeler` turns the first into the second per sample (or per unpacked row), before any
packing, so no label is taken across a document boundary. The target's last hidden state is
already after its final norm (HF `last_hidden_state` of Llama and Qwen3 models), so its
logits are the head's matmul alone.

Soft labels. Per supervised slot with target top-K probabilities q_1..q_K (ids t_1..t_K) and
draft distribution p, the divergence is the KL of the two distributions coarsened to K + 1
outcomes, the K tokens and everything else:

    KL = sum_k q_k log(q_k / p(t_k)) + q_rest log(q_rest / p_rest)
    q_rest = 1 - sum_k q_k,   p_rest = 1 - sum_k p(t_k)  (from the logits, in log space)

Unlike renormalising the K probabilities to 1, this leaves the target's numbers as they are (a
flat distribution is not made peaked) and asks the draft for the right total outside the K
tokens without saying where. It is a lower bound of the full KL that tightens as K grows and
equals it when the K tokens cover the vocabulary. With a draft vocabulary, target tokens the
draft cannot propose join the rest bucket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.config import Config

from .losses import upcast

# Prediction-aligned keys (the target's outputs, stored by prepare-features).
TARGET_ARGMAX = "target_argmax"
TARGET_TOPK_IDS = "target_topk_ids"
TARGET_TOPK_LOGPROBS = "target_topk_logprobs"
PREDICTION_KEYS = (TARGET_ARGMAX, TARGET_TOPK_IDS, TARGET_TOPK_LOGPROBS)
# Label-aligned keys (what the objectives read).
TARGET_LABELS = "target_labels"
SOFT_IDS = "target_soft_ids"
SOFT_LOGPROBS = "target_soft_logprobs"
SOFT_KEYS = (SOFT_IDS, SOFT_LOGPROBS)

# Logit entries per head matmul: [rows, V] in fp32 stays at 64 MiB whatever the vocabulary.
_LOGIT_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class LabelSettings:
    """What a run trains on besides the tokens: argmax labels, and soft labels' K (0: none)."""

    argmax: bool = False
    soft_topk: int = 0

    @property
    def active(self) -> bool:
        """Whether the run needs any of the target's predictions."""
        return self.argmax or self.soft_topk > 0

    @classmethod
    def from_config(cls, config: Config) -> LabelSettings:
        """The labels a training run reads (soft labels only with a weight above 0)."""
        training = config.training
        return cls(
            argmax=config.data.labels == "target_argmax",
            soft_topk=training.soft_label_topk if training.soft_label_weight > 0 else 0,
        )


def stored_predictions(config: Config) -> tuple[bool, int]:
    """What `prepare-features` stores for a config: (argmax, top-K).

    The top-K is stored whenever soft_label_topk is set, weight or not (a folder for a later
    soft-label run), and the argmax with it: it costs nothing once the logits exist.
    """
    topk = config.training.soft_label_topk
    return config.data.labels == "target_argmax" or topk > 0, topk


@torch.no_grad()
def target_predictions(
    last_hidden: Tensor, head_weight: Tensor, topk: int = 0
) -> dict[str, Tensor]:
    """Prediction-aligned argmax (and top-K) of the target from its normed last hidden state.

    `last_hidden` is [.., S, H], `head_weight` the target's LM head [V, H]. The logits are made
    in the head's dtype a block of rows at a time and read in at least fp32; the argmax is
    torch's (the first of equal maxima, as greedy decoding picks).
    """
    width = last_hidden.shape[-1]
    rows = last_hidden.reshape(-1, width)
    step = max(1, _LOGIT_ELEMENTS // head_weight.shape[0])
    argmax, ids, logprobs = [], [], []
    for start in range(0, rows.shape[0], step):
        logits = upcast(F.linear(rows[start : start + step].to(head_weight.dtype), head_weight))
        argmax.append(logits.argmax(-1))
        if topk:
            values, top = logits.topk(topk, dim=-1)
            logprobs.append(values - logits.logsumexp(-1, keepdim=True))
            ids.append(top)
    lead = last_hidden.shape[:-1]
    out = {TARGET_ARGMAX: torch.cat(argmax).to(torch.int32).view(lead)}
    if topk:
        out[TARGET_TOPK_IDS] = torch.cat(ids).to(torch.int32).view(*lead, topk)
        out[TARGET_TOPK_LOGPROBS] = torch.cat(logprobs).view(*lead, topk)
    return out


def _shift(values: Tensor, dim: int, first: Tensor) -> Tensor:
    """`values` moved one position later along `dim`, `first` in front (the last one drops)."""
    return torch.cat([first, values.narrow(dim, 0, values.shape[dim] - 1)], dim=dim)


class MissingPredictions(KeyError):
    """A sample lacks a target prediction the run trains on (features made without it)."""


class TargetLabeler:
    """Puts the label keys a run trains on into samples or batches, from the target's
    predictions: stored ones (offline features) or computed from its last hidden state."""

    def __init__(self, settings: LabelSettings, head_weight: Tensor | None = None) -> None:
        self.settings = settings
        # The target's LM head [V, H]: needed only to compute predictions (in-process target).
        self.head_weight = head_weight

    def from_last_hidden(self, item: Mapping[str, Any], last_hidden: Tensor) -> dict[str, Any]:
        """`item` (a sample [S] or unpacked rows [B, S]) with labels from its last hidden state."""
        if self.head_weight is None:
            raise ValueError("this TargetLabeler has no target head to compute predictions with")
        weight = self.head_weight
        predicted = target_predictions(
            last_hidden.to(weight.device), weight, self.settings.soft_topk
        )
        return self.from_predictions({**item, **predicted})

    def from_predictions(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """`item` with its prediction-aligned keys replaced by the label-aligned keys the run
        reads; the sequence dimension is the last of `input_ids` (a sample or unpacked rows)."""
        settings = self.settings
        out = {key: value for key, value in item.items() if key not in PREDICTION_KEYS}
        if not settings.active:
            return out
        input_ids = torch.as_tensor(item["input_ids"])
        dim = input_ids.dim() - 1
        if settings.argmax:
            argmax = self._stored(item, TARGET_ARGMAX, "data.labels = 'target_argmax'")
            first = input_ids.narrow(dim, 0, 1).to(device=argmax.device, dtype=torch.int64)
            out[TARGET_LABELS] = _shift(argmax.long(), dim, first)
        if settings.soft_topk:
            need = f"training.soft_label_topk = {settings.soft_topk}"
            ids = self._stored(item, TARGET_TOPK_IDS, need)
            logprobs = self._stored(item, TARGET_TOPK_LOGPROBS, need)
            if ids.shape[-1] < settings.soft_topk:
                raise MissingPredictions(
                    f"a sample holds the target's top {ids.shape[-1]} tokens, the run asks for "
                    f"{settings.soft_topk} ({need})"
                )
            # Stored most likely first: a larger stored K serves a smaller one.
            ids = ids[..., : settings.soft_topk].long()
            logprobs = upcast(logprobs[..., : settings.soft_topk])
            out[SOFT_IDS] = _shift(ids, dim, torch.zeros_like(ids.narrow(dim, 0, 1)))
            out[SOFT_LOGPROBS] = _shift(logprobs, dim, torch.zeros_like(logprobs.narrow(dim, 0, 1)))
        return out

    @staticmethod
    def _stored(item: Mapping[str, Any], key: str, need: str) -> Tensor:
        if key not in item:
            raise MissingPredictions(
                f"a sample has no {key!r}, which {need} trains on: its features were made "
                "without it; rerun `specdraft prepare-features` with this config"
            )
        return torch.as_tensor(item[key])


def topk_kl(logits: Tensor, ids: Tensor, logprobs: Tensor, in_vocab: Tensor) -> Tensor:
    """KL(target || draft) per row over the target's top-K tokens and one rest bucket.

    `logits` [R, D] (at least fp32) are the draft's, `ids` [R, K] the top-K tokens as draft ids,
    `logprobs` [R, K] the target's log-probabilities of them and `in_vocab` [R, K] where the
    draft can propose them (a token it cannot joins the rest). Finite on every row, padding
    included (its zero log-probabilities read as K certain tokens), so that a zero weight
    never multiplies a NaN into the gradients.
    """
    lse = logits.logsumexp(-1, keepdim=True)
    draft_logp = logits.gather(-1, ids) - lse
    q = logprobs.to(logits.dtype).exp() * in_vocab
    # The draft's log-mass outside the K tokens, from the logits (exact when it is tiny). An
    # added count, not a scatter of flags: out-of-vocabulary entries all point at draft id 0.
    hit = torch.zeros_like(logits).scatter_add_(-1, ids, in_vocab.to(logits.dtype)) > 0
    floor = torch.finfo(logits.dtype).min
    rest_logp = logits.masked_fill(hit, floor).logsumexp(-1) - lse.squeeze(-1)
    # K tokens that cover the whole vocabulary leave no rest: 1 - sum q is rounding there.
    covered = in_vocab.sum(-1) >= logits.shape[-1]
    q_rest = torch.where(covered, 0.0, (1.0 - q.sum(-1)).clamp_min(0.0))
    listed = (torch.xlogy(q, q) - q * draft_logp).sum(-1)
    return listed + torch.xlogy(q_rest, q_rest) - q_rest * rest_logp
