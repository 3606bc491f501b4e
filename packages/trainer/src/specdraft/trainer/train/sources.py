"""Batch sources: turn a sampler's micro-batches of indices into collated, featured batches.

Every source pads with the run's one `ShapePolicy` (lengths and anchor widths) and, under static
shapes, also pads the batch dimension to `micro_batch_size` with zero-weight rows, so compiled
blocks only ever see the (length, anchor width) cells the warm-up built. An empty micro-batch (a
rank with nothing left in the last window) becomes a zero-weight dummy batch: every rank still
runs the same forward and backward, which sharded models need for their collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.collate import ANCHOR_WIDTH, DataCollatorWithPadding, MicroBatchSampler
from specdraft.config import PadTo, ShapePolicy

# (input_ids [B,S], attention_mask [B,S]) -> (hidden_states [B,S,L*H], last_hidden [B,S,H])
FeatureFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class BatchShape:
    """Widths a batch must have, for dummies and for checks."""

    micro_batch_size: int
    feature_width: int  # L * H
    hidden_size: int  # H
    with_last_hidden: bool  # DSpark needs target_last_hidden_states
    feature_dtype: torch.dtype
    static: bool  # pad the batch dimension too (static shapes)


def dummy_batch(
    shape: BatchShape, length: int, rows: int | None = None, anchor_width: int | None = None
) -> dict[str, Any]:
    """A zero-weight batch of `rows` x `length` (no supervised token, so no anchor and no loss).

    `anchor_width` forces the anchor blocks it computes (a warm-up cell); None leaves the key out.
    """
    rows = rows or shape.micro_batch_size
    batch: dict[str, Any] = {
        "input_ids": torch.zeros(rows, length, dtype=torch.long),
        "loss_mask": torch.zeros(rows, length, dtype=torch.long),
        "hidden_states": torch.zeros(rows, length, shape.feature_width, dtype=shape.feature_dtype),
        "sample_id": torch.zeros(rows, dtype=torch.long),
        "num_real": 0,
    }
    if anchor_width is not None:
        batch[ANCHOR_WIDTH] = anchor_width
    if shape.with_last_hidden:
        batch["target_last_hidden_states"] = torch.zeros(
            rows, length, shape.hidden_size, dtype=shape.feature_dtype
        )
    return batch


def pad_rows(batch: dict[str, Any], rows: int) -> dict[str, Any]:
    """Append zero rows (no loss weight) until the batch has `rows` rows."""
    have = batch["input_ids"].shape[0]
    if have >= rows:
        return batch
    out = dict(batch)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == have:
            extra = value.new_zeros((rows - have, *value.shape[1:]))
            out[key] = torch.cat([value, extra])
    return out


class BatchBuilder:
    """Collates rows with the run's shape policy and places batches on the device.

    Shared by every batch source, so the train loader of each mode pads the same way: pad
    lengths and anchor widths, static row padding, zero-weight dummies for empty micro-batches,
    warm-up batches (one per grid cell).
    """

    def __init__(
        self,
        *,
        shapes: ShapePolicy | PadTo,
        shape: BatchShape,
        device: torch.device | None = None,
    ) -> None:
        self.shapes = ShapePolicy.of(shapes)
        self.collate = DataCollatorWithPadding(pad_to=self.shapes)
        self.shape = shape
        self.device = device or torch.device("cpu")

    def warmup_batches(self) -> list[Mapping[str, Any]]:
        """One dummy batch per static (length, anchor width) cell, on the device."""
        if not self.shapes.anchor_widths:
            return [self.to_device(dummy_batch(self.shape, n)) for n in self.shapes.lengths]
        return [
            self.to_device(dummy_batch(self.shape, length, anchor_width=width))
            for length, width in self.shapes.grid
        ]

    def empty(self) -> dict[str, Any]:
        """The zero-weight dummy that stands in for an empty micro-batch."""
        length = self.shapes.pad_length(1)
        rows = self.shape.micro_batch_size if self.shape.static else 1
        # The smallest anchor width: a dummy has no anchor, so it should cost the least.
        width = self.shapes.anchor_width(0) if self.shapes.num_anchors is not None else None
        return self.to_device(dummy_batch(self.shape, length, rows, anchor_width=width))

    def collate_rows(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate real rows (padded to the pad policy, and to micro_batch_size rows if static)."""
        batch: dict[str, Any] = self.collate(list(rows))
        batch["num_real"] = len(rows)
        if self.shape.static:
            batch = pad_rows(batch, self.shape.micro_batch_size)
        return batch

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Move tensors to the device; floating features take the compute dtype."""
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                value = value.to(self.device, non_blocking=True)
                if value.is_floating_point():
                    value = value.to(self.shape.feature_dtype)
            out[key] = value
        return out


class LocalBatchSource:
    """Batches from an indexable dataset, with target features computed in-process if needed."""

    def __init__(
        self,
        dataset: Any,
        sampler: MicroBatchSampler,
        *,
        builder: BatchBuilder,
        grad_accum_steps: int,
        rank: int,
        features: FeatureFn | None = None,
        fingerprint: str = "",
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.builder = builder
        self.accum = grad_accum_steps
        self.rank = rank
        self.features = features
        # The data fingerprint (build_dataset's), recorded in checkpoints.
        self.fingerprint = fingerprint

    def micro_batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch (the sampler pads it to a multiple of accum)."""
        return len(self.sampler)

    def warmup_batches(self) -> list[Mapping[str, Any]]:
        """One dummy batch per static length, on the device."""
        return self.builder.warmup_batches()

    def windows(self, epoch: int, start_window: int) -> Iterator[list[Mapping[str, Any]]]:
        """This rank's windows of `epoch` from `start_window`, built lazily."""
        plan = self.sampler.epoch_plan(epoch)[self.rank]
        count = len(plan) // self.accum
        for window in range(start_window, count):
            micro = plan[window * self.accum : (window + 1) * self.accum]
            yield [self.batch(indices) for indices in micro]

    def acknowledge(self, epoch: int, window: int) -> None:
        """Nothing to free for local data."""

    def data_state(self, epoch: int, window: int) -> dict[str, Any]:
        """The sampler's state at optimizer window `window` of `epoch` (saved in checkpoints)."""
        self.sampler.set_epoch(epoch)
        return self.sampler.state_dict(consumed=window * self.accum)

    def restore_data_state(
        self, state: dict[str, Any] | None, *, allow_changed: Sequence[str] = (), origin: Path
    ) -> tuple[int, int]:
        """Load a saved sampler state; return the (epoch, window) to continue from.

        The sampler refuses a state saved with other data-order settings, naming the field,
        unless the field is in `allow_changed`. `origin` is the checkpoint, for the errors.
        """
        if state is None:
            raise ValueError(
                f"cannot resume from {origin}: its trainer_state.json has no sampler state, "
                "so the data order cannot be checked; resume from a checkpoint written by this "
                "version, or start a new run"
            )
        self.sampler.load_state_dict(state, allow_changed=allow_changed)
        return self.sampler.epoch, self.sampler.position // self.accum

    def stats(self) -> dict[str, float]:
        """No data-side counters for local data."""
        return {}

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Collate, feature and place one micro-batch (a dummy for an empty one)."""
        if not indices:
            return self.builder.empty()
        batch = self.builder.collate_rows([self.dataset[int(i)] for i in indices])
        if self.features is not None and "hidden_states" not in batch:
            ids = batch["input_ids"].to(self.builder.device)
            # All ones: with causal attention and right padding the real tokens' features are
            # the same either way, and a fully masked dummy row would give NaN features.
            hidden, last = self.features(ids, torch.ones_like(ids))
            batch["hidden_states"] = hidden
            if self.builder.shape.with_last_hidden:
                batch["target_last_hidden_states"] = last
        return self.builder.to_device(batch)
