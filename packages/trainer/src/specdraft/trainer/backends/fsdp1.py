"""FSDP1 backend: FullyShardedDataParallel with one unit per draft decoder block."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import (
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from .compile import apply_compile
from .options import BackendOptions


def apply_fsdp1(
    model: nn.Module, options: BackendOptions, process_group: dist.ProcessGroup | None
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
