"""What a training forward needs besides the batch: anchor count, loss decay, backend, seed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from specdraft.config import Config

AttentionBackend = Literal["sdpa", "flex"]

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

    def __post_init__(self) -> None:
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be at least 1, got {self.num_anchors}")
        if self.loss_decay_gamma <= 0:
            raise ValueError(f"loss_decay_gamma must be positive, got {self.loss_decay_gamma}")
        if self.logits_chunk_blocks < 1:
            raise ValueError(
                f"logits_chunk_blocks must be at least 1, got {self.logits_chunk_blocks}"
            )
        if self.attention_backend not in ("sdpa", "flex"):
            raise ValueError(
                f"attention_backend must be resolved to 'sdpa' or 'flex' (got "
                f"{self.attention_backend!r}); call resolve_attention_backend first"
            )

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
        )
