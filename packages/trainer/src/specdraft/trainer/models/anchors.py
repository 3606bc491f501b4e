"""Anchor sampling: a pure function of (seed, sample_id, position, loss_mask), padding-blind.

Every position gets a pseudo-random 32-bit score from a counter-based integer hash of (seed,
sample_id, position); the anchors are the `num_anchors` best-scoring valid positions. Top-k of
i.i.d. scores is a uniform draw without replacement, and since neither the scores nor the
validity of a real position depend on how far the sample is padded, the same sample gets the
same anchors at any pad length. The same holds for the anchor width: the anchors are always
drawn as the `num_anchors` best, then the kept ones (first, ascending) are cut or padded to
`width` slots, so a sample gets the same anchors at every width that holds them. Shapes are
static ([B, width], with a keep-mask), and nothing reads a tensor value on the host.

A packed row (several documents, see documents.py) keys each token's score by its document's
sample id and its position inside the document, with the same hash: a document's tokens score
exactly as they would alone, and the row's anchors are the best over all its documents.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .documents import DocumentLayout

_MASK32 = 0xFFFFFFFF
# Positions occupy the low bits of a score so that no two positions of a row ever tie; the hash
# sits above them. 20 bits bound the sequence length at ~1M tokens.
_POSITION_BITS = 20
_SEED_SALT = 0x9E3779B9


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2**32 for 32-bit values held in int64, without int64 overflow."""
    low = x & 0xFFFF
    high = x >> 16
    return (low * constant + (((high * constant) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit bijective integer mixer (xorshift-multiply, 'lowbias32' constants)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _sample_key(seed: int, sample_id: Tensor) -> Tensor:
    """The 32-bit hash key of (seed, sample_id), elementwise over any shape of sample ids."""
    device = sample_id.device
    sid = sample_id.to(torch.int64)
    seed_lo = torch.tensor((seed ^ _SEED_SALT) & _MASK32, dtype=torch.int64, device=device)
    seed_hi = torch.tensor((seed >> 32) & _MASK32, dtype=torch.int64, device=device)
    key = _mix32(_mix32(seed_lo) ^ seed_hi)
    key = _mix32(key ^ (sid & _MASK32))
    return _mix32(key ^ ((sid >> 32) & _MASK32))


def position_hash(seed: int, sample_id: Tensor, length: int) -> Tensor:
    """Pseudo-random 32-bit values [B, length] keyed by (seed, sample_id, position)."""
    key = _sample_key(seed, sample_id)
    positions = torch.arange(length, dtype=torch.int64, device=sample_id.device)
    return _mix32(_mix32(key[:, None] ^ positions[None, :]) ^ key[:, None])


def token_hash(seed: int, sample_ids: Tensor, positions: Tensor) -> Tensor:
    """`position_hash` per token: sample ids and positions [B, S] (a packed row's documents).

    On an unpacked row (sample id broadcast, positions 0..S-1) it equals `position_hash` bit
    for bit, so a document draws the same scores packed as alone.
    """
    key = _sample_key(seed, sample_ids)
    return _mix32(_mix32(key ^ positions.to(torch.int64)) ^ key)


def valid_anchor_positions(loss_mask: Tensor, document_ids: Tensor | None = None) -> Tensor:
    """Bool [B, S]: a is a valid anchor when loss_mask[a] and loss_mask[a+1] are both set.

    With `document_ids` (a packed batch) a and a+1 must also be in the same document.
    """
    supervised = loss_mask.bool()
    valid = torch.zeros_like(supervised)
    valid[:, :-1] = supervised[:, :-1] & supervised[:, 1:]
    if document_ids is not None:
        valid[:, :-1] &= document_ids[:, :-1] == document_ids[:, 1:]
        valid &= document_ids >= 0
    return valid


def sample_anchors(
    loss_mask: Tensor,
    sample_id: Tensor,
    num_anchors: int,
    seed: int,
    width: int | None = None,
    layout: DocumentLayout | None = None,
) -> tuple[Tensor, Tensor]:
    """Anchors [B, width] (int64, ascending, 0 in unused slots) and keep [B, width].

    Kept slots come first, in increasing position; a sample with fewer valid positions than
    `num_anchors` fills the rest with keep = False, and one with none gets an all-False row.
    `width` (default num_anchors) must hold every row's `min(num_anchors, valid anchors)`: the
    collator picks it from the loss masks on the host (`ShapePolicy.anchor_width`). A narrower
    width would drop real anchors; it is not checked here, because that would need a device sync.

    A packed batch passes its `layout`: valid anchors stay inside one document, the scores are
    keyed by (seed, document_sample_ids, position_ids) per token, and the row's `num_anchors`
    best over all its documents are drawn (uniform without replacement over the row's valid
    positions). `sample_id` is then unused.
    """
    if width is None:
        width = num_anchors
    if width < 1:
        raise ValueError(f"anchor width {width} must be at least 1")
    batch, length = loss_mask.shape
    if length >= 1 << _POSITION_BITS:
        raise ValueError(f"sequence length {length} exceeds the anchor sampler's 2**20 limit")
    positions = torch.arange(length, dtype=torch.int64, device=loss_mask.device)
    if layout is None:
        valid = valid_anchor_positions(loss_mask)
        hashed = position_hash(seed, sample_id, length)
    else:
        valid = valid_anchor_positions(loss_mask, layout.document_ids)
        hashed = token_hash(seed, layout.document_sample_ids, layout.position_ids)
    # Ties are broken by the row position (low bits), so the order is total in a packed row too.
    scores = (hashed << _POSITION_BITS) | positions
    scores = torch.where(valid, scores, torch.full_like(scores, -1))
    # min() of two Python ints: the top-k width depends on the static shape only, never on the
    # anchor width, so every width sees the same draw.
    drawn = min(num_anchors, length)
    top_scores, top_positions = torch.topk(scores, drawn, dim=1)
    kept = top_scores >= 0
    # Sort kept positions ascending and push unused slots to the end (past any real position).
    sentinel = torch.full_like(top_positions, length)
    ordered, _ = torch.sort(torch.where(kept, top_positions, sentinel), dim=1)
    keep = ordered < length
    anchors = torch.where(keep, ordered, torch.zeros_like(ordered))
    if drawn > width:
        # Only unkept slots are cut: kept ones come first and the width holds them all.
        anchors, keep = anchors[:, :width], keep[:, :width]
    elif drawn < width:
        pad = width - drawn
        anchors = torch.cat([anchors, anchors.new_zeros(batch, pad)], dim=1)
        keep = torch.cat([keep, keep.new_zeros(batch, pad)], dim=1)
    return anchors, keep
