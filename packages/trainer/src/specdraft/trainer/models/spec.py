"""What a training forward needs besides the batch: anchor count, loss decay, backend, seed,
and which labels it trains on (the tokens, or the target's predictions: target_labels.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from specdraft.config import Config

from .target_labels import SOFT_KEYS, TARGET_LABELS

AttentionBackend = Literal["sdpa", "flex"]
LabelSource = Literal["tokens", "target_argmax"]

# Anchors are re-drawn every epoch: the spec's seed moves by this stride per epoch.
EPOCH_SEED_STRIDE = 1_000_003


def resolve_attention_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """Resolve 'auto' | 'sdpa' | 'flex' for a device: 'auto' is flex on CUDA, sdpa elsewhere."""
    device_type = torch.device(device).type
    if name == "auto":
        # FlexAttention has no CPU backward in torch 2.13, so CPU training must use SDPA.
        return "flex" if device_type == "cuda" else "sdpa"
    if name in ("sdpa", "flex"):
        return name  # type: ignore[return-value]
    raise ValueError(
        f"training.attention_backend = {name!r} is not one of 'auto', 'sdpa', 'flex'; "
        "use 'auto' unless you are comparing backends"
    )


@dataclass(frozen=True)
class DraftTrainSpec:
    """The knobs of one draft forward that do not live in the draft's own config."""

    num_anchors: int
    loss_decay_gamma: float
    attention_backend: AttentionBackend = "sdpa"
    logits_chunk_blocks: int = 64
    seed: int = 0
    # data.labels: with "target_argmax" a batch must carry `target_labels` (the objectives read
    # their labels there instead of input_ids).
    label_source: LabelSource = "tokens"
    # training.soft_label_weight w: loss = (1 - w) CE + w KL against the batch's soft labels.
    soft_label_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be at least 1, got {self.num_anchors}")
        if self.loss_decay_gamma <= 0:
            raise ValueError(f"loss_decay_gamma must be positive, got {self.loss_decay_gamma}")
        if self.logits_chunk_blocks < 1:
            raise ValueError(
                f"logits_chunk_blocks must be at least 1, got {self.logits_chunk_blocks}"
            )
        if self.label_source not in ("tokens", "target_argmax"):
            raise ValueError(
                f"label_source must be 'tokens' or 'target_argmax', not {self.label_source!r}"
            )
        if not 0.0 <= self.soft_label_weight <= 1.0:
            raise ValueError(f"soft_label_weight must be in [0, 1], got {self.soft_label_weight}")
        if self.attention_backend not in ("sdpa", "flex"):
            raise ValueError(
                f"attention_backend must be resolved to 'sdpa' or 'flex' (got "
                f"{self.attention_backend!r}); call resolve_attention_backend first"
            )

    @property
    def label_keys(self) -> tuple[str, ...]:
        """The label keys (target_labels.py) a training batch must carry under this spec."""
        keys = (TARGET_LABELS,) if self.label_source == "target_argmax" else ()
        return keys + (SOFT_KEYS if self.soft_label_weight > 0 else ())

    def for_epoch(self, epoch: int) -> DraftTrainSpec:
        """The spec of training epoch `epoch`: the same knobs, that epoch's anchor seed."""
        return replace(self, seed=self.seed + epoch * EPOCH_SEED_STRIDE)

    @classmethod
    def from_config(cls, config: Config, device: torch.device | str) -> DraftTrainSpec:
        """The spec of a specdraft `Config`, with the attention backend resolved for `device`."""
        training = config.training
        return cls(
            num_anchors=training.num_anchors,
            loss_decay_gamma=config.loss_decay_gamma,
            attention_backend=resolve_attention_backend(training.attention_backend, device),
            logits_chunk_blocks=training.logits_chunk_blocks,
            seed=training.seed,
            label_source=config.data.labels,
            soft_label_weight=training.soft_label_weight,
        )
