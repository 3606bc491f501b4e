"""Packed batches: a micro-batch's documents concatenated into rows, with their document ids.

The samples of a packed micro-batch are the documents of its rows, listed row after row (see
`packing`); `split_rows` recovers the rows from their `input_ids` lengths. Each per-token key is
concatenated per row (every document's feature first zero-padded to its own length, so tokens and
features stay aligned) and the rows are zero-padded to `policy.pad_length(fullest row)`. Besides
the per-token keys a packed batch carries:

- `document_ids` [R, S]: 0, 1, 2, ... = the document's index within its row, -1 on padding;
- `position_ids` [R, S]: the position within its document (restarts at 0), 0 on padding;
- `document_sample_ids` [R, S]: the document's `sample_id` at each of its positions, 0 on padding;
- `sample_id` [R]: each row's first document's sample_id (for code that reads it);
- `num_documents`: the number of documents (a Python int);
- `anchor_width`: from per-row valid anchors, where an anchor a also needs a + 1 in its document.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from specdraft.config import ShapePolicy

from .packing import split_rows

# How the collator turns a raw value into a tensor (dtype rules of padding.py).
AsTensor = Callable[[Any, str], torch.Tensor]

DOCUMENT_IDS = "document_ids"
POSITION_IDS = "position_ids"
DOCUMENT_SAMPLE_IDS = "document_sample_ids"
NUM_DOCUMENTS = "num_documents"
# Every key a packed batch adds to an unpacked one (unpacked batches carry none of them).
PACKED_KEYS = (DOCUMENT_IDS, POSITION_IDS, DOCUMENT_SAMPLE_IDS, NUM_DOCUMENTS)


def packed_anchor_counts(loss_mask: torch.Tensor, document_ids: torch.Tensor) -> list[int]:
    """Valid anchors per packed row: a and a+1 supervised and in the same document."""
    if loss_mask.device.type != "cpu" or document_ids.device.type != "cpu":
        raise ValueError("packed_anchor_counts reads host tensors; call it at collate time")
    supervised = loss_mask.bool()
    same = (document_ids[:, :-1] == document_ids[:, 1:]) & (document_ids[:, :-1] >= 0)
    return (supervised[:, :-1] & supervised[:, 1:] & same).sum(dim=1).tolist()


def _doc_tensor(
    value: Any, key: str, index: int, length: int, first: torch.Tensor | None, as_tensor: AsTensor
) -> torch.Tensor:
    """One document's feature, checked against its length and the batch's first, padded to it."""
    tensor = as_tensor(value, key)
    if tensor.dim() == 0:
        raise ValueError(f"sample {index}: {key!r} is a scalar; per-token features are [S, ...]")
    if tensor.shape[0] > length:
        raise ValueError(
            f"sample {index}: {key!r} has {tensor.shape[0]} rows but input_ids has {length} "
            f"tokens; features must not be longer than input_ids"
        )
    if first is not None and tensor.shape[1:] != first.shape[1:]:
        raise ValueError(
            f"sample {index}: {key!r} has shape {tuple(tensor.shape)}, but sample 0's is "
            f"{tuple(first.shape)}; all samples must share the feature width"
        )
    if first is not None and tensor.dtype != first.dtype:
        raise ValueError(
            f"sample {index}: {key!r} has dtype {tensor.dtype}, but sample 0's is {first.dtype}"
        )
    if tensor.shape[0] < length:
        # A shorter feature is zero after its end, as in an unpacked batch; pad it here so the
        # next document's tokens and features start at the same position.
        tensor = torch.cat(
            [tensor, tensor.new_zeros((length - tensor.shape[0], *tensor.shape[1:]))]
        )
    return tensor


def collate_packed(
    features: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    policy: ShapePolicy,
    as_tensor: AsTensor,
) -> dict[str, Any]:
    """Packed rows of `features` (documents listed row after row) under a packing `policy`."""
    capacity = policy.row_capacity
    if capacity is None:
        raise ValueError("collate_packed needs a packing shape policy (training.packing)")
    for i, feature in enumerate(features):
        for key in ("input_ids", "sample_id"):
            if key not in feature:
                raise KeyError(
                    f"sample {i} has no {key!r}; every document of a packed batch needs it "
                    f"(keys: {sorted(feature)})"
                )
    lengths = [int(as_tensor(f["input_ids"], "input_ids").shape[0]) for f in features]
    sample_ids = [int(as_tensor(f["sample_id"], "sample_id").reshape(())) for f in features]
    rows = split_rows(lengths, capacity)
    totals = [sum(lengths[i] for i in row) for row in rows]
    padded = policy.pad_length(max(totals))
    shape = (len(rows), padded)
    batch: dict[str, Any] = {}
    for key in keys:
        first: torch.Tensor | None = None
        out: torch.Tensor | None = None
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                if key not in features[i]:
                    raise KeyError(f"sample {i} has no {key!r}; every sample of a batch needs it")
                tensor = _doc_tensor(features[i][key], key, i, lengths[i], first, as_tensor)
                if first is None:
                    first = tensor
                    out = tensor.new_zeros((*shape, *tensor.shape[1:]))
                assert out is not None
                out[r, start : start + lengths[i]] = tensor
                start += lengths[i]
        assert out is not None
        batch[key] = out
    document_ids = torch.full(shape, -1, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    document_sample_ids = torch.zeros(shape, dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for d, i in enumerate(row):
            end = start + lengths[i]
            document_ids[r, start:end] = d
            position_ids[r, start:end] = torch.arange(lengths[i])
            document_sample_ids[r, start:end] = sample_ids[i]
            start = end
    batch["sample_id"] = torch.tensor([sample_ids[row[0]] for row in rows], dtype=torch.long)
    batch[DOCUMENT_IDS] = document_ids
    batch[POSITION_IDS] = position_ids
    batch[DOCUMENT_SAMPLE_IDS] = document_sample_ids
    batch[NUM_DOCUMENTS] = len(features)
    if policy.num_anchors is not None and "loss_mask" in batch:
        counts = packed_anchor_counts(batch["loss_mask"], document_ids)
        batch["anchor_width"] = policy.anchor_width(max(counts, default=0))
    return batch
