"""Metrics: one JSONL line per log step (always), TensorBoard when configured, perf counters."""

from __future__ import annotations

import json
import math
import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


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


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Writes metric dicts as JSONL lines (and TensorBoard scalars) from the main rank only."""

    def __init__(
        self, jsonl_path: Path, *, tensorboard_dir: Path | None = None, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.jsonl_path = jsonl_path
        self._file = None
        self._tb = None
        if not enabled:
            return
        jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = jsonl_path.open("a", encoding="utf-8")
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is an optional extra
                raise RuntimeError(
                    "tracking.tensorboard = true needs tensorboard: "
                    "pip install 'specdraft-trainer[tensorboard]'"
                ) from exc
            self._tb = SummaryWriter(str(tensorboard_dir))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line {"step": step, ...metrics} and mirror scalars to TensorBoard."""
        if not self.enabled or self._file is None:
            return
        row = {"step": step, "time": time.time()}
        row.update({k: _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key not in ("step", "time") and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def truncate_after(self, step: int) -> int:
        """Drop lines logged after `step` (a resumed run logs those steps again); return how many.

        A run killed between checkpoints logged steps past its last checkpoint; without this the
        file would hold those steps twice. A torn last line (killed mid-write) is dropped too.
        The file is rewritten atomically, so a crash here leaves the old file.
        """
        if not self.enabled or self._file is None:
            return 0
        self._file.close()
        kept, dropped = [], 0
        for line in self.jsonl_path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                row_step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                dropped += 1
                continue
            if isinstance(row_step, int) and row_step > step:
                dropped += 1
            else:
                kept.append(line + "\n")
        if dropped:
            tmp = self.jsonl_path.with_name(f".{self.jsonl_path.name}.tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            tmp.replace(self.jsonl_path)
        self._file = self.jsonl_path.open("a", encoding="utf-8")
        return dropped

    def close(self) -> None:
        """Flush and close the sinks."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a metrics JSONL file back (tests, benchmarks, `eval`)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
