"""Batch sources: turn a sampler's micro-batches of indices into collated, featured batches.

Every source pads with the run's one `ShapePolicy` (lengths and anchor widths) and, under static
shapes, also pads the batch dimension to `micro_batch_size` with zero-weight rows, so compiled
blocks only ever see the (length, anchor width) cells the warm-up built. An empty micro-batch (a
rank with nothing left in the last window) becomes a zero-weight dummy batch: every rank still
runs the same forward and backward, which sharded models need for their collectives.

Under packing (`ShapePolicy.packing`) a micro-batch lists whole documents; the collator packs
them into at most `micro_batch_size` rows, and every batch the trainer runs (real, empty dummy,
warm-up dummies) carries the packing keys, so compiled blocks see one graph set. The in-process
target runs per document (never across a row), see `document_features`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.collate import (
    ANCHOR_WIDTH,
    DOCUMENT_IDS,
    DOCUMENT_SAMPLE_IDS,
    NUM_DOCUMENTS,
    POSITION_IDS,
    DataCollatorWithPadding,
    MicroBatchSampler,
)
from specdraft.config import PadTo, ShapePolicy

from ..models.target_labels import SOFT_IDS, SOFT_LOGPROBS, TARGET_LABELS, TargetLabeler

# (input_ids [B,S], attention_mask [B,S]) -> (hidden_states [B,S,L*H], last_hidden [B,S,H])
FeatureFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# The packed collator's per-token keys (int64 [B, S]) and the value of a padding position:
# padding belongs to no document (-1), has position 0 and sample id 0.
PACKING_KEYS = {DOCUMENT_IDS: -1, POSITION_IDS: 0, DOCUMENT_SAMPLE_IDS: 0}
# Keys whose floats keep their dtype on the device: the target's log-probabilities are read
# in fp32 however the features are cast.
KEEP_DTYPE_KEYS = (SOFT_LOGPROBS,)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchShape:
    """Widths a batch must have, for dummies and for checks."""

    micro_batch_size: int
    feature_width: int  # L * H
    hidden_size: int  # H
    with_last_hidden: bool  # DSpark needs target_last_hidden_states
    feature_dtype: torch.dtype
    static: bool  # pad the batch dimension too (static shapes)
    # Labels from the target's predictions the batches carry (models/target_labels.py):
    # `target_labels` (data.labels = "target_argmax") and K soft labels (0: none).
    target_labels: bool = False
    soft_topk: int = 0


def dummy_batch(
    shape: BatchShape,
    length: int,
    rows: int | None = None,
    anchor_width: int | None = None,
    *,
    packing: bool = False,
) -> dict[str, Any]:
    """A zero-weight batch of `rows` x `length` (no supervised token, so no anchor and no loss).

    `anchor_width` forces the anchor blocks it computes (a warm-up cell); None leaves the key out.
    `packing` adds the packed keys (every position padding), so the draft takes its packed path.
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
    if packing:
        for key, fill in PACKING_KEYS.items():
            batch[key] = torch.full((rows, length), fill, dtype=torch.long)
        batch[NUM_DOCUMENTS] = 0
    if shape.with_last_hidden:
        batch["target_last_hidden_states"] = torch.zeros(
            rows, length, shape.hidden_size, dtype=shape.feature_dtype
        )
    if shape.target_labels:
        batch[TARGET_LABELS] = torch.zeros(rows, length, dtype=torch.long)
    if shape.soft_topk:
        batch[SOFT_IDS] = torch.zeros(rows, length, shape.soft_topk, dtype=torch.long)
        batch[SOFT_LOGPROBS] = torch.zeros(rows, length, shape.soft_topk, dtype=torch.float32)
    return batch


def pad_rows(batch: dict[str, Any], rows: int) -> dict[str, Any]:
    """Append padding rows (no loss weight) until the batch has `rows` rows.

    Zeros, except the packed keys, which take their padding value (`PACKING_KEYS`).
    """
    have = batch["input_ids"].shape[0]
    if have >= rows:
        return batch
    out = dict(batch)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == have:
            extra = value.new_full((rows - have, *value.shape[1:]), PACKING_KEYS.get(key, 0))
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
        # Several documents per row (training.packing): packed keys on every batch.
        self.packing = self.shapes.packing

    def warmup_batches(self) -> list[Mapping[str, Any]]:
        """One dummy batch per static (length, anchor width) cell, on the device."""
        packing = self.packing
        if not self.shapes.anchor_widths:
            return [
                self.to_device(dummy_batch(self.shape, n, packing=packing))
                for n in self.shapes.lengths
            ]
        return [
            self.to_device(dummy_batch(self.shape, length, anchor_width=width, packing=packing))
            for length, width in self.shapes.grid
        ]

    def empty(self) -> dict[str, Any]:
        """The zero-weight dummy that stands in for an empty micro-batch."""
        length = self.shapes.pad_length(1)
        rows = self.shape.micro_batch_size if self.shape.static else 1
        # The smallest anchor width: a dummy has no anchor, so it should cost the least.
        width = self.shapes.anchor_width(0) if self.shapes.num_anchors is not None else None
        dummy = dummy_batch(self.shape, length, rows, anchor_width=width, packing=self.packing)
        return self.to_device(dummy)

    def collate_rows(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate real samples (padded to the pad policy, and to micro_batch_size rows if static).

        Under packing the samples are documents packed into rows; `num_real` counts documents
        (throughput counts conversations), and more rows than micro_batch_size is an error.
        """
        batch: dict[str, Any] = self.collate(list(rows))
        if self.packing:
            packed = int(batch["input_ids"].shape[0])
            if packed > self.shape.micro_batch_size:
                raise ValueError(
                    f"a packed micro-batch of {len(rows)} documents needs {packed} rows, more "
                    f"than training.micro_batch_size = {self.shape.micro_batch_size}: the plan "
                    f"was not made for this packing (row capacity {self.shapes.row_capacity})"
                )
            batch["num_real"] = int(batch.get(NUM_DOCUMENTS, len(rows)))
        else:
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
                if value.is_floating_point() and key not in KEEP_DTYPE_KEYS:
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
        labels: TargetLabeler | None = None,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.builder = builder
        self.accum = grad_accum_steps
        self.rank = rank
        self.features = features
        # Labels from the target's predictions (data.labels, soft labels), or None: stored in
        # the samples (offline features) or computed with the in-process target's head.
        self.labels = labels
        # The data fingerprint (build_dataset's), recorded in checkpoints.
        self.fingerprint = fingerprint

    def micro_batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch (the sampler pads it to a multiple of accum)."""
        return self.sampler.full_epoch_length()

    def windows_in_epoch(self, epoch: int) -> int:
        """Optimizer windows of `epoch` (fewer in an epoch resumed with changed sizes)."""
        return len(self.sampler.epoch_plan(epoch)[self.rank]) // self.accum

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

    def window_samples(self, epoch: int, window: int) -> tuple[list[int], int]:
        """The samples every rank trains in `window` of `epoch`, and the epoch's sample count."""
        plan = self.sampler.epoch_plan(epoch)
        micro = slice(window * self.accum, (window + 1) * self.accum)
        return [i for row in plan for batch in row[micro] for i in batch], len(self.sampler.lengths)

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
        if self.sampler.resume_note and self.rank == 0:
            log.warning("resume: %s", self.sampler.resume_note)
        return self.sampler.epoch, self.sampler.position // self.accum

    def stats(self) -> dict[str, float]:
        """No data-side counters for local data."""
        return {}

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Collate, feature and place one micro-batch (a dummy for an empty one)."""
        if not indices:
            return self.builder.empty()
        samples = [self.dataset[int(i)] for i in indices]
        labels = self.labels
        in_process = self.features is not None and "hidden_states" not in samples[0]
        if labels is not None and not in_process:
            # Stored predictions (offline features), aligned per sample before any packing.
            samples = [labels.from_predictions(sample) for sample in samples]
        with_last = self.builder.shape.with_last_hidden
        if self.builder.packing:
            if in_process:
                assert self.features is not None
                # Per document, before packing: no document's features ever see another's.
                samples = document_features(
                    samples,
                    self.features,
                    budget=self.builder.shape.micro_batch_size * self.builder.shapes.lengths[-1],
                    device=self.builder.device,
                    with_last_hidden=with_last or labels is not None,
                )
                if labels is not None:
                    samples = [_labelled(labels, sample, with_last) for sample in samples]
            return self.builder.to_device(self.builder.collate_rows(samples))
        batch = self.builder.collate_rows(samples)
        if in_process:
            assert self.features is not None
            ids = batch["input_ids"].to(self.builder.device)
            # All ones: with causal attention and right padding the real tokens' features are
            # the same either way, and a fully masked dummy row would give NaN features.
            hidden, last = self.features(ids, torch.ones_like(ids))
            batch["hidden_states"] = hidden
            if with_last:
                batch["target_last_hidden_states"] = last
            if labels is not None:
                # Rows are whole samples here (unpacked), so the shift stays inside each.
                batch = labels.from_last_hidden({**batch, "input_ids": ids}, last)
        return self.builder.to_device(batch)


def _labelled(labels: TargetLabeler, sample: dict[str, Any], keep_last: bool) -> dict[str, Any]:
    """A document with labels from its own last hidden state (dropped unless the family reads
    it)."""
    last = sample["target_last_hidden_states"]
    out = labels.from_last_hidden(sample, last)
    if not keep_last:
        del out["target_last_hidden_states"]
    return out


def feature_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Positions of `lengths`, longest first, cut into chunks of at most `budget` padded tokens.

    A chunk pads to its first (longest) document, so `len(chunk) * longest <= budget` bounds the
    target's batch like an unpacked micro-batch; a document longer than the budget goes alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    chunks: list[list[int]] = []
    for index in order:
        if chunks and (len(chunks[-1]) + 1) * int(lengths[chunks[-1][0]]) <= budget:
            chunks[-1].append(index)
        else:
            chunks.append([index])
    return chunks


def document_features(
    samples: Sequence[Mapping[str, Any]],
    features: FeatureFn,
    *,
    budget: int,
    device: torch.device,
    with_last_hidden: bool,
) -> list[dict[str, Any]]:
    """Each document with its own target features (`hidden_states`, maybe the last hidden).

    The target runs on the documents unpacked (right-padded to the chunk's longest, causal), so
    a document's features depend on its own tokens only; each is cut back to its length.
    """
    out: list[dict[str, Any]] = [dict(sample) for sample in samples]
    ids = [torch.as_tensor(sample["input_ids"]).long() for sample in samples]
    for chunk in feature_chunks([len(t) for t in ids], budget):
        longest = len(ids[chunk[0]])
        batch = torch.zeros(len(chunk), longest, dtype=torch.long)
        for row, index in enumerate(chunk):
            batch[row, : len(ids[index])] = ids[index]
        batch = batch.to(device)
        # All ones, as for unpacked batches: causal attention keeps real tokens off the padding.
        hidden, last = features(batch, torch.ones_like(batch))
        for row, index in enumerate(chunk):
            length = len(ids[index])
            out[index]["hidden_states"] = hidden[row, :length]
            if with_last_hidden:
                out[index]["target_last_hidden_states"] = last[row, :length]
    return out
