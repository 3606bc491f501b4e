"""The curves as a PNG: held-out tau against optimizer step and against training time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .read import Curve

# --x: which panels, left to right.
PANELS = {"both": ("step", "time"), "step": ("step",), "time": ("time",)}
# Training time shown in the unit that keeps the axis numbers short.
TIME_UNITS = ((7200.0, 3600.0, "h"), (120.0, 60.0, "min"), (0.0, 1.0, "s"))


def time_unit(longest_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for an axis whose longest time is `longest_s`."""
    for threshold, scale, name in TIME_UNITS:
        if longest_s >= threshold:
            return scale, name
    return 1.0, "s"


def curves_figure(curves: Sequence[Curve], x: str = "both", tokens: int | None = None) -> Any:
    """A matplotlib Figure: one panel per x axis of `x`, one line per run, a marker per eval;
    `tokens`: the curves are served_at(tokens), which the titles say.

    The time panel leaves out runs that recorded no training time (older versions); it raises
    ValueError when that is every run, since it would be empty.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # an optional extra: the table needs nothing
        raise RuntimeError("--out needs matplotlib: pip install 'specdraft-trainer[plot]'") from exc

    panels = PANELS[x]
    timed = [curve for curve in curves if curve.timed]
    if "time" in panels and not timed:
        raise ValueError(
            "no run records its training time (time/train_s; written from this version on): "
            "draw against steps with --x step"
        )
    # The Agg canvas is attached to this figure alone: no pyplot state, no display needed.
    figure = Figure(figsize=(6.5 * len(panels), 4.5))
    FigureCanvasAgg(figure)
    longest = max((p.train_s or 0.0 for c in timed for p in c.points), default=0.0)
    scale, unit = time_unit(longest)
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        for curve in curves if panel == "step" else timed:
            xs = [p.step if panel == "step" else (p.train_s or 0.0) / scale for p in curve.points]
            axes.plot(xs, [p.tau for p in curve.points], marker="o", label=curve.label)
        if panel == "step":
            axes.set_xlabel("optimizer step")
        else:
            axes.set_xlabel(f"training time ({unit}; evaluation and checkpoints excluded)")
        within = f", {tokens} speculative tokens" if tokens else ""
        axes.set_ylabel(f"held-out tau (acceptance length{within})")
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.suptitle(f"held-out tau, served at {tokens} tokens a step" if tokens else "held-out tau")
    figure.tight_layout()
    return figure


def save_curves_plot(
    curves: Sequence[Curve], path: str | Path, x: str = "both", tokens: int | None = None
) -> Any:
    """Draw the curves (see curves_figure) into a PNG file; return the figure."""
    figure = curves_figure(curves, x, tokens)
    figure.savefig(path, dpi=120)
    return figure
