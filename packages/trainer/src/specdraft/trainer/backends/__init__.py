"""Data-parallel backends behind one contract: `prepare(model, options, process_group)`."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch.distributed as dist
from torch import nn

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


def prepare(
    model: nn.Module, options: BackendOptions, process_group: dist.ProcessGroup | None = None
) -> nn.Module:
    """Compile (optionally) and shard the draft with the backend the options name."""
    if options.backend == "fsdp1":
        from .fsdp1 import apply_fsdp1

        return apply_fsdp1(model, options, process_group)
    if options.backend == "fsdp2":
        from .fsdp2 import apply_fsdp2

        return apply_fsdp2(model, options, process_group)
    raise ValueError(f"unknown backend {options.backend!r}; expected 'fsdp1' or 'fsdp2'")


def gradient_sync(model: nn.Module, enabled: bool) -> AbstractContextManager[None]:
    """Skip gradient reduction on micro-steps that are not optimizer boundaries."""
    if enabled:
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return nullcontext()
    if hasattr(model, "no_sync"):  # FSDP1
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
    return nullcontext()


__all__ = [
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
    "gradient_sync",
    "prepare",
    "resolve_param_dtype",
]
