"""Data-parallel backends behind one contract: `prepare(model, options, process_group)` gives a
`Backend` (the sharded draft, its gradient sync and its gradient-norm clip)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from specdraft.config.registry import load_one
from specdraft.config.training_backends import BACKEND_NAMES

from .base import Backend, BackendKind
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
    return backend_kind(options.backend).prepare(model, options, process_group)


def backend_kind(name: str) -> BackendKind:
    """The registered backend `name`: `backends/<name>.py`'s BACKEND, imported only when chosen."""
    if name not in BACKEND_NAMES:
        expected = " or ".join(repr(known) for known in BACKEND_NAMES)
        raise ValueError(f"unknown backend {name!r}; expected {expected}")
    return load_one("specdraft.trainer.backends", name, BackendKind, attr="BACKEND")


__all__ = [
    "Backend",
    "BackendKind",
    "BackendOptions",
    "Fp8Unavailable",
    "RecompileError",
    "apply_compile",
    "backend_kind",
    "backend_options_from_config",
    "check_fp8_supported",
    "compiled_graph_count",
    "configure_dynamo",
    "explain_recompile_limit",
    "forbid_recompiles",
    "prepare",
    "resolve_param_dtype",
]
