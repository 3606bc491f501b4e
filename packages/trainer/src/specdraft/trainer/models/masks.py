"""Attention masks of the draft blocks: a dense boolean mask (SDPA) and a flex BlockMask.

Keys are laid out as [context (S positions) | draft tokens (num_anchors * block_size)]; queries
are the draft tokens only. Both builders encode the same rule:

- a query of a kept block b sees context keys strictly before anchor_b and every key of its own
  block (both directions);
- a query of a block that is not kept sees only its own key. The rule says such a block sees
  nothing, but an all-masked row makes SDPA return NaN, and NaN * 0 is still NaN in the backward.
  Seeing itself keeps the row finite; no kept query ever sees a non-kept block and the loss gives
  non-kept blocks weight exactly 0, so they contribute exactly nothing.
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


def dense_block_mask(anchors: Tensor, keep: Tensor, context_len: int, block_size: int) -> Tensor:
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
    draft_index = key_index - context_len
    same_block = (draft_index[None, :] // block_size) == (query_index[:, None] // block_size)
    sees_block = (~is_context)[None, None, :] & same_block[None] & query_keep[:, :, None]
    is_self = draft_index[None, :] == query_index[:, None]
    sees_self = is_self[None] & ~query_keep[:, :, None]
    return (sees_context | sees_block | sees_self)[:, None]


def flex_block_mask(anchors: Tensor, keep: Tensor, context_len: int, block_size: int) -> BlockMask:
    """flex_attention BlockMask with exactly the semantics of `dense_block_mask`."""
    batch, num_anchors = anchors.shape
    num_queries = num_anchors * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        kept = keep[b, block]
        draft_idx = kv_idx - context_len
        is_context = kv_idx < context_len
        sees_context = is_context & (kv_idx < anchor) & kept
        sees_block = (~is_context) & (draft_idx // block_size == block) & kept
        sees_self = (draft_idx == q_idx) & ~kept
        return sees_context | sees_block | sees_self

    return create_block_mask(
        mask_mod, batch, None, num_queries, context_len + num_queries, device=anchors.device
    )


def build_block_mask(
    anchors: Tensor, keep: Tensor, context_len: int, block_size: int, backend: str
) -> Tensor | BlockMask:
    """The mask for `backend` ('sdpa' -> dense bool tensor, 'flex' -> BlockMask)."""
    if backend == "flex":
        return flex_block_mask(anchors, keep, context_len, block_size)
    if backend == "sdpa":
        return dense_block_mask(anchors, keep, context_len, block_size)
    raise ValueError(f"attention backend must be 'sdpa' or 'flex', got {backend!r}")
