"""The compile-plan arithmetic: pure numbers under `ShapePolicy`.

Runs do not call these directly: `ShapePolicy.compile_plan` counts the graphs of the run's grid,
so the pad policy and the Dynamo limits can never disagree between call sites.
"""

from __future__ import annotations

from dataclasses import dataclass

# Headroom over the counted graphs: the reference note's `2 * buckets + 4` keeps 4 spare entries
# for guards Dynamo may add on its own (e.g. a grad-mode or dtype guard failing once).
RECOMPILE_SLACK = 4


@dataclass(frozen=True)
class CompilePlan:
    """How compiled draft blocks are set up for a run (pure numbers, no torch).

    Graphs per block = lengths x (anchor widths x train grad variants + eval): training traces
    every (length, width) cell; evaluation predicts at num_anchors slots, one graph per length.
    """

    enabled: bool
    dynamic: bool | None  # False = one static graph per shape; None = Dynamo decides
    num_shapes: int  # static input lengths (0 = dynamic lengths)
    graphs_per_shape: int  # graphs per length: widths x grad variants, + 1 with evaluation
    graphs_per_block: int  # graphs one block's code object holds after warm-up
    recompile_limit: int | None  # torch._dynamo.config.recompile_limit to set (None = leave)
    accumulated_recompile_limit: int | None
    num_widths: int = 1  # static anchor widths (the second dimension)
    train_graphs_per_cell: int = 0  # grad variants per (length, width) cell
    eval_graphs_per_shape: int = 0  # the no-grad evaluation forward, per length

    @property
    def num_cells(self) -> int:
        """Static (length, anchor width) cells training runs."""
        return self.num_shapes * self.num_widths

    def arithmetic(self) -> str:
        """The count spelled out: `3 length(s) x (2 width(s) x 2 + 1) = 15`."""
        widths = (
            f"{self.num_widths} width(s) x {self.train_graphs_per_cell}"
            if self.num_widths > 1
            else f"{self.train_graphs_per_cell}"
        )
        inner = f"{widths} + {self.eval_graphs_per_shape}" if self.eval_graphs_per_shape else widths
        if self.num_widths > 1 or self.eval_graphs_per_shape:
            inner = f"({inner})"
        return f"{self.num_shapes} length(s) x {inner} = {self.graphs_per_block}"

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
            f"compile_blocks on, dynamic=False: {self.arithmetic()} graphs per block class; "
            f"Dynamo recompile_limit = {self.recompile_limit}, accumulated_recompile_limit = "
            f"{self.accumulated_recompile_limit}"
        )


def graphs_per_shape(with_eval: bool, num_blocks: int = 2) -> int:
    """Graphs one compiled block class needs per static shape (one anchor width).

    Training traces the blocks twice per shape: the first block's input comes from the frozen
    embedding and has no grad, the others' inputs do, and `requires_grad` is guarded on (a
    one-block draft has only the first kind). A no-grad forward (evaluation) is one more graph
    per shape, because grad mode is guarded too.
    """
    train = 2 if num_blocks > 1 else 1
    return train + (1 if with_eval else 0)


def compile_plan_from(
    *,
    compile_blocks: bool,
    num_shapes: int | None,
    with_eval: bool,
    num_blocks: int = 1,
    num_widths: int = 1,
) -> CompilePlan:
    """The compile plan for `num_shapes` static lengths (None = dynamic) x `num_widths` widths.

    Use `ShapePolicy.compile_plan`, which fills in the counts from the run's grid.
    """
    if not compile_blocks:
        return CompilePlan(False, None, 0, 0, 0, None, None)
    if not num_shapes:
        return CompilePlan(True, None, 0, 0, 0, None, None)
    train = graphs_per_shape(False, num_blocks)
    evaluate = 1 if with_eval else 0
    per_shape = num_widths * train + evaluate
    per_block = per_shape * num_shapes
    # The limit is counted per code object, so all blocks of one class share it: the count per
    # block is the count per code object.
    limit = per_block + RECOMPILE_SLACK
    # torch 2.13's accumulated limit caps the cache entries of one code object across all its
    # recompile reasons; keep it well above the per-frame limit (never below Dynamo's default).
    accumulated = max(256, limit * (num_blocks + 2))
    return CompilePlan(
        True, False, num_shapes, per_shape, per_block, limit, accumulated, num_widths, train,
        evaluate,
    )  # fmt: skip
