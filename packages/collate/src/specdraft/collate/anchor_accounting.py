"""Anchor accounting: how many anchor blocks a shape policy computes for a corpus, and where.

A micro-batch computes `rows x anchor width` draft blocks; only `min(num_anchors, valid anchors)`
of each row's blocks carry loss. "Anchor occupancy" is valid blocks / computed blocks (1.0 = no
empty block at all). Micro-batches come from the same sampler the trainer uses, the per-sample
anchor counts from the same loss masks (`padding.anchor_counts`), and the width from the run's
`ShapePolicy`, so the numbers are what training will compute. `save_grid_plot` draws the
length x anchor-width grid of an explain-buckets report (`--plot`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


# The PNG text key under which save_grid_plot stores the numbers it drew (tools and tests read
# them back instead of pixels).
GRID_PLOT_KEY = "specdraft-shape-grid"


def grid_matrices(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The grid cells of an explain-buckets report as matrices [length][width] for a figure."""
    lengths = sorted({int(c["length"]) for c in cells})
    widths = sorted({int(c["width"]) for c in cells})
    batches = [[0] * len(widths) for _ in lengths]
    # None where a cell gets no micro-batch: its occupancy is undefined, not 0%.
    occupancy: list[list[float | None]] = [[None] * len(widths) for _ in lengths]
    for c in cells:
        row, col = lengths.index(int(c["length"])), widths.index(int(c["width"]))
        batches[row][col] = int(c["micro_batches"])
        if c["micro_batches"]:
            occupancy[row][col] = float(c["occupancy"])
    return {"lengths": lengths, "widths": widths, "micro_batches": batches, "occupancy": occupancy}


def save_grid_plot(report: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """Draw the length x anchor-width grid (micro-batches and occupancy per cell) into a PNG.

    Returns the numbers drawn; they are also stored in the PNG's text chunk GRID_PLOT_KEY.
    """
    anchors = report.get("anchors")
    if not anchors or not anchors.get("cells"):
        raise ValueError(
            "the shape grid needs static shapes and the corpus's loss masks (no --lengths / "
            "--longest)"
        )
    try:
        import matplotlib
    except ImportError as exc:  # an optional extra, as for the length histogram
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'specdraft-collate[plot]'"
        ) from exc

    matplotlib.use("Agg")  # no display on training nodes or in CI
    import matplotlib.pyplot as plt
    import numpy as np

    grid = grid_matrices(anchors["cells"])
    lengths, widths = grid["lengths"], grid["widths"]
    counts = np.array(grid["micro_batches"], dtype=float)
    occupancy = np.array(
        [[np.nan if v is None else 100.0 * v for v in row] for row in grid["occupancy"]]
    )
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(4 + 1.6 * len(widths), 1.5 + 0.7 * len(lengths)), squeeze=True
    )
    drawn: dict[str, Any] = {"lengths": lengths, "widths": widths}
    panels = (
        (left, counts, "micro-batches per cell", "Blues", "{:.0f}", "micro_batches"),
        (right, occupancy, "anchor occupancy per cell (%)", "RdYlGn", "{:.1f}", "occupancy"),
    )
    for axes, values, title, cmap, fmt, key in panels:
        image = axes.imshow(values, cmap=cmap, aspect="auto", origin="lower")
        if key == "occupancy":
            image.set_clim(0.0, 100.0)
        # Read back what the axes hold: the PNG's numbers are the figure's, not a second copy.
        held = np.ma.filled(image.get_array().astype(float), np.nan)
        drawn[key] = [
            [None if np.isnan(v) else (v / 100.0 if key == "occupancy" else int(v)) for v in row]
            for row in held.tolist()
        ]
        # Light text on the dark end of the sequential map, so every count stays readable.
        dark = np.nanmax(values) * 0.6 if key == "micro_batches" else np.inf
        for row in range(len(lengths)):
            for col in range(len(widths)):
                value = values[row, col]
                axes.text(
                    col, row, "–" if np.isnan(value) else fmt.format(value),
                    ha="center", va="center", fontsize=9,
                    color="white" if value > dark else "black",
                )  # fmt: skip
        axes.set_xticks(range(len(widths)), [str(w) for w in widths])
        axes.set_yticks(range(len(lengths)), [str(n) for n in lengths])
        axes.set_xlabel("anchor width (blocks)")
        axes.set_ylabel("padded length (tokens)")
        axes.set_title(title)
        figure.colorbar(image, ax=axes)
    figure.suptitle(f"{report['source']['description']}: shape grid, one epoch")
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={GRID_PLOT_KEY: json.dumps(drawn)})
    plt.close(figure)
    return drawn
