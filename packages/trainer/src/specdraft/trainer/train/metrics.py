"""Metrics: one JSONL line per log step (always), TensorBoard when configured, perf counters."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

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


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class MetricsWriter:
    """Writes metric dicts as JSONL lines (and TensorBoard scalars) from the main rank only.

    A write that fails (a full disk, an I/O error) is never fatal: the partial line is cut off
    again, the failure is logged once, and the lines are kept in memory and written first at the
    next log step that succeeds (up to MAX_PENDING lines; older ones are dropped and counted).
    """

    MAX_PENDING = 100_000

    def __init__(
        self, jsonl_path: Path, *, tensorboard_dir: Path | None = None, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.jsonl_path = jsonl_path
        self._fd: int | None = None
        self._tb = None
        self._pending: list[str] = []
        self._lost = 0  # lines dropped from a full pending buffer
        self._failing = False
        if not enabled:
            return
        jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is an optional extra
                raise RuntimeError(
                    "tracking.tensorboard = true needs tensorboard: "
                    "pip install 'specdraft-trainer[tensorboard]'"
                ) from exc
            self._tb = SummaryWriter(str(tensorboard_dir))

    def _open(self) -> int:
        return os.open(self.jsonl_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line {"step": step, ...metrics} and mirror scalars to TensorBoard."""
        if not self.enabled or self._fd is None:
            return
        row = {"step": step, "time": time.time()}
        row.update({k: _jsonable(v) for k, v in metrics.items()})
        self._pending.append(json.dumps(row) + "\n")
        self._flush_pending()
        if self._tb is not None:
            try:
                for key, value in row.items():
                    if key not in ("step", "time") and isinstance(value, (int, float)):
                        self._tb.add_scalar(key, value, step)
            except OSError as exc:  # TensorBoard's own writer: a mirror, never fatal either
                log.warning("metrics: TensorBoard write failed (%s); JSONL goes on", exc)

    def _flush_pending(self) -> None:
        """Write the held lines in one append; on failure cut the partial write and keep them."""
        assert self._fd is not None
        data = "".join(self._pending).encode("utf-8")
        size = os.fstat(self._fd).st_size
        try:
            self._append(data)
        except OSError as exc:
            # Cut what landed, so the file never holds a torn line; the lines are retried.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            if len(self._pending) > self.MAX_PENDING:
                drop = len(self._pending) - self.MAX_PENDING
                del self._pending[:drop]
                self._lost += drop
            if not self._failing:
                log.warning(
                    "metrics: cannot write %s (%s); the lines are kept in memory and written "
                    "at the next log step that succeeds (training goes on)",
                    self.jsonl_path,
                    exc.strerror or exc,
                )
            self._failing = True
            return
        if self._failing:
            lost = f", {self._lost} older line(s) lost" if self._lost else ""
            log.warning(
                "metrics: %s is writable again: %d held line(s) written%s",
                self.jsonl_path,
                len(self._pending),
                lost,
            )
        self._pending.clear()
        self._failing = False

    def _append(self, data: bytes) -> None:
        """Append bytes to the JSONL file (one O_APPEND write, repeated while it is short)."""
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def truncate_after(self, step: int) -> int:
        """Drop lines logged after `step` (a resumed run logs those steps again); return how many.

        A run killed between checkpoints logged steps past its last checkpoint; without this the
        file would hold those steps twice. A torn last line (killed mid-write) is dropped too.
        The dropped lines are a tail of the file, so it is cut in place (one truncate: a crash
        leaves the old or the cut file, and a full disk does not matter); lines out of order are
        rewritten atomically instead, and a rewrite that fails is logged, never fatal.
        """
        if not self.enabled or self._fd is None:
            return 0
        _remove_stale_temp(self.jsonl_path)
        raw = self.jsonl_path.read_bytes()
        kept: list[bytes] = []
        dropped, cut, offset = 0, None, 0
        for line in raw.splitlines(keepends=True):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                row_step = json.loads(line).get("step")
                torn = not line.endswith(b"\n")
            except (ValueError, AttributeError):
                row_step, torn = None, True
            if torn or (isinstance(row_step, int) and row_step > step):
                dropped += 1
                cut = start if cut is None else cut
            else:
                kept.append(line)
                if cut is not None:
                    cut = -1  # a kept line after a dropped one: not a tail
        if not dropped:
            return 0
        try:
            if cut is not None and cut >= 0:
                os.ftruncate(self._fd, cut)
            else:
                from ..runtime.atomic import atomic_write

                os.close(self._fd)
                self._fd = None
                try:
                    atomic_write(self.jsonl_path, b"".join(kept))
                finally:
                    self._fd = self._open()
        except OSError as exc:
            log.warning(
                "metrics: cannot drop the %d line(s) after step %d from %s (%s); they stay, and "
                "the resumed run logs those steps again",
                dropped,
                step,
                self.jsonl_path,
                exc.strerror or exc,
            )
            return 0
        return dropped

    def close(self) -> None:
        """Write what is held, flush to disk and close the sinks."""
        if self._fd is not None:
            if self._pending:
                self._flush_pending()
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _remove_stale_temp(path: Path) -> None:
    """Remove the temporary file older versions left when a rewrite failed (often 0 bytes)."""
    with contextlib.suppress(OSError):
        path.with_name(f".{path.name}.tmp").unlink()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a metrics JSONL file back (tests, benchmarks, `eval`)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
