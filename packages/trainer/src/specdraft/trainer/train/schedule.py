"""Learning-rate schedule: linear warmup, then cosine decay or constant."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, kind: str) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: Optimizer, *, total_steps: int, warmup_ratio: float, kind: str
) -> LambdaLR:
    """A LambdaLR following `lr_factor`; its state_dict resumes exactly."""
    warmup = round(warmup_ratio * total_steps)
    return LambdaLR(
        optimizer,
        lambda step: lr_factor(step, total_steps=total_steps, warmup_steps=warmup, kind=kind),
    )
