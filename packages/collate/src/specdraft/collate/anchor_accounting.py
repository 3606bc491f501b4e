"""Anchor accounting: how many anchor blocks a shape policy computes for a corpus, and where.

A micro-batch computes `rows x anchor width` draft blocks; only `min(num_anchors, valid anchors)`
of each row's blocks carry loss. "Anchor occupancy" is valid blocks / computed blocks (1.0 = no
empty block at all). Micro-batches come from the same sampler the trainer uses, the per-sample
anchor counts from the same loss masks (`padding.anchor_counts`), and the width from the run's
`ShapePolicy`, so the numbers are what training will compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdraft.config import ShapePolicy

from .samplers import MicroBatch


@dataclass(frozen=True)
class CellStats:
    """The micro-batches of one (length, anchor width) grid cell."""

    length: int
    width: int
    micro_batches: int
    share: float  # of all non-empty micro-batches
    valid_blocks: int
    computed_blocks: int

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        occupancy = self.valid_blocks / self.computed_blocks if self.computed_blocks else 0.0
        return {
            "length": self.length,
            "width": self.width,
            "micro_batches": self.micro_batches,
            "share": self.share,
            "valid_blocks": self.valid_blocks,
            "computed_blocks": self.computed_blocks,
            "occupancy": occupancy,
        }


@dataclass(frozen=True)
class AnchorReport:
    """What one shape policy's anchor dimension costs on a corpus."""

    description: str
    micro_batches: int
    valid_blocks: int
    computed_blocks: int
    cells: tuple[CellStats, ...] = field(default=())

    @property
    def occupancy(self) -> float:
        """Valid anchor blocks / computed anchor blocks."""
        return self.valid_blocks / self.computed_blocks if self.computed_blocks else 0.0

    @property
    def blocks_per_valid(self) -> float:
        """Computed anchor blocks per valid anchor (1.0 = no empty block)."""
        return self.computed_blocks / self.valid_blocks if self.valid_blocks else 0.0


def batch_anchor_count(counts: Sequence[int], batch: MicroBatch, num_anchors: int) -> int:
    """The micro-batch's largest per-sample anchor count, `max min(num_anchors, valid)`."""
    return max((min(num_anchors, counts[i]) for i in batch), default=0)


def account_anchors(
    lengths: Sequence[int],
    counts: Sequence[int],
    micro_batches: Sequence[MicroBatch],
    shapes: ShapePolicy,
) -> AnchorReport:
    """Valid and computed anchor blocks of `micro_batches` under `shapes`, per grid cell."""
    if shapes.num_anchors is None:
        raise ValueError("anchor accounting needs a shape policy with num_anchors")
    if len(counts) != len(lengths):
        raise ValueError(f"{len(counts)} anchor counts for {len(lengths)} samples")
    num = shapes.num_anchors
    non_empty = [batch for batch in micro_batches if batch]
    per_cell: dict[tuple[int, int], list[int]] = {cell: [0, 0, 0] for cell in shapes.grid}
    valid_total = computed_total = 0
    for batch in non_empty:
        width = shapes.anchor_width(batch_anchor_count(counts, batch, num))
        valid = sum(min(num, counts[i]) for i in batch)
        computed = len(batch) * width
        valid_total += valid
        computed_total += computed
        if shapes.grid:
            cell = per_cell[(shapes.pad_length(max(lengths[i] for i in batch)), width)]
            cell[0] += 1
            cell[1] += valid
            cell[2] += computed
    cells = tuple(
        CellStats(
            length=length,
            width=width,
            micro_batches=stats[0],
            share=stats[0] / len(non_empty) if non_empty else 0.0,
            valid_blocks=stats[1],
            computed_blocks=stats[2],
        )
        for (length, width), stats in per_cell.items()
    )
    return AnchorReport(
        shapes.describe_anchors(), len(non_empty), valid_total, computed_total, cells
    )


def anchor_weights(
    counts: Sequence[int], micro_batches: Sequence[MicroBatch], num_anchors: int
) -> dict[int, int]:
    """Rows per needed width: weights[w] = rows of micro-batches whose largest count is w (>=1)."""
    weights: dict[int, int] = {}
    for batch in micro_batches:
        if batch:
            need = max(1, batch_anchor_count(counts, batch, num_anchors))
            weights[need] = weights.get(need, 0) + len(batch)
    return weights


def anchor_bucket_cost(buckets: Sequence[int], weights: dict[int, int]) -> int:
    """Computed anchor blocks of `weights` (from anchor_weights) under ascending `buckets`."""
    cost = 0
    for need, rows in weights.items():
        width = next((b for b in buckets if b >= need), None)
        if width is None:
            raise ValueError(f"anchor buckets {tuple(buckets)} do not hold a count of {need}")
        cost += rows * width
    return cost


def optimal_anchor_buckets(weights: dict[int, int], num_anchors: int, k: int) -> tuple[int, ...]:
    """The k anchor widths (last = num_anchors) that minimise anchor_bucket_cost, exactly.

    Only the counts that occur matter: a width can always drop to the largest count it holds
    without holding less, so the candidates are the distinct counts plus num_anchors, and the
    same dynamic program as the length suggestion picks k of them (the last fixed).
    """
    if k < 1:
        raise ValueError(f"cannot choose {k} anchor buckets; choose k >= 1")
    values = sorted({min(need, num_anchors) for need in weights} | {num_anchors})
    k = min(k, len(values))
    rows = [weights.get(v, 0) for v in values]
    prefix = [0]
    for r in rows:
        prefix.append(prefix[-1] + r)
    n = len(values)
    inf = float("inf")
    # best[t][c]: least cost of values[0..c] with t widths, the largest at values[c].
    best = [[inf] * n for _ in range(k + 1)]
    parent = [[-1] * n for _ in range(k + 1)]
    for c in range(n):
        best[1][c] = values[c] * prefix[c + 1]
    for t in range(2, k + 1):
        for c in range(t - 1, n):
            for p in range(t - 2, c):
                candidate = best[t - 1][p] + values[c] * (prefix[c + 1] - prefix[p + 1])
                if candidate < best[t][c]:
                    best[t][c], parent[t][c] = candidate, p
    chosen, c = [], n - 1
    for t in range(k, 0, -1):
        chosen.append(values[c])
        c = parent[t][c]
    return tuple(reversed(chosen))
