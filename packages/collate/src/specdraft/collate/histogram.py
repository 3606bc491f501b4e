"""The length histogram of explain-buckets, with bucket edges: as data, as text, as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdraft.config import BUCKET_QUANTUM

HISTOGRAM_MAX_ROWS = 32
HISTOGRAM_BAR_WIDTH = 40


def _bin_width(max_length: int, configured: Sequence[int], suggested: Sequence[int]) -> int:
    """The narrowest multiple of 128 that fits the rows, with as many edges on bin ends as fit."""
    cells = -(-max_length // BUCKET_QUANTUM)
    # Configured edges matter more than suggested ones; a readable height matters most.
    for edges in ([*configured, *suggested], list(configured), []):
        for factor in range(1, cells + 1):
            width = factor * BUCKET_QUANTUM
            rows = -(-max_length // width)
            if rows <= HISTOGRAM_MAX_ROWS and all(edge % width == 0 for edge in edges):
                return width
    return BUCKET_QUANTUM * -(-cells // HISTOGRAM_MAX_ROWS)


def length_histogram(
    lengths: Sequence[int], max_length: int, edges: Sequence[int], suggested: Sequence[int] = ()
) -> dict[str, Any]:
    """Sample counts per length bin, with the bucket edges (configured and suggested)."""
    width = _bin_width(max_length, edges, suggested)
    rows = -(-max_length // width)
    counts = [0] * rows
    for length in lengths:
        counts[min(rows - 1, max(0, (length - 1) // width))] += 1
    return {
        "bin_width": width,
        "bins": [
            {"start": i * width + 1, "end": min((i + 1) * width, max_length), "count": counts[i]}
            for i in range(rows)
        ],
        "edges": list(edges),
        "suggested_edges": list(suggested),
    }


def render_histogram(histogram: dict[str, Any]) -> list[str]:
    """The histogram as terminal lines; after each bin, a rule for the bucket edges inside it."""
    bins = histogram["bins"]
    peak = max((b["count"] for b in bins), default=0) or 1
    edges, suggested = set(histogram["edges"]), set(histogram["suggested_edges"])
    label_width = len(f"{bins[-1]['start']}-{bins[-1]['end']}") if bins else 0
    lines = [
        f"length histogram (samples per {histogram['bin_width']} tokens; "
        f"'--- bucket' = configured edge, '... suggested' = suggested edge)"
    ]
    for b in bins:
        label = f"{b['start']}-{b['end']}".rjust(label_width)
        bar = "#" * round(HISTOGRAM_BAR_WIDTH * b["count"] / peak)
        if b["count"] and not bar:
            bar = "."
        lines.append(f"  {label} | {bar.ljust(HISTOGRAM_BAR_WIDTH)} {b['count']}")
        marks = []
        for edge in sorted(e for e in edges if b["start"] <= e <= b["end"]):
            marks.append(f"--- bucket {edge}" + ("" if edge == b["end"] else " (inside the bin)"))
        for edge in sorted(e for e in suggested if b["start"] <= e <= b["end"]):
            marks.append(f"... suggested {edge}" + ("" if edge == b["end"] else " (inside)"))
        if marks:
            lines.append(f"  {' ' * label_width} +{'  '.join(marks)}")
    return lines


def save_plot(report: dict[str, Any], path: str | Path) -> None:
    """Draw the length histogram with the bucket edges into a PNG file."""
    try:
        import matplotlib
    except ImportError as exc:  # an optional extra: the terminal histogram needs nothing
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'specdraft-collate[plot]'"
        ) from exc

    matplotlib.use("Agg")  # no display on training nodes or in CI
    import matplotlib.pyplot as plt

    histogram = report["histogram"]
    if histogram is None:
        raise ValueError("--plot needs sample lengths (a corpus or --lengths), not --longest")
    bins = histogram["bins"]
    figure, axes = plt.subplots(figsize=(9, 4))
    axes.bar(
        [b["start"] - 1 for b in bins],
        [b["count"] for b in bins],
        width=histogram["bin_width"],
        align="edge",
        color="#4c72b0",
        label="samples",
    )
    for i, edge in enumerate(histogram["edges"]):
        axes.axvline(edge, color="#c44e52", label="configured bucket" if i == 0 else None)
    for i, edge in enumerate(histogram["suggested_edges"]):
        axes.axvline(
            edge, color="#55a868", linestyle="--", label="suggested bucket" if i == 0 else None
        )
    axes.set_xlabel("sample length (tokens)")
    axes.set_ylabel("samples")
    axes.set_title(
        f"{report['source']['description']}: lengths at max_length {report['max_length']}"
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
