"""The benchmark's batch source: the trainer's own LocalBatchSource, plus two things.

It counts what the shape policy makes the draft compute (rows x padded length of every batch,
dummies included) against the real tokens, and the anchor blocks it computes (rows x anchor
width) against the valid ones (min(num_anchors, valid anchors) per row: one sample, or under
packing the conversations the row holds), and the conversations (documents) it trained on; and,
where the run has no target to run (synthetic features), fills `hidden_states` /
`target_last_hidden_states` with seeded random features of each sample's own length (placed at
its offset in its packed row), generated on the device so a large preset is not bound by the
host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdraft.collate import ANCHOR_WIDTH, anchor_counts
from specdraft.trainer.train.sources import LocalBatchSource


@dataclass
class PaddingTally:
    """Computed positions (rows x padded length) and real tokens of the batches a rank ran."""

    computed_positions: int = 0
    real_tokens: int = 0
    computed_anchor_blocks: int = 0  # rows x anchor width
    # Sum of min(num_anchors, valid anchors) over real rows (a row = one sample, or the
    # conversations packed into it): the anchors the draft trains on.
    valid_anchor_blocks: int = 0
    # rows x the largest min(num_anchors, valid anchors) of the batch (at least 1): what an exact
    # width (pad-to-longest) computes, the floor of every anchor-width policy on these batches.
    exact_anchor_blocks: int = 0
    documents: int = 0  # conversations trained on (samples; several per row under packing)


class SyntheticFeatures:
    """Seeded random target features of one sample, the same whatever it is padded to."""

    def __init__(
        self,
        *,
        feature_width: int,
        hidden_size: int,
        with_last_hidden: bool,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
    ) -> None:
        self.feature_width = feature_width
        self.hidden_size = hidden_size
        self.with_last_hidden = with_last_hidden
        self.dtype = dtype
        self.device = device
        self.seed = seed

    def __call__(
        self,
        sample_ids: Sequence[int],
        lengths: Sequence[int],
        rows: int,
        padded: int,
        *,
        places: Sequence[tuple[int, int]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Features [rows, padded, ...]: random for each real sample, zero elsewhere.

        Sample i goes to row i from position 0, or to `places[i]` = (row, start) when given
        (packed rows); its values depend on its sample id only.
        """
        out = {"hidden_states": self._zeros(rows, padded, self.feature_width)}
        if self.with_last_hidden:
            out["target_last_hidden_states"] = self._zeros(rows, padded, self.hidden_size)
        if places is None:
            places = [(row, 0) for row in range(len(sample_ids))]
        for (row, start), sample_id, length in zip(places, sample_ids, lengths, strict=True):
            generator = torch.Generator(device=self.device).manual_seed(
                self.seed * 1_000_003 + int(sample_id)
            )
            for tensor in out.values():
                width = tensor.shape[-1]
                tensor[row, start : start + length] = torch.randn(
                    (length, width), generator=generator, device=self.device, dtype=self.dtype
                )
        return out

    def _zeros(self, rows: int, padded: int, width: int) -> torch.Tensor:
        return torch.zeros(rows, padded, width, dtype=self.dtype, device=self.device)


class BenchBatchSource(LocalBatchSource):
    """LocalBatchSource that tallies padding and, without a target, adds synthetic features."""

    def __init__(
        self,
        *args: Any,
        lengths: Sequence[int],
        synthetic: SyntheticFeatures | None,
        fingerprint: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lengths = list(lengths)
        self.synthetic = synthetic
        # build_trainer records a source's fingerprint in the run's checkpoint fingerprint.
        self.fingerprint = fingerprint
        self.tally = PaddingTally()
        self._anchor_counts: dict[int, int] = {}

    def anchor_count(self, index: int) -> int:
        """Valid anchors of one sample, from its loss mask on the host (cached)."""
        if index not in self._anchor_counts:
            mask = torch.as_tensor(self.dataset[index]["loss_mask"], dtype=torch.long)
            self._anchor_counts[index] = anchor_counts(mask.cpu()[None])[0]
        return self._anchor_counts[index]

    def row_groups(self, lengths: Sequence[int]) -> list[list[int]]:
        """Positions into a micro-batch's samples, one list per row the collator builds."""
        shapes = self.builder.shapes
        if not shapes.packing:
            return [[position] for position in range(len(lengths))]
        from specdraft.collate import split_rows

        return split_rows(list(lengths), int(shapes.row_capacity or 0))

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """One micro-batch, counted; synthetic features added when the run has no target."""
        batch = super().batch(indices)
        rows, padded = batch["input_ids"].shape[:2]
        lengths = [self.lengths[int(i)] for i in indices]
        groups = self.row_groups(lengths)
        self.tally.computed_positions += int(rows) * int(padded)
        self.tally.real_tokens += sum(lengths)
        self.tally.documents += len(indices)
        num_anchors = self.builder.shapes.num_anchors or 0
        self.tally.computed_anchor_blocks += int(rows) * int(batch.get(ANCHOR_WIDTH, num_anchors))
        # A packed row's anchors are drawn over all its conversations' valid positions.
        per_row = [
            min(num_anchors, sum(self.anchor_count(int(indices[p])) for p in group))
            for group in groups
        ]
        self.tally.valid_anchor_blocks += sum(per_row)
        self.tally.exact_anchor_blocks += int(rows) * max(1, max(per_row, default=0))
        if "hidden_states" not in batch:
            if self.synthetic is None:
                raise RuntimeError("a batch without features and no synthetic feature source")
            if self.builder.shapes.packing:
                # A packed batch's `sample_id` holds one per row: read each sample's own.
                sample_ids = [int(self.dataset[int(i)]["sample_id"]) for i in indices]
            else:
                sample_ids = batch["sample_id"][: len(indices)].tolist()
            places = [(0, 0)] * len(indices)
            for row, group in enumerate(groups):
                start = 0
                for position in group:
                    places[position] = (row, start)
                    start += lengths[position]
            batch.update(self.synthetic(sample_ids, lengths, int(rows), int(padded), places=places))
        return batch
