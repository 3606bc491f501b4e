"""Packing accounting: what packed rows compute for a corpus, and how many anchors each gets.

The micro-batches come from the training sampler's packing mode (`MicroBatchSampler`, epoch 0,
every rank) and the rows from the collator's `split_rows`, so the numbers are the ones training
computes. A packed micro-batch computes `micro_batch_size` rows (the trainer pads the batch
dimension under static shapes) of `pad_length(fullest row)` positions each.

Anchors: a row draws `min(num_anchors, its valid anchors)` anchors uniformly over the valid
positions of all its documents, so a conversation with c of a row's V valid anchors expects
`c * min(1, num_anchors / V)`; summed over a row that is `min(num_anchors, V)`. Without packing a
conversation gets `min(num_anchors, c)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft.config import ShapePolicy

from .packing import split_rows
from .samplers import MicroBatchSampler

# Row-fill histogram bins (share of the padded row that holds real tokens).
FILL_BINS = 20
# The PNG text key under which save_row_fill_plot stores the numbers it drew.
ROW_FILL_PLOT_KEY = "specdraft-row-fill"


@dataclass(frozen=True)
class PackingStats:
    """What one packing policy computes on a corpus over one epoch (all ranks)."""

    name: str
    shapes: ShapePolicy
    micro_batch_size: int
    optimizer_steps: int
    micro_batches: int  # non-empty ones
    rows: int  # rows holding at least one document
    documents: int
    real_tokens: int
    computed_positions: int  # micro_batch_size x padded length, per non-empty micro-batch
    fill_histogram: tuple[int, ...]  # rows per fill bin (real tokens / padded row length)
    # With the corpus's loss masks (None from a lengths file):
    valid_anchors: int | None = None  # sum over documents of their valid anchors
    drawn_anchors: int | None = None  # sum over rows of min(num_anchors, row's valid anchors)
    unpacked_anchors: int | None = None  # sum over documents of min(num_anchors, valid)
    computed_blocks: int | None = None  # micro_batch_size x anchor width, per micro-batch

    @property
    def positions_per_real_token(self) -> float:
        """Computed positions per real token (1.0 = no padding)."""
        return self.computed_positions / self.real_tokens if self.real_tokens else 0.0

    @property
    def fill(self) -> float:
        """Real tokens / computed positions."""
        return self.real_tokens / self.computed_positions if self.computed_positions else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        pad_to = self.shapes.pad_to
        steps = self.optimizer_steps
        out: dict[str, Any] = {
            "name": self.name,
            "pad_to": list(pad_to) if isinstance(pad_to, tuple) else pad_to,
            "description": self.shapes.describe_lengths(),
            "row_capacity": self.shapes.row_capacity,
            "optimizer_steps": steps,
            "micro_batches": self.micro_batches,
            "rows": self.rows,
            # Rows of zeros the trainer adds to fill micro-batches to micro_batch_size.
            "padding_rows": self.micro_batches * self.micro_batch_size - self.rows,
            "rows_per_optimizer_step": self.rows / steps if steps else 0.0,
            "computed_rows_per_optimizer_step": (
                self.micro_batches * self.micro_batch_size / steps if steps else 0.0
            ),
            "documents": self.documents,
            "documents_per_row": self.documents / self.rows if self.rows else 0.0,
            "documents_per_optimizer_step": self.documents / steps if steps else 0.0,
            "real_tokens": self.real_tokens,
            "computed_positions": self.computed_positions,
            "fill": self.fill,
            "positions_per_real_token": self.positions_per_real_token,
            "fill_histogram": {"bins": FILL_BINS, "rows": list(self.fill_histogram)},
            "anchors": None,
        }
        if self.drawn_anchors is not None and self.documents:
            docs = self.documents
            out["anchors"] = {
                "num_anchors": self.shapes.num_anchors,
                "valid_anchors": self.valid_anchors,
                "anchors_per_conversation": self.drawn_anchors / docs,
                "anchors_per_conversation_unpacked": (self.unpacked_anchors or 0) / docs,
                "computed_blocks": self.computed_blocks,
                "occupancy": (
                    self.drawn_anchors / self.computed_blocks if self.computed_blocks else 0.0
                ),
            }
        return out


def _fill_bin(fill: float) -> int:
    return min(FILL_BINS - 1, max(0, int(fill * FILL_BINS)))


def account_packing(
    lengths: Sequence[int],
    shapes: ShapePolicy,
    *,
    micro_batch_size: int,
    grad_accum_steps: int,
    num_replicas: int = 1,
    seed: int = 0,
    mega_batch_multiplier: int = 50,
    counts: Sequence[int] | None = None,
    name: str = "packing",
) -> PackingStats:
    """One epoch of the training sampler's packed plan under `shapes` (a packing policy)."""
    if not shapes.packing or shapes.row_capacity is None:
        raise ValueError("packing accounting needs a packing shape policy (training.packing)")
    capacity = shapes.row_capacity
    clipped = [min(int(n), capacity) for n in lengths]
    if counts is not None and len(counts) != len(clipped):
        raise ValueError(f"{len(counts)} anchor counts for {len(clipped)} samples")
    sampler = MicroBatchSampler(
        clipped,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        num_replicas=num_replicas,
        seed=seed,
        mode="packed",
        pad_to=shapes,
        mega_batch_multiplier=mega_batch_multiplier,
    )
    plan = sampler.epoch_plan(0)
    num = shapes.num_anchors
    histogram = [0] * FILL_BINS
    micro_batches = rows = documents = real = computed = 0
    valid = drawn = unpacked = blocks = 0
    for batch in (b for rank in plan for b in rank if b):
        groups = split_rows([clipped[i] for i in batch], capacity)
        totals = [sum(clipped[batch[p]] for p in group) for group in groups]
        padded = shapes.pad_length(max(totals))
        micro_batches += 1
        rows += len(groups)
        documents += len(batch)
        real += sum(totals)
        computed += micro_batch_size * padded
        for total in totals:
            histogram[_fill_bin(total / padded)] += 1
        if counts is not None and num is not None:
            row_valid = [sum(int(counts[batch[p]]) for p in group) for group in groups]
            valid += sum(row_valid)
            drawn += sum(min(num, v) for v in row_valid)
            unpacked += sum(min(num, int(counts[i])) for i in batch)
            blocks += micro_batch_size * shapes.anchor_width(max(row_valid))
    with_anchors = counts is not None and num is not None
    return PackingStats(
        name=name,
        shapes=shapes,
        micro_batch_size=micro_batch_size,
        optimizer_steps=len(plan[0]) // grad_accum_steps,
        micro_batches=micro_batches,
        rows=rows,
        documents=documents,
        real_tokens=real,
        computed_positions=computed,
        fill_histogram=tuple(histogram),
        valid_anchors=valid if with_anchors else None,
        drawn_anchors=drawn if with_anchors else None,
        unpacked_anchors=unpacked if with_anchors else None,
        computed_blocks=blocks if with_anchors else None,
    )


def save_row_fill_plot(report: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """Draw the packed rows' fill histogram (one series per packing policy) into a PNG.

    Returns the numbers drawn; they are also stored in the PNG's text chunk ROW_FILL_PLOT_KEY.
    """
    packing = report.get("packing")
    if not packing:
        raise ValueError("the row-fill plot needs training.packing = true and sample lengths")
    try:
        import matplotlib
    except ImportError as exc:  # an optional extra, as for the length histogram
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'specdraft-collate[plot]'"
        ) from exc

    matplotlib.use("Agg")  # no display on training nodes or in CI
    import matplotlib.pyplot as plt

    edges = [100.0 * k / FILL_BINS for k in range(FILL_BINS)]
    width = 100.0 / FILL_BINS / max(1, len(packing))
    figure, axes = plt.subplots(figsize=(9, 4))
    drawn: dict[str, Any] = {"bin_edges_percent": edges, "series": {}}
    for k, variant in enumerate(packing):
        rows = variant["fill_histogram"]["rows"]
        axes.bar(
            [e + k * width for e in edges],
            rows,
            width=width,
            align="edge",
            label=f"{variant['name']} (fill {variant['fill']:.1%})",
        )
        drawn["series"][variant["name"]] = list(rows)
    axes.set_xlabel("row fill: real tokens / padded row length (%)")
    peak = max((max(rows) for rows in drawn["series"].values()), default=0)
    if peak > 20:
        # Nearly every row is full: a log axis keeps the few partly filled rows visible.
        axes.set_yscale("symlog", linthresh=1)
        axes.set_ylabel("packed rows (log scale)")
    else:
        axes.set_ylabel("packed rows")
    axes.set_xlim(0, 100)
    axes.set_title(f"{report['source']['description']}: packed row fill, one epoch")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={ROW_FILL_PLOT_KEY: json.dumps(drawn)})
    plt.close(figure)
    return drawn
