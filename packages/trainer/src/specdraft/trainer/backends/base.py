"""The `Backend` protocol: a sharded draft and what the training loop does differently per backend.

The loop never asks which backend it has: gradient sync across micro-steps and the global
gradient norm (with clipping) are the two places FSDP1 and FSDP2 differ, so each backend answers
both for its own wrapped model. `BackendKind` is what a backend module registers: its name and
how it prepares a draft.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from ..models.backbone import DraftModel
    from .options import BackendOptions


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


@dataclass(frozen=True)
class BackendKind:
    """A data-parallel backend as `backends.prepare` finds it: `backends/<name>.py`'s BACKEND."""

    name: str  # the `training.backend` value (`specdraft.config.training_backends`)
    # Compile the draft's blocks (if the options ask) and shard it.
    prepare: Callable[[DraftModel, BackendOptions, dist.ProcessGroup | None], Backend]
