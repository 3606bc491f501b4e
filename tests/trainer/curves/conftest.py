"""Fixtures of the curves tests: metrics.jsonl files written by hand, line by line as the trainer
writes them (train lines every log_interval steps, eval lines at their steps)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest


def eval_line(step: int, tau: float, train_s: float | None, rates: Sequence[float]) -> dict:
    """An eval line as Trainer._run_eval writes it."""
    line = {
        "step": step,
        "time": 1000.0 + step,
        "eval/tau": tau,
        "eval/steps": 40.0,
        "eval/capped_prompts": 0,
        "eval/accept_rate_per_pos": list(rates),
    }
    if train_s is not None:
        line["time/train_s"] = train_s
    return line


def train_line(step: int, train_s: float | None) -> dict:
    """A train log line (loss and perf counters), as Trainer._after_step writes it."""
    line = {"step": step, "time": 1000.0 + step, "loss": 5.0, "perf/train_compute_ms": 10.0}
    if train_s is not None:
        line["time/train_s"] = train_s
    return line


@pytest.fixture
def write_run(tmp_path: Path):
    """Factory: a run folder whose metrics.jsonl holds `evals` ((step, train_s, tau, rates)),
    a train line at every eval step after 0 and at `final_step`, plus raw `tail` text."""

    def write(name: str, evals, *, final_step=None, seconds_per_step=None, tail="") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        lines = []
        for step, train_s, tau, rates in evals:
            if step > 0:
                lines.append(train_line(step, train_s))
            lines.append(eval_line(step, tau, train_s, rates))
        if final_step is not None:
            per_step = seconds_per_step
            lines.append(
                train_line(final_step, None if per_step is None else per_step * final_step)
            )
        text = "".join(json.dumps(line) + "\n" for line in lines) + tail
        (folder / "metrics.jsonl").write_text(text)
        return folder

    return write
