"""Markdown tables in the form of the reference note's: one per workload and algorithm."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .results import RunResult
from .variants import BY_KEY, VARIANTS

DASH = "–"

OFFLINE_COLUMNS = (
    "variant",
    "steady step time",
    "Δ vs {baseline}",
    # With several shapes a step's time depends on its bucket: the median hides the rare long
    # steps, the mean is what throughput pays. Both over the same window.
    "mean step time (Δ)",
    "samples/s ({ranks})",
    # Model FLOPs per device over the step's wall time, and that over the device's peak.
    "model TFLOP/s (MFU)",
    "peak memory per rank",
    "Δ memory",
    "computed positions per real token",
    "computed anchor blocks per valid anchor",
    # Packing spreads a row's anchors over its conversations (training.packing).
    "anchors per conversation",
    "compile warm-up",
    "graphs compiled",
    "recompiles after warm-up",
)
ONLINE_COLUMNS = (
    "variant",
    "steady samples/s ({ranks})",
    "model TFLOP/s (MFU)",
    "train compute per step",
    "Δ compute vs {baseline}",
    "data wait per step",
    "peak memory per rank",
    "Δ memory",
    "computed positions per real token",
    "computed anchor blocks per valid anchor",
    "graphs compiled",
    "recompiles after warm-up",
)


def fmt_ms(value: float) -> str:
    """A duration in ms, with a decimal below 100 ms."""
    return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


def fmt_delta(value: float, base: float, unit: str) -> str:
    """`+12 ms (+3.4%)`: the difference to the baseline, absolute and relative."""
    diff = value - base
    pct = 100.0 * diff / base if base else 0.0
    digits = 0 if abs(diff) >= 100 or unit == "MB" else 1
    return f"{diff:+.{digits}f} {unit} ({pct:+.1f}%)"


def _percent(value: float, base: float) -> str:
    return f"{100.0 * (value - base) / base:+.1f}%" if base else DASH


def pick_baseline(rows: Sequence[RunResult], preferred: str) -> RunResult | None:
    """The preferred variant's row if it ran, else the first row that did."""
    measured = [row for row in rows if row.ok]
    for row in measured:
        if row.variant == preferred:
            return row
    return measured[0] if measured else None


def _ordered(rows: Sequence[RunResult]) -> list[RunResult]:
    order = {variant.key: index for index, variant in enumerate(VARIANTS)}
    return sorted(rows, key=lambda row: order.get(row.variant, len(order)))


def _positions(row: RunResult) -> str:
    if not row.positions_per_real_token:
        return DASH
    approx = "≈" if row.positions_estimated else ""
    return f"{approx}{row.positions_per_real_token:.2f}"


def _anchor_blocks(row: RunResult) -> str:
    return f"{row.anchor_blocks_per_valid:.2f}" if row.anchor_blocks_per_valid else DASH


def _anchors_per_conversation(row: RunResult) -> str:
    return f"{row.anchors_per_conversation:.1f}" if row.anchors_per_conversation else DASH


def _mfu(row: RunResult) -> str:
    if not row.mfu:
        return DASH
    return f"{row.model_tflops_per_s:.3g} ({100 * row.mfu:.1f}%)"


def _compile_cells(row: RunResult) -> tuple[str, str]:
    variant = BY_KEY.get(row.variant)
    if variant is not None and not variant.compile_blocks and not row.compile_graphs:
        return DASH, DASH
    return str(row.compile_graphs), str(row.recompiles_after_warmup)


def _warmup(row: RunResult) -> str:
    variant = BY_KEY.get(row.variant)
    if variant is None or not variant.compile_blocks:
        return DASH
    return f"{row.warmup_s:.1f} s"


def _header(columns: Sequence[str], baseline: str, ranks: int) -> list[str]:
    per = f"{ranks} rank" if ranks == 1 else f"{ranks} ranks"
    names = [c.format(baseline=baseline, ranks=per) for c in columns]
    return ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]


def _not_measured(row: RunResult, width: int) -> str:
    label = BY_KEY[row.variant].label if row.variant in BY_KEY else row.variant
    reason = f"{row.status}: {row.reason}".replace("|", "/").replace("\n", " ")
    if len(reason) > 160:
        reason = reason[:157] + "..."
    return "| " + " | ".join([label, reason] + [DASH] * (width - 2)) + " |"


Cells = Callable[[RunResult, RunResult, bool], list[str]]


def _table(
    rows: Sequence[RunResult], columns: Sequence[str], cells: Cells, preferred_baseline: str
) -> str:
    """Rows in variant order against the baseline; a row that did not run says why."""
    rows = _ordered(rows)
    base = pick_baseline(rows, preferred_baseline)
    ranks = rows[0].ranks if rows else 1
    lines = _header(columns, base.variant if base else preferred_baseline, ranks)
    for row in rows:
        if not row.ok or base is None:
            lines.append(_not_measured(row, len(columns)))
            continue
        lines.append("| " + " | ".join(cells(row, base, row is base)) + " |")
    return "\n".join(lines) + "\n"


def _offline_cells(row: RunResult, base: RunResult, is_base: bool) -> list[str]:
    graphs, recompiles = _compile_cells(row)
    return [
        BY_KEY[row.variant].label,
        fmt_ms(row.step_ms),
        DASH if is_base else fmt_delta(row.step_ms, base.step_ms, "ms"),
        fmt_ms(row.compute_ms_mean)
        + ("" if is_base else f" ({_percent(row.compute_ms_mean, base.compute_ms_mean)})"),
        f"{row.samples_per_s:.2f}",
        _mfu(row),
        f"{row.peak_memory_mb:.0f} MB",
        DASH if is_base else fmt_delta(row.peak_memory_mb, base.peak_memory_mb, "MB"),
        _positions(row),
        _anchor_blocks(row),
        _anchors_per_conversation(row),
        _warmup(row),
        graphs,
        recompiles,
    ]


def _online_cells(row: RunResult, base: RunResult, is_base: bool) -> list[str]:
    graphs, recompiles = _compile_cells(row)
    return [
        BY_KEY[row.variant].label,
        f"{row.samples_per_s:.2f}",
        _mfu(row),
        fmt_ms(row.compute_ms_mean),
        DASH if is_base else fmt_delta(row.compute_ms_mean, base.compute_ms_mean, "ms"),
        fmt_ms(row.data_wait_ms),
        f"{row.peak_memory_mb:.0f} MB",
        DASH if is_base else fmt_delta(row.peak_memory_mb, base.peak_memory_mb, "MB"),
        _positions(row),
        _anchor_blocks(row),
        graphs,
        recompiles,
    ]


def offline_table(rows: Sequence[RunResult], *, preferred_baseline: str = "fsdp2") -> str:
    """The table of a Trainer.fit workload (variable, long, sharegpt)."""
    return _table(rows, OFFLINE_COLUMNS, _offline_cells, preferred_baseline)


def online_table(rows: Sequence[RunResult], *, preferred_baseline: str = "fsdp2") -> str:
    """The table of the disaggregated workload: compute and data wait per step."""
    return _table(rows, ONLINE_COLUMNS, _online_cells, preferred_baseline)


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of the first markdown table in `text` as {column: cell} (for tests and tools)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return []
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(header, cells, strict=False)))
    return rows
