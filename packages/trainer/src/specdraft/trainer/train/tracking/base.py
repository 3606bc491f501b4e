"""The `MetricSink` protocol a tracking backend implements, and what opening one is told.

A sink gets, from rank 0 only, each metrics line's numbers under the JSONL's names and step
(`scalar_metrics`), the run's summary at the end, and `close`. Opening it is where a backend
imports its package and starts its run, so a missing package or a refused login fails before
the first step, never in the middle of a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from specdraft.config import Config


class TrackingUnavailable(RuntimeError):
    """A selected backend cannot start (package missing, run refused): the run does not start."""


class MetricSink(Protocol):
    """One tracking backend's open run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the numbers of one metrics line at `step`."""
        ...

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Record the run's summary (what summary.json holds) once, at the end."""
        ...

    def close(self) -> None:
        """Flush and finish the run."""
        ...


@dataclass(frozen=True)
class SinkContext:
    """What a backend is told when a run opens it."""

    config: Config
    output_dir: Path

    @property
    def run_name(self) -> str:
        """The run's name in the backend: tracking.run_name, else run_id."""
        return self.config.tracking.run_name or self.config.run_id

    def params(self) -> dict[str, Any]:
        """The resolved config as flat `table.key` -> value pairs (hyperparameters)."""
        return dict(_flatten(self.config.model_dump(mode="json")))


@dataclass(frozen=True)
class Backend:
    """A tracking backend as the registry lists it."""

    name: str  # what tracking.backends names; also its package and its extra
    open: Callable[[SinkContext], MetricSink]
    # What it writes under output_dir by default (moved aside with the run by --overwrite).
    run_files: tuple[str, ...] = ()


def scalar_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics JSONL row, as every backend logs them.

    Same names and values as the JSONL line; `step` and `time` are the backend's own axes, and
    lists (per-position rates, pad lengths) and non-finite values (written as strings) stay in
    the JSONL only.
    """
    return {
        key: value
        for key, value in row.items()
        if key not in ("step", "time") and isinstance(value, (int, float)) and math.isfinite(value)
    }


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value
