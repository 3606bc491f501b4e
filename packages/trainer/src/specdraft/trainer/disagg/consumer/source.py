"""The disaggregated `BatchSource` of `Trainer.fit`: windows from the producer, tensors from
the feature store, collated with the run's one pad policy (the second call site of the static
pad lengths and buckets, next to `LocalBatchSource`).

Step numbering: the trainer's (epoch, window) is global step `epoch * windows_per_epoch +
window`, the same number the producer's ledger and controller use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ...train.sources import BatchBuilder
from ..store.base import FeatureStore
from .client import WindowClient
from .fetch import fetch_micro_batches


class WindowBatchSource:
    """This rank's optimizer windows, delivered by the producer and read from the store."""

    def __init__(
        self,
        client: WindowClient,
        store: FeatureStore,
        *,
        builder: BatchBuilder,
        grad_accum_steps: int,
    ) -> None:
        self.client = client
        self.store = store
        self.builder = builder
        self.accum = grad_accum_steps
        plan = client.plan()
        self.windows_per_epoch = int(plan["windows_per_epoch"])
        self.total_steps = int(plan["total_steps"])
        # Checkpoints record it, so a resumed trainer refuses a producer with another plan.
        self.fingerprint = str(plan.get("data", ""))
        # The two parts of the last window's data wait: waiting for the producer to publish it,
        # and reading and collating its tensors (tells a slow capture from a slow store).
        self.last_wait_ms: dict[str, float] = {}

    def micro_batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch, from the producer's plan."""
        return self.windows_per_epoch * self.accum

    def step_of(self, epoch: int, window: int) -> int:
        """The global step of an epoch's window."""
        return epoch * self.windows_per_epoch + window

    def warmup_batches(self) -> list[Mapping[str, Any]]:
        """One dummy batch per static length, on the device."""
        return self.builder.warmup_batches()

    def windows(self, epoch: int, start_window: int) -> Iterator[list[Mapping[str, Any]]]:
        """This rank's windows of `epoch` from `start_window`, fetched as they are needed."""
        for window in range(start_window, self.windows_per_epoch):
            step = self.step_of(epoch, window)
            if step >= self.total_steps:
                return
            started = time.perf_counter()
            refs = self.client.next_window(step)
            published = time.perf_counter()
            batches = [self.batch(rows) for rows in fetch_micro_batches(self.store, refs)]
            self.last_wait_ms = {
                "perf/window_wait_ms": 1e3 * (published - started),
                "perf/store_read_ms": 1e3 * (time.perf_counter() - published),
            }
            yield batches

    def acknowledge(self, epoch: int, window: int) -> None:
        """The window is trained: the producer may free its features."""
        self.client.ack(self.step_of(epoch, window))

    def resume(self, epoch: int, window: int, *, incarnation: str) -> list[int]:
        """After restoring a checkpoint at (epoch, window): later windows come again."""
        return self.client.resume(self.step_of(epoch, window), incarnation=incarnation)

    def data_state(self, epoch: int, window: int) -> None:
        """No sampler state in checkpoints: the producer's ledger keeps the data position."""
        return None

    def restore_data_state(
        self, state: dict[str, Any] | None, *, allow_changed: Sequence[str], origin: Path
    ) -> None:
        """Keep the checkpoint's (epoch, window): `resume` re-synchronises with the producer."""
        return None

    def stats(self) -> dict[str, float]:
        """The producer's counters and this rank's split of its last data wait, for the log."""
        return {**self.client.stats(), **self.last_wait_ms}

    def batch(self, rows: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, Any]:
        """Collate one micro-batch of sample rows (a zero-weight dummy for an empty one)."""
        if not rows:
            return self.builder.empty()
        return self.builder.to_device(self.builder.collate_rows(rows))
