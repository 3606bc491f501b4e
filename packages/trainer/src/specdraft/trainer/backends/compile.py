"""Per-block torch.compile, in place before sharding, with Dynamo limits set from the plan."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch._dynamo
from torch import nn

from specdraft.config import CompilePlan

log = logging.getLogger(__name__)

# The plan configure_dynamo last applied: Dynamo's limits are process-wide, and an error about
# them should quote the numbers the run planned.
_active_plan: CompilePlan | None = None

# Debugging and fast checks: the torch.compile backend of the draft blocks (default "inductor").
# "aot_eager" traces the same Dynamo graphs and AOT autograd joint graphs, so graph counts,
# guards, recompiles and the limits behave the same, without code generation (seconds instead of
# minutes per graph on a CPU). Never set it for a run whose speed matters.
COMPILE_BACKEND_ENV = "SPECDRAFT_COMPILE_BACKEND"


def compile_backend() -> str:
    """The torch.compile backend for the draft blocks: $SPECDRAFT_COMPILE_BACKEND or inductor."""
    return os.environ.get(COMPILE_BACKEND_ENV, "").strip() or "inductor"


class RecompileError(RuntimeError):
    """A compiled block recompiled after warm-up, or hit Dynamo's recompile limit."""


def configure_dynamo(plan: CompilePlan) -> None:
    """Set Dynamo's limits so every planned static shape gets its own graph."""
    global _active_plan
    if plan.recompile_limit is None:
        return
    _active_plan = plan
    cfg = torch._dynamo.config
    # recompile_limit caps the cache entries of one code object (per nn.Module instance only when
    # Dynamo ID-matches `self`, i.e. after a graph break). The blocks of one class share their
    # forward's code object and are not ID-matched, so they share one count: raise it to the
    # graphs all blocks of the class need (shapes x grad variants, + eval), plus slack. A limit
    # the user raised further is kept.
    cfg.recompile_limit = max(cfg.recompile_limit, plan.recompile_limit)
    # accumulated_recompile_limit caps the entries of one code object over all module instances;
    # the plan sizes it for the case where a graph break makes every block count on its own.
    cfg.accumulated_recompile_limit = max(
        cfg.accumulated_recompile_limit, plan.accumulated_recompile_limit or 0
    )
    # Hitting a limit would otherwise silently run the block eagerly from then on (slow, and a
    # benchmark would lie): make it an error, which `explain_recompile_limit` makes readable.
    cfg.fail_on_recompile_limit_hit = True
    # automatic_dynamic_shapes is left alone on purpose: compile(dynamic=False) already turns it
    # off for the compiled blocks (so a second length gets a new static graph, never a symbolic
    # one), and switching it off process-wide would change other compiled code too.


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
    backend = compile_backend()
    if backend != "inductor":
        log.warning(
            "%s=%s: draft blocks compile without code generation", COMPILE_BACKEND_ENV, backend
        )
    for block in layers:
        # In place: block.compile() keeps the module and its parameter names, so FSDP wraps it
        # the same way and checkpoints load whether or not blocks were compiled.
        block.compile(dynamic=plan.dynamic, backend=backend)
    return len(layers)


def compiled_graph_count() -> int:
    """Graphs Dynamo has compiled in this process so far (each new shape or guard is one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def _caused_by(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`exc` or the first exception of that kind in its cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def recompile_limit_message(exc: BaseException) -> str:
    """What to tell the user when a compiled block hit one of Dynamo's recompile limits."""
    cause = str(exc.__cause__ or exc)
    found = re.search(r"Limit type: (\w+)", cause)
    limit_type = found.group(1) if found else "recompile_limit"
    current = getattr(torch._dynamo.config, limit_type, "?")
    plan = _active_plan
    if plan is not None:
        planned = (
            f"The run's compile plan needs {plan.graphs_per_block} graphs per block class "
            f"({plan.arithmetic()}) and sets "
            f"recompile_limit = {plan.recompile_limit}, accumulated_recompile_limit = "
            f"{plan.accumulated_recompile_limit}."
        )
    else:
        planned = "No compile plan set the limits (compile_blocks without static shapes?)."
    return (
        f"a compiled draft block hit Dynamo's {limit_type} "
        f"(torch._dynamo.config.{limit_type} = {current}). {planned} Either the limit was "
        "lowered after specdraft set it (by your code or another library), or blocks see more "
        "shapes than the plan counts: check that every loader pads with the run's shape policy "
        "(training.static_shapes / training.static_shape_buckets / "
        "training.static_anchor_buckets / data.max_length) and run "
        "with TORCH_LOGS=recompiles to see which guard failed."
    )


@contextmanager
def explain_recompile_limit() -> Iterator[None]:
    """Turn Dynamo's bare recompile-limit failure into a RecompileError that names the plan."""
    try:
        yield
    except Exception as exc:
        hit = _caused_by(exc, torch._dynamo.exc.FailOnRecompileLimitHit)
        if hit is None:
            raise
        raise RecompileError(recompile_limit_message(hit)) from exc


@contextmanager
def forbid_recompiles(enabled: bool) -> Iterator[None]:
    """Inside, a recompile raises RecompileError when `enabled` (training.fail_on_recompile).

    Recompile-limit failures are explained either way.
    """
    previous = torch._dynamo.config.error_on_recompile
    if enabled:
        # Dynamo raises instead of compiling once any guard of an existing graph fails.
        torch._dynamo.config.error_on_recompile = True
    try:
        with explain_recompile_limit():
            yield
    except Exception as exc:
        recompile = _caused_by(exc, torch._dynamo.exc.RecompileError)
        if not enabled or recompile is None:
            raise
        raise RecompileError(
            "a compiled draft block recompiled after warm-up (training.fail_on_recompile = "
            "true): a batch came in with a shape the warm-up did not build. Check that every "
            "loader pads with the run's pad policy (training.static_shapes / "
            f"training.static_shape_buckets / data.max_length). Dynamo said: {recompile}"
        ) from exc
    finally:
        torch._dynamo.config.error_on_recompile = previous
