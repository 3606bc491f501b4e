"""What sliding-window draft layers save, per pad length: the attention work a block-sparse kernel
(flex on GPU) still does against full attention, and what dense SDPA (CPU) computes either way.

A draft query at position p = anchor + k (k < block_size) sees the context keys j < anchor with
p - j < window, and the block_size keys of its own block (trainer/models/masks.py). Full
attention sees all `anchor` context keys. The anchors are drawn among a sample's positions, so
the estimate takes them uniform over the sample's real tokens: a sample of n tokens has, per
query, a mean of (n - 1) / 2 visible context keys under full attention and
mean_a min(a, window - 1 - k) under a window. A bucket's figure averages its samples (each in
the smallest pad length that holds it).

What it is not: dense SDPA builds the whole [queries x (pad length + queries)] score matrix with
masked entries, so on CPU the window changes neither the FLOPs nor the memory of attention; flex
skips key blocks (128 keys) that no query of a query block sees, so its saving is the visible-key
ratio rounded to those blocks. Memory held for the context (the target's hidden states) is the
same under any window: the draft reads every tap position for the blocks it builds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from specdraft.config.attention_layers import layer_windows

if TYPE_CHECKING:
    from specdraft.config import Config, ShapePolicy


def visible_context_sum(n: int, cap: int) -> int:
    """sum over anchors a in [0, n) of min(a, cap): the context keys a query sees, summed."""
    if n <= 0 or cap <= 0:
        return 0
    if n - 1 <= cap:
        return n * (n - 1) // 2
    return cap * (cap + 1) // 2 + cap * (n - 1 - cap)


@lru_cache(maxsize=65536)
def mean_visible_context(n: int, block_size: int, window: int | None) -> float:
    """Mean context keys a draft query sees, anchors uniform over a sample of n tokens."""
    if n <= 0:
        return 0.0
    if window is None:
        return (n - 1) / 2
    total = sum(visible_context_sum(n, window - 1 - k) for k in range(block_size))
    return total / (n * block_size)


@dataclass(frozen=True)
class BucketAttention:
    """One pad length's attention per draft query, summed over the draft's layers."""

    length: int
    samples: int
    dense_keys: int  # keys dense SDPA scores per query and layer: pad length + draft tokens
    full_keys: float  # mean keys visible per query, summed over layers, all layers full
    windowed_keys: float  # the same under the configured layers

    @property
    def saved_share(self) -> float:
        """The share of visible-key work the windows remove (0 when no layer slides)."""
        return 1.0 - self.windowed_keys / self.full_keys if self.full_keys else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the saved share."""
        return {
            "length": self.length,
            "samples": self.samples,
            "dense_keys_per_query": self.dense_keys,
            "full_keys_per_query": self.full_keys,
            "windowed_keys_per_query": self.windowed_keys,
            "saved_share": self.saved_share,
        }


def bucket_attention(
    lengths: Sequence[int],
    pad_lengths: Sequence[int],
    *,
    windows: Sequence[int | None],
    block_size: int,
    num_queries: int,
) -> list[BucketAttention]:
    """Per pad length, the attention work of the draft layers with `windows` (one per layer)
    against all-full layers; `num_queries` is the draft tokens per sample (anchors x block)."""
    edges = sorted(set(pad_lengths))
    groups: dict[int, list[int]] = {edge: [] for edge in edges}
    for n in lengths:
        index = bisect_left(edges, n)
        groups[edges[min(index, len(edges) - 1)]].append(min(n, edges[-1]))
    out = []
    for edge in edges:
        members = groups[edge]
        full = windowed = 0.0
        for n in members:
            for window in windows:
                full += mean_visible_context(n, block_size, None) + block_size
                windowed += mean_visible_context(n, block_size, window) + block_size
        count = max(len(members), 1)
        out.append(
            BucketAttention(
                length=edge,
                samples=len(members),
                dense_keys=edge + num_queries,
                full_keys=full / count,
                windowed_keys=windowed / count,
            )
        )
    return out


def draft_attention(
    config: Config, lengths: Sequence[int], shapes: ShapePolicy
) -> list[BucketAttention] | None:
    """`bucket_attention` of the config's draft layers over `shapes`' pad lengths (max_length
    when padding to the longest sample); None when no layer slides."""
    windows = layer_windows(config.model)
    if all(w is None for w in windows):
        return None
    block = config.model.block_size
    return bucket_attention(
        lengths,
        list(shapes.lengths) or [config.data.max_length],
        windows=windows,
        block_size=block,
        num_queries=config.training.num_anchors * block,
    )
