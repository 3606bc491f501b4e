"""The document layout of a packed batch: which document each token is in, and where.

A packed row holds several whole conversations ("documents") back to back. The collator adds
three per-token keys (see docs/internals.md, 'Packing'):

    document_ids         [B, S] int64: index of the token's document in its row; -1 on padding
    position_ids         [B, S] int64: position inside the document (restarts at 0); 0 on padding
    document_sample_ids  [B, S] int64: the document's sample_id at each of its tokens

A batch without `document_ids` is unpacked: one sample per row, positions 0..S-1. The draft
reads the layout through `document_layout` only, so the unpacked path never sees it.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

# The key names are the packing collator's (one definition for the producer and the reader).
from specdraft.collate import DOCUMENT_IDS, DOCUMENT_SAMPLE_IDS, POSITION_IDS

LAYOUT_KEYS = (DOCUMENT_IDS, POSITION_IDS, DOCUMENT_SAMPLE_IDS)


class DocumentLayout(NamedTuple):
    """Per-token document index, in-document position and document sample id, each [B, S]."""

    document_ids: Tensor
    position_ids: Tensor
    document_sample_ids: Tensor


def document_layout(batch: dict[str, Tensor]) -> DocumentLayout | None:
    """The layout of a packed batch, None for an unpacked one (no `document_ids`)."""
    if DOCUMENT_IDS not in batch:
        return None
    missing = [key for key in LAYOUT_KEYS if key not in batch]
    if missing:
        raise KeyError(
            f"a packed batch (with {DOCUMENT_IDS!r}) also needs {missing}; the packing collator "
            "adds all of " + ", ".join(LAYOUT_KEYS)
        )
    return DocumentLayout(*(batch[key] for key in LAYOUT_KEYS))


def same_document(document_ids: Tensor, positions: Tensor, anchors: Tensor) -> Tensor:
    """Bool [B, N, K]: the token at positions [B, N, K] is in the document of its anchor [B, N].

    `positions` must already lie inside the row (clamp them first). Padding (-1) never matches
    a real anchor's document.
    """
    batch, num_anchors, width = positions.shape
    at = document_ids.gather(1, positions.reshape(batch, -1)).view(batch, num_anchors, width)
    return at == document_ids.gather(1, anchors)[:, :, None]
