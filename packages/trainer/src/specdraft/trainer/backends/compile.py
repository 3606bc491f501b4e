"""Per-block torch.compile, in place before sharding, with Dynamo limits set from the plan."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch._dynamo
from torch import nn

from specdraft.config import CompilePlan

log = logging.getLogger(__name__)


class RecompileError(RuntimeError):
    """A compiled block recompiled after warm-up while training.fail_on_recompile is set."""


def configure_dynamo(plan: CompilePlan) -> None:
    """Set Dynamo's limits so every planned static shape gets its own graph."""
    if plan.recompile_limit is None:
        return
    cfg = torch._dynamo.config
    # The limit is counted per code object, and all blocks of one class share their forward's
    # code object: raise it to the number of graphs one block needs (shapes x grad variants,
    # + eval), plus slack, so a new bucket never exhausts it.
    cfg.recompile_limit = max(cfg.recompile_limit, plan.recompile_limit)
    # The accumulated limit caps all recompiles of all frames together; raise it with the above.
    cfg.accumulated_recompile_limit = max(
        cfg.accumulated_recompile_limit, plan.accumulated_recompile_limit or 0
    )
    # Hitting the limit would silently fall back to eager (slow, and the benchmark would lie):
    # make it an error instead. By construction the planned count never reaches the limit.
    cfg.fail_on_recompile_limit_hit = True
    # With dynamic=False a changed length must get a new static graph, never a symbolic one;
    # automatic_dynamic_shapes would otherwise mark the dimension dynamic on the second shape.
    cfg.automatic_dynamic_shapes = False


def apply_compile(model: nn.Module, plan: CompilePlan) -> int:
    """Compile each draft block in place (module names unchanged); return the blocks compiled."""
    if not plan.enabled:
        return 0
    layers = getattr(model, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no .layers: nothing to compile per block")
    configure_dynamo(plan)
    if plan.dynamic is None:
        log.warning(
            "compile_blocks without static_shapes: Dynamo decides the shapes and every new "
            "sequence length may recompile; set training.static_shapes to avoid it"
        )
    for block in layers:
        # In place: block.compile() keeps the module and its parameter names, so FSDP wraps it
        # the same way and checkpoints load whether or not blocks were compiled.
        block.compile(dynamic=plan.dynamic)
    return len(layers)


def compiled_graph_count() -> int:
    """Graphs Dynamo has compiled in this process so far (each new shape or guard is one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


@contextmanager
def forbid_recompiles(enabled: bool) -> Iterator[None]:
    """Inside, any recompile raises (used after warm-up with training.fail_on_recompile)."""
    if not enabled:
        yield
        return
    previous = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    try:
        yield
    except Exception as exc:
        if "recompil" in str(exc).lower():
            raise RecompileError(
                "a compiled draft block recompiled after warm-up (training.fail_on_recompile is "
                "set): a batch came in with a shape the warm-up did not cover. Check that every "
                f"loader pads with the run's pad policy. Dynamo said: {exc}"
            ) from exc
        raise
    finally:
        torch._dynamo.config.error_on_recompile = previous
