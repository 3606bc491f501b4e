"""FSDP2 backend: `fully_shard` on each draft block, then on the root."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from .compile import apply_compile
from .fp8 import apply_fp8_linear
from .options import BackendOptions


def apply_fsdp2(
    model: nn.Module, options: BackendOptions, process_group: dist.ProcessGroup | None
) -> nn.Module:
    """fp8 (if asked), compile each block in place, then shard blocks and root with FSDP2."""
    if options.fp8_linear:
        apply_fp8_linear(model, options)
    apply_compile(model, options.compile_plan(len(model.layers)))
    group = process_group or dist.group.WORLD
    mesh = DeviceMesh.from_group(group, options.device.type)
    policy = MixedPrecisionPolicy(
        param_dtype=options.param_dtype, reduce_dtype=options.reduce_dtype
    )
    last = len(model.layers) - 1
    for index, block in enumerate(model.layers):
        # The last block is gathered again at the start of backward anyway: keeping it unsharded
        # after forward saves one all-gather.
        reshard = options.reshard_after_forward and index < last
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(
        model, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=policy
    )
    # Evaluation calls predict_blocks rather than forward: let FSDP2 gather parameters for it.
    if hasattr(model, "predict_blocks"):
        register_fsdp_forward_method(model, "predict_blocks")
    return model
