"""Effective shape buckets and the compile plan they imply: pure functions, one source of truth.

Every caller (collate's `static_pad_length`, the backends, `explain-buckets`, the linter and
`train --dry-run`) goes through `effective_buckets` and `compile_plan`, so the pad policy and the
Dynamo limits can never disagree between call sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .schema import Config

# Headroom over the counted graphs: the reference note's `2 * buckets + 4` keeps 4 spare entries
# for guards Dynamo may add on its own (e.g. a grad-mode or dtype guard failing once).
RECOMPILE_SLACK = 4


def effective_buckets_from(
    static_shapes: bool, max_length: int, buckets: list[int] | tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """Ascending bucket tuple with max_length appended, or None when buckets are not in use."""
    if not static_shapes or not buckets:
        return None
    resolved = tuple(sorted(set(int(b) for b in buckets if int(b) <= max_length)))
    if not resolved or resolved[-1] != max_length:
        resolved = (*resolved, max_length)
    return resolved


def effective_buckets(config: Config) -> tuple[int, ...] | None:
    """The run's effective shape buckets (max_length always last), or None without buckets."""
    return effective_buckets_from(
        config.training.static_shapes, config.data.max_length, config.training.static_shape_buckets
    )


def max_length_appended(config: Config) -> bool:
    """True when max_length was not listed in static_shape_buckets and is appended."""
    buckets = config.training.static_shape_buckets
    return bool(config.training.static_shapes and buckets and buckets[-1] != config.data.max_length)


def static_lengths(config: Config) -> tuple[int, ...] | None:
    """All static lengths a run pads to: the buckets, (max_length,), or None for pad-to-longest."""
    buckets = effective_buckets(config)
    if buckets is not None:
        return buckets
    if config.training.static_shapes:
        return (config.data.max_length,)
    return None


@dataclass(frozen=True)
class CompilePlan:
    """How compiled draft blocks are set up for a run (pure numbers, no torch)."""

    enabled: bool
    dynamic: bool | None  # False = one static graph per shape; None = Dynamo decides
    num_shapes: int  # static input lengths (0 = dynamic lengths)
    graphs_per_shape: int  # train: grad / no-grad block input; +1 for the eval no-grad forward
    graphs_per_block: int  # graphs one block's code object holds after warm-up
    recompile_limit: int | None  # torch._dynamo.config.recompile_limit to set (None = leave)
    accumulated_recompile_limit: int | None

    def describe(self) -> str:
        """One line for logs, `--dry-run` and `explain-buckets`."""
        if not self.enabled:
            return "compile_blocks off: blocks run eagerly"
        if self.dynamic is None:
            return (
                "compile_blocks on with dynamic lengths: Dynamo decides, and every new length "
                "may recompile (turn on static_shapes to avoid it)"
            )
        return (
            f"compile_blocks on, dynamic=False: {self.num_shapes} static shape(s) x "
            f"{self.graphs_per_shape} graphs = {self.graphs_per_block} graphs per block class; "
            f"Dynamo recompile_limit = {self.recompile_limit}, accumulated_recompile_limit = "
            f"{self.accumulated_recompile_limit}"
        )


def graphs_per_shape(with_eval: bool, num_blocks: int = 2) -> int:
    """Graphs one compiled block class needs per static shape.

    Training traces the blocks twice per shape: the first block's input comes from the frozen
    embedding and has no grad, the others' inputs do, and `requires_grad` is guarded on (a
    one-block draft has only the first kind). A no-grad forward (evaluation) is one more graph
    per shape, because grad mode is guarded too.
    """
    train = 2 if num_blocks > 1 else 1
    return train + (1 if with_eval else 0)


def compile_plan_from(
    *, compile_blocks: bool, num_shapes: int | None, with_eval: bool, num_blocks: int = 1
) -> CompilePlan:
    """The compile plan for `num_shapes` static lengths (None = dynamic) and evaluation on/off."""
    if not compile_blocks:
        return CompilePlan(False, None, 0, 0, 0, None, None)
    if not num_shapes:
        return CompilePlan(True, None, 0, 0, 0, None, None)
    per_shape = graphs_per_shape(with_eval, num_blocks)
    per_block = per_shape * num_shapes
    # The limit is counted per code object, so all blocks of one class share it: the count per
    # block is the count per code object.
    limit = per_block + RECOMPILE_SLACK
    # torch 2.13's accumulated limit caps the cache entries of one code object across all its
    # recompile reasons; keep it well above the per-frame limit (never below Dynamo's default).
    accumulated = max(256, limit * (num_blocks + 2))
    return CompilePlan(True, False, num_shapes, per_shape, per_block, limit, accumulated)


def compile_plan(config: Config, *, with_eval: bool | None = None) -> CompilePlan:
    """The compile plan of a run; evaluation counts when eval data is configured."""
    if with_eval is None:
        with_eval = bool(config.data.eval_paths)
    lengths = static_lengths(config)
    return compile_plan_from(
        compile_blocks=config.training.compile_blocks,
        num_shapes=len(lengths) if lengths else None,
        with_eval=with_eval,
        num_blocks=config.model.num_draft_layers,
    )
