"""The metrics JSONL file every run writes: append-only, never fatal, cut back on resume."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def jsonable(value: Any) -> Any:
    """A metric value as JSON holds it: tensors as numbers or lists, non-finite floats as text."""
    if hasattr(value, "item") and hasattr(value, "numel"):  # a tensor, without importing torch
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


class JsonlFile:
    """One JSON line per log step, appended to `path`.

    A write that fails (a full disk, an I/O error) is never fatal: the partial line is cut off
    again, the failure is logged once, and the lines are kept in memory and written first at the
    next log step that succeeds (up to MAX_PENDING lines; older ones are dropped and counted).
    """

    MAX_PENDING = 100_000

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: list[str] = []
        self._lost = 0  # lines dropped from a full pending buffer
        self._failing = False
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, row: dict[str, Any]) -> None:
        """Append one line (the held ones first, if an earlier write failed)."""
        if self._fd is None:
            return
        self._pending.append(json.dumps(row) + "\n")
        self._flush_pending()

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
                    self.path,
                    exc.strerror or exc,
                )
            self._failing = True
            return
        if self._failing:
            lost = f", {self._lost} older line(s) lost" if self._lost else ""
            log.warning(
                "metrics: %s is writable again: %d held line(s) written%s",
                self.path,
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
        if self._fd is None:
            return 0
        _remove_stale_temp(self.path)
        raw = self.path.read_bytes()
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
                from ...runtime.atomic import atomic_write

                os.close(self._fd)
                self._fd = None
                try:
                    atomic_write(self.path, b"".join(kept))
                finally:
                    self._fd = self._open()
        except OSError as exc:
            log.warning(
                "metrics: cannot drop the %d line(s) after step %d from %s (%s); they stay, and "
                "the resumed run logs those steps again",
                dropped,
                step,
                self.path,
                exc.strerror or exc,
            )
            return 0
        return dropped

    def close(self) -> None:
        """Write what is held, flush to disk and close the file."""
        if self._fd is None:
            return
        if self._pending:
            self._flush_pending()
        with contextlib.suppress(OSError):
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None


def _remove_stale_temp(path: Path) -> None:
    """Remove the temporary file older versions left when a rewrite failed (often 0 bytes)."""
    with contextlib.suppress(OSError):
        path.with_name(f".{path.name}.tmp").unlink()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a metrics JSONL file back (tests, benchmarks, `eval`)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
