"""Metrics: the perf counters of a step, and the writer that sends each log line to the metrics
JSONL (always) and to the tracking backends the config selects (`tracking/`), from rank 0."""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .tracking.base import MetricSink, TrackingUnavailable, scalar_metrics
from .tracking.jsonl import JsonlFile, jsonable, read_metrics

if TYPE_CHECKING:
    from specdraft.config import Config

    from ..runtime import DistContext

__all__ = [
    "TRAIN_CPU_KEY",
    "TRAIN_TIME_KEY",
    "MetricsWriter",
    "PerfClock",
    "metrics_writer",
    "peak_memory_mb",
    "read_metrics",
]

# Seconds spent in optimizer steps so far (data wait included; warm-up, evaluation and checkpoint
# saves excluded), on every step's and every eval's line: the x axis of `specdraft curves`, fair
# between runs of other eval or save intervals. Carried across --resume in trainer_state.json.
TRAIN_TIME_KEY = "time/train_s"
# The same interval in CPU seconds of this process (all its threads, time.process_time): on a
# machine shared with other jobs the wall clock of a step stretches, its CPU time does not, so
# recipes are compared at equal CPU time (`specdraft curves --clock cpu`).
TRAIN_CPU_KEY = "time/train_cpu_s"

log = logging.getLogger(__name__)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA max allocated on GPU, max RSS on CPU, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a wall-clock interval measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PerfClock:
    """Accumulates `perf/data_wait_ms` and `perf/train_compute_ms` over one optimizer step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.data_wait_ms = 0.0
        self.train_compute_ms = 0.0

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time blocked waiting for the next batch."""
        start = time.perf_counter()
        yield
        self.data_wait_ms += (time.perf_counter() - start) * 1e3

    @contextmanager
    def train_compute(self) -> Iterator[None]:
        """Time inside the train step, with a device sync at both ends on GPU."""
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.train_compute_ms += (time.perf_counter() - start) * 1e3

    def reset(self) -> dict[str, float]:
        """Return this step's counters and start the next step from zero."""
        out = {"data_wait_ms": self.data_wait_ms, "train_compute_ms": self.train_compute_ms}
        self.data_wait_ms = 0.0
        self.train_compute_ms = 0.0
        return out


class MetricsWriter:
    """Writes metric dicts as JSONL lines and mirrors their numbers to tracking sinks, from the
    main rank only.

    The JSONL file is the record (`tracking/jsonl.py`: a failed write is held and retried, never
    fatal); a sink is a mirror: one that fails is logged (once while it keeps failing) and
    training goes on.
    """

    def __init__(
        self, jsonl_path: Path, *, sinks: Sequence[MetricSink] = (), enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.jsonl_path = jsonl_path
        self._jsonl = JsonlFile(jsonl_path) if enabled else None
        self._sinks = list(sinks) if enabled else []
        self._failing: set[int] = set()  # sinks whose last call failed

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line {"step": step, ...metrics}; the sinks get its numbers at `step`."""
        if self._jsonl is None:
            return
        row = {"step": step, "time": time.time()}
        row.update({k: jsonable(v) for k, v in metrics.items()})
        self._jsonl.append(row)
        numbers = scalar_metrics(row)
        for sink in self._sinks:
            self._mirror(sink, "log", lambda s=sink: s.log(step, numbers))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Hand the run's summary (summary.json's content) to the sinks."""
        for sink in self._sinks:
            self._mirror(sink, "summary", lambda s=sink: s.log_summary(summary))

    def _mirror(self, sink: MetricSink, what: str, call: Any) -> None:
        try:
            call()
        except Exception as exc:  # a mirror: never fatal (a full disk, a dropped connection)
            if id(sink) not in self._failing:
                log.warning(
                    "metrics: %s %s failed (%s: %s); the JSONL and training go on",
                    type(sink).__name__,
                    what,
                    type(exc).__name__,
                    exc,
                )
            self._failing.add(id(sink))
        else:
            self._failing.discard(id(sink))

    def truncate_after(self, step: int) -> int:
        """Drop JSONL lines logged after `step` (a resumed run logs them again); how many."""
        return self._jsonl.truncate_after(step) if self._jsonl is not None else 0

    def close(self) -> None:
        """Write what is held, flush to disk and close the JSONL file and the sinks."""
        from .tracking.registry import close_all

        if self._jsonl is not None:
            self._jsonl.close()
        close_all(self._sinks)
        self._sinks = []


def metrics_writer(config: Config, output_dir: Path, ctx: DistContext) -> MetricsWriter:
    """The run's writer: the JSONL (tracking.jsonl_path) and, on rank 0, the selected backends.

    A backend that cannot start stops the run here, before the first step, on every rank alike
    (rank 0's error is exchanged, so no rank waits for it in a collective).
    """
    from .tracking.registry import open_sinks

    path = Path(config.tracking.jsonl_path or output_dir / "metrics.jsonl")
    sinks: list[MetricSink] = []
    error = None
    if ctx.is_main:
        try:
            sinks = open_sinks(config, output_dir)
        except TrackingUnavailable as exc:
            error = str(exc)
    error = _agree(error, ctx)
    if error is not None:
        raise TrackingUnavailable(error)
    return MetricsWriter(path, sinks=sinks, enabled=ctx.is_main)


def _agree(error: str | None, ctx: DistContext) -> str | None:
    """Rank 0's error (or None) on every rank."""
    import torch.distributed as dist

    if ctx.world_size > 1 and dist.is_initialized():
        box = [error]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return error
