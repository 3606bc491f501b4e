"""The curves report: a text table per run with its summary, and the same as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .read import EVAL_FIX, Curve
from .summary import Reach, reach, tau_summary

# Fewer evaluations than this is two points (start and end, eval_interval = 0), not a curve.
MIN_CURVE_POINTS = 3


def format_seconds(seconds: float | None) -> str:
    """Training time as `12.34 s`, with minutes or hours beside it once it is long."""
    if seconds is None:
        return "-"
    text = f"{seconds:.2f} s"
    if seconds >= 7200:
        return f"{text} ({seconds / 3600:.1f} h)"
    if seconds >= 120:
        return f"{text} ({seconds / 60:.1f} min)"
    return text


def _step(step: float) -> str:
    """A step, with one decimal when it was interpolated between evaluations."""
    rounded = round(step, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"


def reach_line(result: Reach, best_tau: float) -> str:
    """One run's `--reach` result in words."""
    if result.step is None:
        return f"tau {result.tau:g}: not reached (best {best_tau:.4f})"
    where = f"at {format_seconds(result.train_s)} of training, step {_step(result.step)}"
    if result.train_s is None:
        where = f"at step {_step(result.step)} (training time not recorded)"
    if result.between:
        where += f" (interpolated between the evals at {result.between[0]} and "
        where += f"{result.between[1]})"
    return f"tau {result.tau:g}: reached {where}"


def render_run(curve: Curve, reach_taus: Sequence[float]) -> list[str]:
    """The lines of one run: header, one row per evaluation, acceptance, summary, reaches."""
    lines = [f"{curve.label}  {curve.path}"]
    lines.append(
        f"  {curve.final_step} steps, {format_seconds(curve.train_s)} of training, "
        f"{len(curve.points)} evaluations"
    )
    if curve.torn_tail:
        lines.append("  (its last line was cut off, a run killed while writing it: skipped)")
    if not curve.timed:
        lines.append(
            "  (no training time on some evaluations, time/train_s: written by an older "
            "specdraft; those show steps only)"
        )
    lines.append(f"  {'step':>8}  {'train_s':>10}  {'tau':>7}")
    for point in curve.points:
        train_s = "-" if point.train_s is None else f"{point.train_s:.2f}"
        lines.append(f"  {point.step:>8}  {train_s:>10}  {point.tau:>7.4f}")
    last = curve.points[-1]
    rates = " ".join(f"{rate:.3f}" for rate in last.accept_rate_per_pos) or "-"
    lines.append(f"  accept rate per position at step {last.step}: {rates}")
    summary = tau_summary(curve)
    first, final, best = summary["first"], summary["last"], summary["best"]
    lines.append(
        f"  tau first {first['tau']:.4f} (step {first['step']}), last {final['tau']:.4f} "
        f"(step {final['step']}), best {best['tau']:.4f} (step {best['step']}, "
        f"{format_seconds(best['train_s'])})"
    )
    for tau in reach_taus:
        lines.append(f"  {reach_line(reach(curve, tau), best['tau'])}")
    if len(curve.points) < MIN_CURVE_POINTS:
        lines.append(f"  (only {len(curve.points)} evaluations, not a curve: {EVAL_FIX})")
    return lines


def render_comparison(curves: Sequence[Curve], tau: float) -> list[str]:
    """Each run's training time to reach `tau`, as a ratio to the first run that reached it."""
    results = [(curve, reach(curve, tau)) for curve in curves]
    timed = [(c, r) for c, r in results if r.reached and r.train_s]
    base = timed[0] if timed else None
    header = f"training time to reach tau {tau:g}"
    lines = [f"{header} (ratio to {base[0].label}):" if base else f"{header}:"]
    width = max(len(curve.label) for curve in curves)
    for curve, result in results:
        if result.step is None:
            lines.append(f"  {curve.label:<{width}}  not reached")
            continue
        ratio = ""
        if base is not None and base[1].train_s and result.train_s is not None:
            ratio = f"{result.train_s / base[1].train_s:.2f}x"
        row = f"  {curve.label:<{width}}  {format_seconds(result.train_s):>10}  "
        lines.append(f"{row}step {_step(result.step):<7}{ratio}".rstrip())
    return lines


def render_text(
    curves: Sequence[Curve],
    reach_taus: Sequence[float] = (),
    clock: str = "wall",
    tokens: int | None = None,
) -> str:
    """The whole text report: every run, then the runs side by side for each `--reach` tau;
    `tokens`: the curves were served_at(tokens), which the closing note says."""
    blocks = ["\n".join(render_run(curve, reach_taus)) for curve in curves]
    if len(curves) > 1:
        blocks += ["\n".join(render_comparison(curves, tau)) for tau in reach_taus]
    seconds = "CPU seconds of the run's process" if clock == "cpu" else "seconds"
    note = (
        f"training time: {seconds} inside optimizer steps (data wait included; warm-up,\n"
        "evaluation and checkpoint saves excluded); reach: linear between evaluations"
    )
    if tokens:
        note += (
            f"\ntau: as served with {tokens} speculative tokens a step (the acceptance of each "
            f"block's first {tokens} positions)"
        )
    return "\n\n".join([*blocks, note]) + "\n"


def curves_json(
    curves: Sequence[Curve],
    reach_taus: Sequence[float] = (),
    plot: str | None = None,
    tokens: int | None = None,
) -> dict[str, Any]:
    """The report as `--format json` prints it: per run its evaluations, summary and reaches."""
    return {
        "runs": [
            {
                "label": curve.label,
                "metrics": str(curve.path),
                "final_step": curve.final_step,
                "train_s": curve.train_s,
                "torn_last_line": curve.torn_tail,
                "evals": [point.as_dict() for point in curve.points],
                "summary": tau_summary(curve),
                "reach": [reach(curve, tau).as_dict() for tau in reach_taus],
            }
            for curve in curves
        ],
        "plot": plot,
        "speculative_tokens": tokens,
    }
