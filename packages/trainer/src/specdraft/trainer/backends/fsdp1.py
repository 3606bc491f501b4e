"""FSDP1 backend: FullyShardedDataParallel with one unit per draft decoder block."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.fsdp import (
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from .base import BackendKind
from .compile import apply_compile
from .options import BackendOptions

if TYPE_CHECKING:
    from ..models.backbone import DraftModel


def apply_fsdp1(
    model: DraftModel, options: BackendOptions, process_group: dist.ProcessGroup | None
) -> FullyShardedDataParallel:
    """Compile blocks (if asked), then wrap each block and the root in FSDP1."""
    apply_compile(model, options.compile_plan(len(model.layers)))
    block_types = {type(block) for block in model.layers}
    mixed = None
    if options.param_dtype != torch.float32:
        # bf16 gathered parameters and activations, fp32 gradient reduction.
        mixed = MixedPrecision(
            param_dtype=options.param_dtype,
            reduce_dtype=options.reduce_dtype,
            buffer_dtype=options.param_dtype,
        )
    return FullyShardedDataParallel(
        model,
        process_group=process_group,
        auto_wrap_policy=ModuleWrapPolicy(block_types),
        # use_orig_params keeps parameter names and lets compiled blocks see real parameters.
        use_orig_params=True,
        # On CPU FSDP1 must be told the device explicitly, or it looks for CUDA.
        device_id=options.device,
        mixed_precision=mixed,
        sharding_strategy=(
            ShardingStrategy.FULL_SHARD
            if options.reshard_after_forward
            else ShardingStrategy.SHARD_GRAD_OP
        ),
        sync_module_states=False,  # every rank builds the same weights from the same seed
    )


@dataclass(frozen=True)
class Fsdp1Backend:
    """The `Backend` of an FSDP1-wrapped draft."""

    model: FullyShardedDataParallel

    def gradient_sync(self, enabled: bool) -> AbstractContextManager[None]:
        """FSDP1 skips the reduction inside `no_sync()`."""
        return nullcontext() if enabled else self.model.no_sync()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """FSDP1 knows its flat shards: its own clip all-reduces the norm over the ranks."""
        return self.model.clip_grad_norm_(max_norm)


def prepare_fsdp1(
    model: DraftModel, options: BackendOptions, process_group: dist.ProcessGroup | None
) -> Fsdp1Backend:
    """Compile blocks (if asked), shard the draft with FSDP1, and wrap it as a `Backend`."""
    return Fsdp1Backend(apply_fsdp1(model, options, process_group))


BACKEND = BackendKind("fsdp1", prepare_fsdp1)
