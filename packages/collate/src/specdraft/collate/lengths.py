"""Static pad lengths: which length a micro-batch pads to, and the run's pad policy.

A pad policy is `None` (pad to the longest sample: dynamic shapes), an `int` (one fixed length,
`data.max_length` under `static_shapes`) or an ascending tuple of shape buckets whose last entry is
`max_length`. It is computed once per run (`pad_policy_from_config`) and handed to every loader, so
train and eval, colocated or disaggregated, can never pad differently.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specdraft.config import effective_buckets, effective_buckets_from

if TYPE_CHECKING:
    from specdraft.config import Config

PadTo = None | int | tuple[int, ...]


def check_pad_to(pad_to: PadTo) -> PadTo:
    """Validate a pad policy and return it normalised (a bucket list becomes a tuple)."""
    if pad_to is None:
        return None
    if isinstance(pad_to, bool):
        raise TypeError(f"pad_to must be None, an int or a tuple of ints, not {pad_to!r}")
    if isinstance(pad_to, int):
        if pad_to <= 0:
            raise ValueError(f"pad_to = {pad_to} must be a positive length")
        return pad_to
    if not isinstance(pad_to, Sequence) or isinstance(pad_to, str):
        raise TypeError(f"pad_to must be None, an int or a tuple of ints, not {pad_to!r}")
    buckets = tuple(int(b) for b in pad_to)
    if not buckets:
        raise ValueError("pad_to is an empty bucket tuple; use None to pad to the longest sample")
    if buckets[0] <= 0:
        raise ValueError(f"pad_to buckets must be positive lengths, got {buckets}")
    for previous, bucket in itertools.pairwise(buckets):
        if bucket <= previous:
            raise ValueError(f"pad_to buckets must be strictly increasing, got {buckets}")
    return buckets


def resolve_static_length(longest: int, pad_to: PadTo) -> int:
    """The length a micro-batch whose longest sample has `longest` tokens pads to."""
    if longest < 0:
        raise ValueError(f"longest = {longest} is negative")
    pad_to = check_pad_to(pad_to)
    if pad_to is None:
        return longest
    if isinstance(pad_to, int):
        if longest > pad_to:
            raise ValueError(
                f"a sample of {longest} tokens does not fit the static length {pad_to}; "
                f"truncate samples to data.max_length ({pad_to}) before collating"
            )
        return pad_to
    for bucket in pad_to:
        if longest <= bucket:
            return bucket
    raise ValueError(
        f"a sample of {longest} tokens is longer than the largest shape bucket {pad_to[-1]} "
        f"(buckets {pad_to}); the last bucket must be data.max_length and samples must be "
        f"truncated to it"
    )


def static_pad_length(static_shapes: bool, max_length: int, buckets: Sequence[int] | None) -> PadTo:
    """The run's pad policy: None, the fixed max_length, or the buckets with max_length appended."""
    if max_length <= 0:
        raise ValueError(f"max_length = {max_length} must be positive")
    if buckets and not static_shapes:
        raise ValueError(
            "shape buckets need static_shapes = true (without it every micro-batch pads to its "
            "longest sample)"
        )
    too_long = [b for b in buckets or () if b > max_length]
    if too_long:
        # effective_buckets_from would drop them silently; a bucket above max_length is a config
        # mistake that the schema already rejects, so say so instead of hiding it.
        raise ValueError(
            f"shape buckets {too_long} are above max_length = {max_length}; drop them or raise "
            f"max_length"
        )
    if not static_shapes:
        return None
    resolved = effective_buckets_from(static_shapes, max_length, list(buckets or ()))
    if resolved is None:
        return max_length
    return check_pad_to(resolved)


def pad_policy_from_config(config: Config) -> PadTo:
    """The pad policy of a run, from the config's effective buckets (call this in every loader)."""
    buckets = effective_buckets(config)
    if buckets is not None:
        return check_pad_to(buckets)
    if config.training.static_shapes:
        return config.data.max_length
    return None


def describe_pad_to(pad_to: PadTo) -> str:
    """A short human form of a pad policy, for logs and reports."""
    if pad_to is None:
        return "pad to the longest sample"
    if isinstance(pad_to, int):
        return f"fixed length {pad_to}"
    return "buckets " + ", ".join(str(b) for b in pad_to)
