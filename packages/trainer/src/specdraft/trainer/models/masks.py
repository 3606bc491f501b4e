"""Attention masks of the draft blocks: a dense boolean mask (SDPA) and a flex BlockMask.

Keys are laid out as [context (S positions) | draft tokens (num_anchors * block_size)]; queries
are the draft tokens only. Both builders encode the same rule:

- a query of a kept block b sees context keys strictly before anchor_b and every key of its own
  block (both directions);
- a query of a block that is not kept sees only its own key. The rule says such a block sees
  nothing, but an all-masked row makes SDPA return NaN, and NaN * 0 is still NaN in the backward.
  Seeing itself keeps the row finite; no kept query ever sees a non-kept block and the loss gives
  non-kept blocks weight exactly 0, so they contribute exactly nothing.

A packed batch (`document_ids` [B, S], see documents.py) adds one condition to the context rule:
a kept block anchored at a sees context key j only if document_ids[j] == document_ids[a], so a
document never sees another one packed before it. Without `document_ids` the builders are
exactly the unpacked ones.

A sliding window (`window`, a layer's `sliding_window`) adds one more: a kept query at position
p = anchor_b + k sees context key j only if p - j < window (the current token counts, as in the
HF, vLLM and llama.cpp windows). Keys of its own block are never cut: the config requires
window >= block_size. In a packed row the key is in the anchor's document, so row offsets are
document positions and the rule reads the same. `window=None` is full attention.

A causal layer (`causal=True`, `model.causal_layers`) cuts the block rule: a kept query at slot k
of its block sees the block's keys at slots <= k only. The context rule is unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask


def _query_blocks(anchors: Tensor, keep: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """Anchor [B, T] and keep flag [B, T] of every draft query position."""
    num_queries = anchors.shape[1] * block_size
    block_of_query = torch.arange(num_queries, device=anchors.device) // block_size
    return anchors[:, block_of_query], keep[:, block_of_query]


def dense_block_mask(
    anchors: Tensor,
    keep: Tensor,
    context_len: int,
    block_size: int,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = False,
) -> Tensor:
    """Boolean SDPA mask [B, 1, T, S + T] (True = may attend), T = num_anchors * block_size."""
    num_queries = anchors.shape[1] * block_size
    device = anchors.device
    query_anchor, query_keep = _query_blocks(anchors, keep, block_size)
    query_index = torch.arange(num_queries, device=device)
    key_index = torch.arange(context_len + num_queries, device=device)
    is_context = key_index < context_len
    # Context keys strictly before the anchor, for kept blocks.
    sees_context = (
        is_context[None, None, :]
        & (key_index[None, None, :] < query_anchor[:, :, None])
        & query_keep[:, :, None]
    )
    if window is not None:
        query_position = query_anchor + query_index % block_size  # [B, T]
        sees_context = sees_context & (
            query_position[:, :, None] - key_index[None, None, :] < window
        )
    if document_ids is not None:
        sees_context = sees_context & _same_document_keys(
            document_ids, anchors, block_size, num_queries
        )
    draft_index = key_index - context_len
    same_block = (draft_index[None, :] // block_size) == (query_index[:, None] // block_size)
    if causal:
        same_block = same_block & (draft_index[None, :] <= query_index[:, None])
    sees_block = (~is_context)[None, None, :] & same_block[None] & query_keep[:, :, None]
    is_self = draft_index[None, :] == query_index[:, None]
    sees_self = is_self[None] & ~query_keep[:, :, None]
    return (sees_context | sees_block | sees_self)[:, None]


def _same_document_keys(
    document_ids: Tensor, anchors: Tensor, block_size: int, num_queries: int
) -> Tensor:
    """Bool [B, T, S + T]: context key j is in the document of the query's anchor (False on
    draft keys, which the block rules decide)."""
    anchor_document = document_ids.gather(1, anchors)
    query_document = anchor_document.repeat_interleave(block_size, dim=1)
    same = document_ids[:, None, :] == query_document[:, :, None]
    return torch.nn.functional.pad(same, (0, num_queries))


def flex_block_mask(
    anchors: Tensor,
    keep: Tensor,
    context_len: int,
    block_size: int,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = False,
) -> BlockMask:
    """flex_attention BlockMask with exactly the semantics of `dense_block_mask`."""
    batch, num_anchors = anchors.shape
    num_queries = num_anchors * block_size
    mask_mod = block_mask_mod(anchors, keep, context_len, block_size, document_ids, window, causal)
    return create_block_mask(
        mask_mod, batch, None, num_queries, context_len + num_queries, device=anchors.device
    )


def block_mask_mod(
    anchors: Tensor,
    keep: Tensor,
    context_len: int,
    block_size: int,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = False,
):
    """The flex mask_mod(b, h, q_idx, kv_idx) of `dense_block_mask`'s rule."""
    # Packed batches add "same document as the anchor" to the context rule; the condition is
    # chosen here, outside mask_mod, so an unpacked batch traces exactly the unpacked rule.
    anchor_document = None if document_ids is None else document_ids.gather(1, anchors)

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        kept = keep[b, block]
        draft_idx = kv_idx - context_len
        is_context = kv_idx < context_len
        sees_context = is_context & (kv_idx < anchor) & kept
        if anchor_document is not None:
            # Draft keys index past the context: clamp them into range; is_context drops them.
            key_document = document_ids[b, kv_idx.clamp(max=context_len - 1)]
            sees_context = sees_context & (key_document == anchor_document[b, block])
        if window is not None:
            sees_context = sees_context & (anchor + q_idx % block_size - kv_idx < window)
        sees_block = (~is_context) & (draft_idx // block_size == block) & kept
        if causal:
            sees_block = sees_block & (draft_idx <= q_idx)
        sees_self = (draft_idx == q_idx) & ~kept
        return sees_context | sees_block | sees_self

    return mask_mod


def build_block_mask(
    anchors: Tensor,
    keep: Tensor,
    context_len: int,
    block_size: int,
    backend: str,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = False,
) -> Tensor | BlockMask:
    """The mask for `backend` ('sdpa' -> dense bool tensor, 'flex' -> BlockMask)."""
    args = (anchors, keep, context_len, block_size, document_ids, window, causal)
    if backend == "flex":
        return flex_block_mask(*args)
    if backend == "sdpa":
        return dense_block_mask(*args)
    raise ValueError(f"attention backend must be 'sdpa' or 'flex', got {backend!r}")


def both_block_masks(
    anchors: Tensor,
    keep: Tensor,
    context_len: int,
    block_size: int,
    document_ids: Tensor | None = None,
    window: int | None = None,
    causal: bool = False,
) -> tuple[Tensor, BlockMask]:
    """The dense and the flex mask of the same inputs (to compare the backends)."""
    args = (anchors, keep, context_len, block_size, document_ids, window, causal)
    return dense_block_mask(*args), flex_block_mask(*args)
