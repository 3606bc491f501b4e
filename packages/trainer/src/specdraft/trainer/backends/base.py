"""The `Backend` protocol: a sharded draft and what the training loop does differently per backend.

The loop never asks which backend it has: gradient sync across micro-steps and the global
gradient norm (with clipping) are the two places FSDP1 and FSDP2 differ, so each backend answers
both for its own wrapped model.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch import nn


class Backend(Protocol):
    """A prepared (compiled, sharded) draft, as the training loop uses it."""

    @property
    def model(self) -> nn.Module:
        """The wrapped draft: call it, read its parameters, checkpoint it."""
        ...

    def gradient_sync(self, enabled: bool) -> AbstractContextManager[None]:
        """A context for one micro-step: reduce gradients only when `enabled` (window's last)."""
        ...

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to `max_norm` (inf: no clipping); the global norm, a plain tensor."""
        ...
