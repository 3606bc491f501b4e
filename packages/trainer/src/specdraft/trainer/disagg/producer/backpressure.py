"""Backpressure: hold the producer while too many samples wait for an acknowledgement.

A sample is *outstanding* from the moment it is leased to a capture server until the trainers
acknowledge the optimizer step that trained it (its store objects are removed then). Bounding
outstanding samples bounds the feature-store memory and how far the producer runs ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from specdraft.config import Config

# Four optimizer windows of look-ahead hide capture latency without holding much of the epoch
# in the store.
DEFAULT_WATERMARK_WINDOWS = 4


class BackpressureTimeout(TimeoutError):
    """No acknowledgement freed room below the watermark in time."""


def resolve_high_watermark(cfg: Config, largest_window: int | None = None) -> int:
    """The configured watermark, or four optimizer windows; never below one window.

    `largest_window` is the most samples one planned window holds: under packing a window holds
    whole rows of documents, more samples than `micro_batch_size x accum x ranks`, and a
    watermark below it could never let the window be captured whole.
    """
    window = max(cfg.optimizer_window, largest_window or 0)
    configured = cfg.deployment.disaggregated.high_watermark
    if configured is None:
        return DEFAULT_WATERMARK_WINDOWS * window
    # The schema already rejects a watermark below one window; keep the floor here too so a
    # hand-built config cannot deadlock the producer on a window it can never fill.
    return max(configured, window)


class Backpressure:
    """Counts outstanding samples against the watermark and times how long leasing is held.

    Plain bookkeeping with no lock and no waiting: the producer's state machine owns it, and
    the producer waits for room on its own condition variable. `clock` is the time source
    (monotonic seconds), so tests can drive the hold timeout without sleeping.
    """

    def __init__(self, high_watermark: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if high_watermark < 1:
            raise ValueError(f"high_watermark must be at least 1, got {high_watermark}")
        self.high_watermark = high_watermark
        self._clock = clock
        self._outstanding = 0
        self._max_outstanding = 0
        self._blocked_s = 0.0
        self._blocked_since: float | None = None
        self._last_release = clock()

    def try_reserve(self, n: int = 1, *, timeout: float) -> bool:
        """Take n slots if that stays within the watermark; else start timing the hold.

        Raises BackpressureTimeout when the hold has lasted `timeout` seconds without any
        release: the trainers stopped acknowledging (gone), not merely slower than capture.
        """
        if n > self.high_watermark:
            raise ValueError(f"cannot reserve {n} slots under a watermark of {self.high_watermark}")
        now = self._clock()
        if self._outstanding + n <= self.high_watermark:
            if self._blocked_since is not None:
                self._blocked_s += now - self._blocked_since
                self._blocked_since = None
            self._outstanding += n
            self._max_outstanding = max(self._max_outstanding, self._outstanding)
            return True
        if self._blocked_since is None:
            self._blocked_since = now
        if now - max(self._last_release, self._blocked_since) >= timeout:
            raise BackpressureTimeout(
                f"{self._outstanding} samples have waited more than {timeout:.0f} s for an "
                f"acknowledgement (deployment.disaggregated.window_timeout_s); are the "
                f"trainer ranks alive?"
            )
        return False

    def add(self, n: int) -> None:
        """Count n slots taken without waiting (state restored from the ledger)."""
        self._outstanding += n
        self._max_outstanding = max(self._max_outstanding, self._outstanding)

    def release(self, n: int = 1) -> None:
        """Free n slots (their samples' objects were removed)."""
        if n > self._outstanding:
            raise ValueError(f"releasing {n} slots but only {self._outstanding} are taken")
        self._outstanding -= n
        self._last_release = self._clock()

    @property
    def outstanding(self) -> int:
        """Samples leased and not yet freed."""
        return self._outstanding

    @property
    def max_outstanding(self) -> int:
        """The largest outstanding count seen (within the watermark after start-up)."""
        return self._max_outstanding

    @property
    def blocked_s(self) -> float:
        """Total seconds leasing was held at the watermark, the current hold included."""
        current = 0.0
        if self._blocked_since is not None:
            current = self._clock() - self._blocked_since
        return self._blocked_s + current
