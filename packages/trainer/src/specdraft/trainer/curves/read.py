"""A run's metrics.jsonl read back as a curve: one point per held-out evaluation (torch-free)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..serve.llama_counts import acceptance_length_within

METRICS_NAME = "metrics.jsonl"
EVAL_PREFIX = "eval/"
# The trainer's cumulative training time (train/metrics.py TRAIN_TIME_KEY, spelled out here so
# that reading a curve never imports torch; a test checks the two agree).
TRAIN_TIME_KEY = "time/train_s"
# Its CPU-time twin (TRAIN_CPU_KEY there): the clock of `--clock cpu`.
TRAIN_CPU_KEY = "time/train_cpu_s"
CLOCK_KEYS = {"wall": TRAIN_TIME_KEY, "cpu": TRAIN_CPU_KEY}
# What the error messages tell a user whose run has no curve.
EVAL_FIX = (
    "train with held-out prompts (data.eval_paths) and an evaluation every N steps "
    "(--set training.eval_interval=N)"
)


class CurveError(ValueError):
    """A run that holds no curve; the message names its file and the fix."""


@dataclass(frozen=True)
class EvalPoint:
    """One held-out evaluation of a run."""

    step: int
    train_s: float | None  # training time at this step; None in runs of older versions
    tau: float
    accept_rate_per_pos: list[float]
    metrics: dict[str, Any] = field(default_factory=dict)  # every eval/ key, prefix dropped

    def as_dict(self) -> dict[str, Any]:
        """The point as `--format json` prints it."""
        extra = {k: v for k, v in self.metrics.items() if k not in ("tau", "accept_rate_per_pos")}
        return {
            "step": self.step,
            "train_s": self.train_s,
            "tau": self.tau,
            "accept_rate_per_pos": list(self.accept_rate_per_pos),
            **extra,
        }


@dataclass(frozen=True)
class Curve:
    """The evaluations of one run, by step, with what the run logged last."""

    label: str
    path: Path  # the metrics.jsonl read
    points: list[EvalPoint]
    final_step: int  # the last step the run logged
    train_s: float | None  # training time at that step (None: not recorded)
    torn_tail: bool = False  # the last line was cut off (a run killed mid-write): skipped

    @property
    def timed(self) -> bool:
        """Whether every evaluation records its training time (runs of older versions do not)."""
        return all(point.train_s is not None for point in self.points)

    def served_at(self, tokens: int) -> Curve:
        """The curve as a draft served with `tokens` speculative tokens per step would show it:
        each point's tau is the acceptance of its block's first `tokens` positions (1 + the sum
        of the survival rates), its rates cut to those positions. A block-8 draft served at 3
        tokens then compares with a block-4 draft; a block no longer than `tokens` is as it was.
        """
        points = []
        for point in self.points:
            rates = point.accept_rate_per_pos
            if tokens < len(rates):
                tau = acceptance_length_within(rates, tokens)
                point = replace(point, tau=tau, accept_rate_per_pos=list(rates[:tokens]))
            points.append(point)
        return replace(self, points=points)


def metrics_path(run: Path) -> Path:
    """The metrics file of a run folder (or `run` itself when it names a file)."""
    return run if run.is_file() else run / METRICS_NAME


def read_curve(run: Path, label: str | None = None, clock: str = "wall") -> Curve:
    """Read a run folder's (or a metrics file's) evaluations; CurveError when it has none.

    `clock` picks the training time: "wall" (seconds inside optimizer steps) or "cpu" (the
    process's CPU seconds over the same intervals)."""
    time_key = CLOCK_KEYS[clock]
    path = metrics_path(run)
    if not path.is_file():
        raise CurveError(
            f"{run}: no {METRICS_NAME} here; RUN_DIR is the output_dir of a `specdraft train` "
            "run (or the file tracking.jsonl_path named)"
        )
    rows, torn = parse_rows(path)
    if not rows:
        raise CurveError(f"{path}: no metric lines yet (the run logs its first at log_interval)")
    points = eval_points(rows, time_key)
    if not points:
        raise CurveError(f"{path}: no held-out evaluation in this run; {EVAL_FIX}")
    final_step = max(row["step"] for row in rows)
    times = [_number(row.get(time_key)) for row in rows if row["step"] == final_step]
    known = [t for t in times if t is not None]
    name = label or (run.name if run.is_dir() else run.parent.name) or str(run)
    return Curve(
        label=name,
        path=path,
        points=points,
        final_step=final_step,
        train_s=known[-1] if known else None,
        torn_tail=torn,
    )


def parse_rows(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The lines of a metrics file that carry a step, and whether a torn last line was skipped.

    Only the last line may be unreadable (a run killed while writing it); one elsewhere means
    the file was damaged, and raises CurveError naming its line.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    rows: list[dict[str, Any]] = []
    torn = False
    for index, (number, line) in enumerate(numbered):
        try:
            row = json.loads(line)
        except ValueError:
            if index == len(numbered) - 1:
                torn = True
                continue
            raise CurveError(f"{path}:{number}: not a JSON line (the file was damaged)") from None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows, torn


def eval_points(rows: list[dict[str, Any]], time_key: str = TRAIN_TIME_KEY) -> list[EvalPoint]:
    """One point per evaluated step, in step order; a step evaluated twice (lines a resume did
    not drop) keeps its last line, the resumed run's."""
    by_step: dict[int, EvalPoint] = {}
    for row in rows:
        tau = _number(row.get(f"{EVAL_PREFIX}tau"))
        if tau is None:
            continue
        metrics = {k[len(EVAL_PREFIX) :]: v for k, v in row.items() if k.startswith(EVAL_PREFIX)}
        rates = metrics.get("accept_rate_per_pos") or []
        by_step[row["step"]] = EvalPoint(
            step=row["step"],
            train_s=_number(row.get(time_key)),
            tau=tau,
            accept_rate_per_pos=[r for r in map(_number, rates) if r is not None],
            metrics=metrics,
        )
    return [by_step[step] for step in sorted(by_step)]


def _number(value: Any) -> float | None:
    """A metric as a float: the JSONL writes non-finite floats as text ("nan", "inf")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
