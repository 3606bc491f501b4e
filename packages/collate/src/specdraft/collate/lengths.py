"""The seed's pad-length entry points, as thin façades over the run's `ShapePolicy`.

A pad policy (`PadTo`) is `None` (pad to the longest sample: dynamic shapes), an `int` (one fixed
length, `data.max_length` under `static_shapes`) or an ascending tuple of shape buckets whose
last entry is `max_length`. Runs build one `ShapePolicy` (`specdraft.config.ShapePolicy
.from_config`) and hand it to every loader, which asks it (`pad_length`, `describe_lengths`);
these two functions only keep the seed's public names working.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdraft.config import PadTo, ShapePolicy

__all__ = ["resolve_static_length", "static_pad_length"]


def resolve_static_length(longest: int, pad_to: PadTo | ShapePolicy) -> int:
    """The length a micro-batch whose longest sample has `longest` tokens pads to."""
    return ShapePolicy.of(pad_to).pad_length(longest)


def static_pad_length(static_shapes: bool, max_length: int, buckets: Sequence[int] | None) -> PadTo:
    """The run's pad policy: None, the fixed max_length, or the buckets with max_length appended."""
    return ShapePolicy.from_parts(
        static_shapes=static_shapes, max_length=max_length, buckets=buckets
    ).pad_to
