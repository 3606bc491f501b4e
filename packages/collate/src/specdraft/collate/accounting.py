"""Padding accounting: how many positions a pad policy computes for a corpus, and where.

The cost of a micro-batch is its rows times the length it pads to: every row of every layer runs
over every padded position, so "computed positions" is the work a pad policy asks for, and
"computed positions per real token" is the overhead of that policy (1.0 = no padding at all).
Micro-batches come from the same sampler the trainer uses (epoch 0 of the seeded plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specdraft.config import PadTo, ShapePolicy, check_pad_to
from specdraft.config.sampler_mode import BUCKET_DEPENDENT_MODES, SamplerMode, check_sampler_mode

from .samplers import MicroBatch, MicroBatchSampler, chunk, length_grouped_order, random_order


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    sampler: SamplerMode = "random",
    seed: int = 0,
    num_replicas: int = 1,
    pad_to: PadTo = None,
    mega_batch_multiplier: int = 50,
    epoch: int = 0,
    anchor_counts: Sequence[int] | None = None,
) -> list[MicroBatch]:
    """The non-empty micro-batches of one epoch of the sampler mode `sampler`, over all ranks.

    `anchor_counts` (per sample, already capped at num_anchors) is needed by "anchor_grouped";
    "packed" needs a static `pad_to` (its largest length is the row capacity).
    """
    mode = check_sampler_mode(sampler)
    if mode == "random":
        return chunk(random_order(len(lengths), seed=seed, epoch=epoch), micro_batch_size)
    if mode == "length_grouped":
        order = length_grouped_order(
            lengths,
            micro_batch_size=micro_batch_size,
            mega_batch_multiplier=mega_batch_multiplier,
            seed=seed,
            epoch=epoch,
        )
        return chunk(order, micro_batch_size)
    assert mode in BUCKET_DEPENDENT_MODES
    # These need the full plan: they sort or cut by the bucket, and with bucket sync which
    # bucket a micro-batch lands in depends on the ranks (rows are cut per bucket). The window
    # size does not matter, one micro-step will do.
    plan = MicroBatchSampler(
        lengths,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=1,
        num_replicas=num_replicas,
        seed=seed,
        mode=mode,
        pad_to=ShapePolicy(pad_to=pad_to, packing=mode == "packed"),
        mega_batch_multiplier=mega_batch_multiplier,
        anchor_counts=anchor_counts if mode == "anchor_grouped" else None,
    ).epoch_plan(epoch)
    return [batch for rank in plan for batch in rank if batch]


def padding_share(real_tokens: int, computed_positions: int) -> float:
    """Share of `computed_positions` that are padding (0.0 when nothing was computed)."""
    if not computed_positions:
        return 0.0
    return 1.0 - real_tokens / computed_positions


@dataclass(frozen=True)
class BucketStats:
    """The micro-batches that pad to one static length."""

    length: int
    micro_batches: int
    share: float  # of all non-empty micro-batches
    samples: int
    real_tokens: int
    computed_positions: int

    @property
    def mean_real_tokens(self) -> float:
        """Mean real tokens per sample (row) in this bucket."""
        return self.real_tokens / self.samples if self.samples else 0.0

    @property
    def padding_share(self) -> float:
        """Share of this bucket's computed positions that are padding."""
        return padding_share(self.real_tokens, self.computed_positions)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            **asdict(self),
            "mean_real_tokens": self.mean_real_tokens,
            "padding_share": self.padding_share,
        }


@dataclass(frozen=True)
class PaddingReport:
    """What one pad policy costs on a list of sample lengths."""

    pad_to: PadTo
    sampler: str
    micro_batch_size: int
    num_replicas: int
    num_samples: int
    micro_batches: int  # non-empty ones
    real_tokens: int
    computed_positions: int  # sum over micro-batches of rows x padded length
    per_bucket: tuple[BucketStats, ...]  # one per static length; empty when padding to longest

    @property
    def positions_per_real_token(self) -> float:
        """Computed positions per real token (1.0 = no padding)."""
        return self.computed_positions / self.real_tokens if self.real_tokens else 0.0

    @property
    def padding_share(self) -> float:
        """Share of the computed positions that are padding."""
        return padding_share(self.real_tokens, self.computed_positions)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        pad_to = list(self.pad_to) if isinstance(self.pad_to, tuple) else self.pad_to
        return {
            "pad_to": pad_to,
            "sampler": self.sampler,
            "micro_batch_size": self.micro_batch_size,
            "num_replicas": self.num_replicas,
            "num_samples": self.num_samples,
            "micro_batches": self.micro_batches,
            "real_tokens": self.real_tokens,
            "computed_positions": self.computed_positions,
            "positions_per_real_token": self.positions_per_real_token,
            "padding_share": self.padding_share,
            "per_bucket": [b.to_dict() for b in self.per_bucket],
        }


def account_micro_batches(
    lengths: Sequence[int], micro_batches: Sequence[MicroBatch], pad_to: PadTo
) -> tuple[int, int, tuple[BucketStats, ...]]:
    """(real tokens, computed positions, per-bucket stats) of given micro-batches under pad_to."""
    policy = ShapePolicy.of(pad_to)
    static = policy.lengths
    counts = dict.fromkeys(static, 0)
    samples = dict.fromkeys(static, 0)
    real = dict.fromkeys(static, 0)
    computed = dict.fromkeys(static, 0)
    total_real = total_computed = 0
    non_empty = [batch for batch in micro_batches if batch]
    for batch in non_empty:
        batch_lengths = [lengths[i] for i in batch]
        padded = policy.pad_length(max(batch_lengths))
        batch_real = sum(batch_lengths)
        total_real += batch_real
        total_computed += len(batch) * padded
        if policy.static:
            counts[padded] += 1
            samples[padded] += len(batch)
            real[padded] += batch_real
            computed[padded] += len(batch) * padded
    per_bucket = tuple(
        BucketStats(
            length=length,
            micro_batches=counts[length],
            share=counts[length] / len(non_empty) if non_empty else 0.0,
            samples=samples[length],
            real_tokens=real[length],
            computed_positions=computed[length],
        )
        for length in static
    )
    return total_real, total_computed, per_bucket


def account_padding(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    pad_to: PadTo,
    sampler: SamplerMode = "random",
    seed: int = 0,
    num_replicas: int = 1,
    mega_batch_multiplier: int = 50,
    anchor_counts: Sequence[int] | None = None,
) -> PaddingReport:
    """Real tokens, computed positions and per-bucket counts of `pad_to` under `sampler`."""
    lengths = [int(n) for n in lengths]
    pad_to = check_pad_to(pad_to)
    micro_batches = plan_micro_batches(
        lengths,
        micro_batch_size=micro_batch_size,
        sampler=sampler,
        seed=seed,
        num_replicas=num_replicas,
        pad_to=pad_to,
        mega_batch_multiplier=mega_batch_multiplier,
        anchor_counts=anchor_counts,
    )
    real, computed, per_bucket = account_micro_batches(lengths, micro_batches, pad_to)
    return PaddingReport(
        pad_to=pad_to,
        sampler=sampler,
        micro_batch_size=micro_batch_size,
        num_replicas=num_replicas,
        num_samples=len(lengths),
        micro_batches=len(micro_batches),
        real_tokens=real,
        computed_positions=computed,
        per_bucket=per_bucket,
    )
