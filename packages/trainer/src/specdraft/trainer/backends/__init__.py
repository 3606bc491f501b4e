"""Data-parallel backends behind one contract: `prepare(model, options, process_group)` gives a
`Backend` (the sharded draft, its gradient sync and its gradient-norm clip)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from .base import Backend
from .compile import (
    RecompileError,
    apply_compile,
    compiled_graph_count,
    configure_dynamo,
    explain_recompile_limit,
    forbid_recompiles,
)
from .fp8 import Fp8Unavailable, check_fp8_supported
from .options import BackendOptions, backend_options_from_config, resolve_param_dtype

if TYPE_CHECKING:
    from ..models.backbone import DraftModel


def prepare(
    model: DraftModel, options: BackendOptions, process_group: dist.ProcessGroup | None = None
) -> Backend:
    """Compile (optionally) and shard the draft with the backend the options name."""
    if options.backend == "fsdp1":
        from .fsdp1 import Fsdp1Backend, apply_fsdp1

        return Fsdp1Backend(apply_fsdp1(model, options, process_group))
    if options.backend == "fsdp2":
        from .fsdp2 import Fsdp2Backend, apply_fsdp2

        return Fsdp2Backend(apply_fsdp2(model, options, process_group))
    raise ValueError(f"unknown backend {options.backend!r}; expected 'fsdp1' or 'fsdp2'")


__all__ = [
    "Backend",
    "BackendOptions",
    "Fp8Unavailable",
    "RecompileError",
    "apply_compile",
    "backend_options_from_config",
    "check_fp8_supported",
    "compiled_graph_count",
    "configure_dynamo",
    "explain_recompile_limit",
    "forbid_recompiles",
    "prepare",
    "resolve_param_dtype",
]
