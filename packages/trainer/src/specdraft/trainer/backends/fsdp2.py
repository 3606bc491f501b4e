"""FSDP2 backend: `fully_shard` on each draft block, then on the root."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from .base import BackendKind
from .compile import apply_compile
from .fp8 import apply_fp8_linear
from .options import BackendOptions

if TYPE_CHECKING:
    from ..models.backbone import DraftModel


def apply_fsdp2(
    model: DraftModel, options: BackendOptions, process_group: dist.ProcessGroup | None
) -> nn.Module:
    """fp8 (if asked), compile each block in place, then shard blocks and root with FSDP2."""
    if options.fp8_linear:
        apply_fp8_linear(model, options)
    apply_compile(model, options.compile_plan(len(model.layers)))
    group = process_group or dist.group.WORLD
    if group is None:
        raise RuntimeError(
            "FSDP2 needs a process group: call specdraft.trainer.runtime.init_distributed() "
            "(one rank is enough) before preparing the draft"
        )
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
    register_fsdp_forward_method(model, "predict_blocks")
    return model


@dataclass(frozen=True)
class Fsdp2Backend:
    """The `Backend` of an FSDP2 (`fully_shard`) draft."""

    model: nn.Module

    def gradient_sync(self, enabled: bool) -> AbstractContextManager[None]:
        """FSDP2 reads a flag at backward time: set it for this micro-step."""
        # fully_shard turned the root into an FSDPModule (a class made at run time).
        cast(FSDPModule, self.model).set_requires_gradient_sync(enabled)
        return nullcontext()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Gradients are DTensors: torch's clip reduces over the mesh; the norm comes back whole."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


def prepare_fsdp2(
    model: DraftModel, options: BackendOptions, process_group: dist.ProcessGroup | None
) -> Fsdp2Backend:
    """Compile blocks (if asked), shard the draft with FSDP2, and wrap it as a `Backend`."""
    return Fsdp2Backend(apply_fsdp2(model, options, process_group))


BACKEND = BackendKind("fsdp2", prepare_fsdp2)
