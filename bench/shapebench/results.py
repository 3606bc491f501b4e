"""Read a finished run folder back into one table row (steady-state numbers only).

Steady state = the last `steady` optimizer steps of `metrics.jsonl`: the first steps (and with
them any compile that is not in the pre-warm) are left out. Step time is the median train compute
per optimizer step (`perf/train_compute_ms`: forward, backward, all-reduce and optimizer, data
wait excluded), as the reference's offline tables; online rows also report the mean data wait.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK = "ok"


@dataclass
class RunResult:
    """One variant's outcome on one workload and algorithm."""

    workload: str
    algorithm: str
    variant: str
    status: str = OK  # ok | failed | timeout | skipped
    reason: str = ""
    ranks: int = 1
    steps: int = 0  # optimizer steps logged
    steady_steps: int = 0  # steps in the measured window
    step_ms: float = 0.0  # median train compute per step over the window
    compute_ms_mean: float = 0.0
    data_wait_ms: float = 0.0  # mean over the window
    step_total_ms: float = 0.0  # mean wall time per step (compute + data wait + logging)
    samples_per_step: float = 0.0
    samples_per_s: float = 0.0
    # Median model TFLOP/s per device over the window and its MFU (train/flops.py); 0 = not logged.
    model_tflops_per_s: float = 0.0
    mfu: float = 0.0
    peak_memory_mb: float = 0.0  # max over ranks
    peak_memory_per_rank: list[float] = field(default_factory=list)
    positions_per_real_token: float = 0.0
    positions_estimated: bool = False  # planned from corpus lengths, not counted in the run
    # Computed anchor blocks per valid anchor (1.0 = no empty anchor block; 0 = not counted).
    anchor_blocks_per_valid: float = 0.0
    # The same micro-batches at each one's largest per-sample anchor count (the floor no anchor
    # width goes below; pad-to-longest computes it). 0 = not counted.
    exact_anchor_blocks_per_valid: float = 0.0
    # Anchors the draft trained on per conversation (valid anchor blocks / conversations); packing
    # spreads a row's anchors over its conversations. 0 = not counted.
    anchors_per_conversation: float = 0.0
    warmup_s: float = 0.0
    compile_graphs: int = 0
    recompiles_after_warmup: int = 0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the run trained and was measured."""
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        """Plain data for results.json."""
        return asdict(self)


def read_metrics_rows(path: Path) -> list[dict[str, Any]]:
    """The optimizer-step rows of a metrics.jsonl (eval rows and others left out)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "perf/train_compute_ms" in row:
            rows.append(row)
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def steady_result(result: RunResult, run_dir: Path, *, steady: int, online: bool) -> RunResult:
    """Fill `result` from the run folder's metrics, summary and bench files."""
    rows = read_metrics_rows(run_dir / "metrics.jsonl")
    summary = _read_json(run_dir / "summary.json")
    bench = _read_json(run_dir / "bench.json")
    if not rows:
        result.status = "failed"
        result.reason = result.reason or "no optimizer step was logged"
        return result
    window = rows[-steady:] if steady > 0 else rows
    compute = [float(r["perf/train_compute_ms"]) for r in window]
    wall = [float(r["perf/step_ms"]) for r in window]
    # perf/samples_per_s is samples over the step's wall time: recover the samples per step.
    samples = [float(r["perf/samples_per_s"]) * float(r["perf/step_ms"]) / 1e3 for r in window]
    result.steps = len(rows)
    result.steady_steps = len(window)
    result.step_ms = statistics.median(compute)
    result.compute_ms_mean = statistics.fmean(compute)
    result.data_wait_ms = statistics.fmean(float(r["perf/data_wait_ms"]) for r in window)
    result.step_total_ms = statistics.fmean(wall)
    if all("perf/mfu" in r for r in window):
        result.model_tflops_per_s = statistics.median(r["perf/model_tflops_per_s"] for r in window)
        result.mfu = statistics.median(r["perf/mfu"] for r in window)
    result.samples_per_step = round(statistics.fmean(samples), 3)
    # Offline: samples per step over the steady step time (the reference's offline tables).
    # Online: over the mean wall time per step, which includes waiting for data.
    per_step_ms = result.step_total_ms if online else result.step_ms
    result.samples_per_s = result.samples_per_step / (per_step_ms / 1e3) if per_step_ms else 0.0
    peaks = bench.get("peak_memory_mb_per_rank") or [
        max(float(r.get("perf/peak_memory_mb", 0.0)) for r in rows)
    ]
    result.peak_memory_per_rank = [float(p) for p in peaks]
    result.peak_memory_mb = max(result.peak_memory_per_rank)
    if bench.get("real_tokens"):
        result.positions_per_real_token = bench["computed_positions"] / bench["real_tokens"]
    if bench.get("valid_anchor_blocks"):
        result.anchor_blocks_per_valid = (
            bench["computed_anchor_blocks"] / bench["valid_anchor_blocks"]
        )
        result.exact_anchor_blocks_per_valid = (
            bench.get("exact_anchor_blocks", 0) / bench["valid_anchor_blocks"]
        )
    if bench.get("documents"):
        result.anchors_per_conversation = bench["valid_anchor_blocks"] / bench["documents"]
    result.warmup_s = float(bench.get("warmup_s", 0.0))
    result.compile_graphs = int(summary.get("compile_graphs", 0))
    result.recompiles_after_warmup = int(summary.get("recompiles_after_warmup", 0))
    return result
