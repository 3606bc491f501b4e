"""The run's shape policy: pad lengths x anchor widths, and the compile plan they imply.

One `ShapePolicy` is built per run (`ShapePolicy.from_config`) and handed to every consumer: the
sampler, the batch builder, the eval loader, prepare-features, the disaggregated trainer side and
producer plan, the backend, the trainer's warm-up, `explain-buckets`, `config show` and
`--dry-run`. None of them re-derives shapes from the config, so they can never disagree.

Two static dimensions:
- length: pad to the longest sample (dynamic), to one static length (data.max_length), or to the
  smallest shape bucket that fits;
- anchor width: the number of draft blocks a micro-batch computes. Static runs compute
  `num_anchors` blocks, or with anchor buckets the smallest bucket that holds the batch's largest
  per-sample anchor count; pad-to-longest computes exactly that largest count.

Packing (`packing=True`, training.packing) is a third kind of length policy: several whole
documents share a row of `row_capacity` tokens (data.max_length); a micro-batch pads to
`pad_length(its fullest row's total)`, so with shape buckets the last, partly filled rows pad to a
smaller bucket. The anchor dimension is unchanged (per row).

Torch-free on purpose: `specdraft lint`, `config show` and `explain-buckets` use it too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .buckets import CompilePlan, compile_plan_from

if TYPE_CHECKING:
    from .schema import Config

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


def _ending_with(values: Iterable[int], last: int) -> tuple[int, ...]:
    """`values` ascending without repeats, with `last` appended when it is not already last."""
    ordered = tuple(sorted(set(values)))
    return ordered if ordered and ordered[-1] == last else (*ordered, last)


def effective_buckets_from(
    static_shapes: bool, max_length: int, buckets: Sequence[int] | None
) -> tuple[int, ...] | None:
    """Ascending bucket tuple with max_length appended, or None when buckets are not in use."""
    if not static_shapes or not buckets:
        return None
    return _ending_with((int(b) for b in buckets if int(b) <= max_length), max_length)


def effective_anchor_buckets(
    num_anchors: int, anchor_buckets: Sequence[int] | None
) -> tuple[int, ...] | None:
    """Ascending anchor widths with num_anchors appended, or None without anchor buckets."""
    if not anchor_buckets:
        return None
    return _ending_with((int(a) for a in anchor_buckets if 0 < int(a) <= num_anchors), num_anchors)


@dataclass(frozen=True)
class ShapePolicy:
    """Pad lengths and anchor widths of a run (the one object every consumer takes)."""

    # None = pad to the longest sample, an int = one static length, a tuple = length buckets.
    pad_to: PadTo = None
    # None when the consumer only pads (the seed's `pad_to=` entry points): no anchor width.
    num_anchors: int | None = None
    # Effective anchor buckets (num_anchors last), or None: static runs then keep num_anchors.
    anchor_buckets: tuple[int, ...] | None = None
    # What the config asked for, kept for notes (max_length / num_anchors appended).
    lengths_appended: bool = False
    anchors_appended: bool = False
    # Several whole documents per row (training.packing); needs a static pad_to.
    packing: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "pad_to", check_pad_to(self.pad_to))
        if self.num_anchors is not None and self.num_anchors < 1:
            raise ValueError(f"num_anchors = {self.num_anchors} must be at least 1")
        if self.anchor_buckets is not None:
            if self.num_anchors is None:
                raise ValueError("anchor buckets need num_anchors")
            if self.pad_to is None:
                raise ValueError(
                    "anchor buckets need static shapes (training.static_anchor_buckets requires "
                    "training.static_shapes = true)"
                )
            widths = check_pad_to(tuple(self.anchor_buckets))
            assert isinstance(widths, tuple)
            if widths[-1] != self.num_anchors:
                raise ValueError(
                    f"anchor buckets {widths} must end with num_anchors = {self.num_anchors}"
                )
            object.__setattr__(self, "anchor_buckets", widths)
        if self.packing and self.pad_to is None:
            raise ValueError(
                "packing needs static shapes (training.packing requires training.static_shapes "
                "= true)"
            )

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_parts(
        cls,
        *,
        static_shapes: bool,
        max_length: int,
        buckets: Sequence[int] | None = None,
        num_anchors: int | None = None,
        anchor_buckets: Sequence[int] | None = None,
        packing: bool = False,
    ) -> ShapePolicy:
        """The policy of these settings (the schema has already checked them)."""
        if max_length <= 0:
            raise ValueError(f"max_length = {max_length} must be positive")
        if packing and not static_shapes:
            raise ValueError(
                "packing needs static_shapes = true (packed rows have one static length)"
            )
        if buckets and not static_shapes:
            raise ValueError(
                "shape buckets need static_shapes = true (without it every micro-batch pads to "
                "its longest sample)"
            )
        if anchor_buckets and not static_shapes:
            raise ValueError(
                "anchor buckets need static_shapes = true (pad-to-longest already computes "
                "exactly the batch's largest anchor count)"
            )
        too_long = [b for b in buckets or () if b > max_length]
        if too_long:
            # effective_buckets_from would drop them silently; a bucket above max_length is a
            # config mistake that the schema already rejects, so say so instead of hiding it.
            raise ValueError(
                f"shape buckets {too_long} are above max_length = {max_length}; drop them or "
                f"raise max_length"
            )
        if anchor_buckets and num_anchors is not None:
            too_many = [a for a in anchor_buckets if a > num_anchors or a <= 0]
            if too_many:
                raise ValueError(
                    f"anchor buckets {too_many} are not in 1..num_anchors ({num_anchors}); drop "
                    f"them or raise training.num_anchors"
                )
        pad_to: PadTo = None
        if static_shapes:
            pad_to = effective_buckets_from(True, max_length, list(buckets or ())) or max_length
        widths = (
            effective_anchor_buckets(num_anchors, anchor_buckets)
            if num_anchors is not None and static_shapes
            else None
        )
        return cls(
            pad_to=pad_to,
            num_anchors=num_anchors,
            anchor_buckets=widths,
            lengths_appended=bool(static_shapes and buckets and buckets[-1] != max_length),
            anchors_appended=bool(widths and anchor_buckets and anchor_buckets[-1] != num_anchors),
            packing=bool(packing),
        )

    @classmethod
    def from_config(cls, config: Config) -> ShapePolicy:
        """The run's policy; build it once per run and hand it on."""
        training = config.training
        return cls.from_parts(
            static_shapes=training.static_shapes,
            max_length=config.data.max_length,
            buckets=training.static_shape_buckets,
            num_anchors=training.num_anchors,
            anchor_buckets=training.static_anchor_buckets,
            packing=training.packing,
        )

    @classmethod
    def of(cls, policy: ShapePolicy | PadTo) -> ShapePolicy:
        """`policy` itself, or a pad-only policy from a seed-style `pad_to` value."""
        if isinstance(policy, ShapePolicy):
            return policy
        return cls(pad_to=policy)

    # ------------------------------------------------------------------ the two dimensions

    @property
    def static(self) -> bool:
        """True when every micro-batch pads to one of a few static lengths."""
        return self.pad_to is not None

    @property
    def lengths(self) -> tuple[int, ...]:
        """The static lengths (ascending), or () for pad-to-longest."""
        if self.pad_to is None:
            return ()
        if isinstance(self.pad_to, int):
            return (self.pad_to,)
        return self.pad_to

    @property
    def row_capacity(self) -> int | None:
        """Tokens a packed row holds (the largest static length), or None without packing."""
        if not self.packing:
            return None
        return max(self.lengths)

    @property
    def anchor_widths(self) -> tuple[int, ...]:
        """The static anchor widths (ascending), or () when widths follow the data."""
        if self.num_anchors is None or not self.static:
            return ()
        return self.anchor_buckets or (self.num_anchors,)

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        """Every static (length, anchor width) cell, length-major; () for dynamic shapes."""
        return tuple(itertools.product(self.lengths, self.anchor_widths))

    def pad_length(self, longest: int) -> int:
        """The length a micro-batch whose longest sample has `longest` tokens pads to."""
        if longest < 0:
            raise ValueError(f"longest = {longest} is negative")
        pad_to = self.pad_to
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

    def length_index(self, longest: int) -> int:
        """Which of `lengths` that micro-batch pads to (its shape bucket); 0 for pad-to-longest.

        Plans that sort or cut by shape bucket (anchor-grouped, bucket-synchronised) ask this,
        so `pad_length` stays the one place that picks a length.
        """
        if self.pad_to is None:
            return 0
        return self.lengths.index(self.pad_length(longest))

    def anchor_width(self, max_anchor_count: int) -> int:
        """Draft blocks a micro-batch computes when its fullest sample has this many anchors.

        `max_anchor_count` is the largest `min(num_anchors, valid anchors)` over the batch's
        samples. Never below 1: a batch without any anchor still runs one (masked) block, so
        every rank runs the same layers.
        """
        if self.num_anchors is None:
            raise ValueError("this shape policy has no num_anchors: it only pads lengths")
        if max_anchor_count < 0:
            raise ValueError(f"max_anchor_count = {max_anchor_count} is negative")
        count = min(self.num_anchors, max_anchor_count)
        if not self.static:
            return max(1, count)
        for width in self.anchor_widths:
            if count <= width:
                return width
        return self.num_anchors  # unreachable: num_anchors is the last width

    # ------------------------------------------------------------------ compile and text

    def compile_plan(
        self, *, compile_blocks: bool, with_eval: bool, num_blocks: int = 1
    ) -> CompilePlan:
        """The compile plan of this grid: graphs = lengths x widths x grad variants (+ eval)."""
        return compile_plan_from(
            compile_blocks=compile_blocks,
            num_shapes=len(self.lengths) or None,
            num_widths=max(1, len(self.anchor_widths)),
            with_eval=with_eval,
            num_blocks=num_blocks,
        )

    def describe_lengths(self) -> str:
        """A short human form of the length dimension."""
        if self.pad_to is None:
            return "pad to the longest sample"
        if self.packing:
            text = f"packed rows of {self.row_capacity}"
            if isinstance(self.pad_to, tuple):
                text += " (last rows: buckets " + ", ".join(str(b) for b in self.pad_to) + ")"
            return text
        if isinstance(self.pad_to, int):
            return f"fixed length {self.pad_to}"
        return "buckets " + ", ".join(str(b) for b in self.pad_to)

    def describe_anchors(self) -> str:
        """A short human form of the anchor dimension."""
        if self.num_anchors is None:
            return "no anchors (pad-only policy)"
        if not self.static:
            return f"the batch's largest anchor count (at most {self.num_anchors})"
        if self.anchor_buckets:
            return "anchor buckets " + ", ".join(str(a) for a in self.anchor_buckets)
        return f"fixed {self.num_anchors} anchors"

    def describe(self) -> str:
        """One line: both dimensions and the grid size."""
        text = f"{self.describe_lengths()}; {self.describe_anchors()}"
        if self.grid:
            text += f"; grid {len(self.lengths)} x {len(self.anchor_widths)} = {len(self.grid)}"
        return text
