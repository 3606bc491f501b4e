"""The benchmark's targets, checked on the measured rows (reported, never faked or asserted).

On the synthetic workloads, `static_shape_buckets` must beat `static_shapes` on step time by at
least the share of computed positions the buckets remove, minus a small overhead; compiled runs
must show zero recompiles after warm-up. Packed rows are read against the same static
stack unpacked: computed positions per real token, samples (conversations) per second, anchors
per conversation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .results import RunResult
from .variants import BY_KEY

RunIndex = dict[tuple[str, str, str], RunResult]


def _index(rows: Sequence[RunResult]) -> RunIndex:
    """The successful runs by (workload, algorithm, variant)."""
    return {(r.workload, r.algorithm, r.variant): r for r in rows if r.ok}


def _measured_pairs(
    index: RunIndex, pairs: Sequence[tuple[str, str]]
) -> Iterator[tuple[str, str, RunResult, RunResult]]:
    """(workload, algorithm, first, second) for every pair of variants both measured, in order."""
    for workload, algorithm in sorted({(w, a) for w, a, _ in index}):
        for first_key, second_key in pairs:
            first = index.get((workload, algorithm, first_key))
            second = index.get((workload, algorithm, second_key))
            if first is not None and second is not None:
                yield workload, algorithm, first, second


# Pairs compared: (buckets variant, static variant).
PAIRS = (("buckets", "static"), ("buckets-compile", "static-compile"))


@dataclass(frozen=True)
class BucketCheck:
    """Buckets vs static on one workload, algorithm and compile setting."""

    workload: str
    algorithm: str
    buckets: str
    static: str
    padding_removed: float  # share of static's computed positions the buckets do not compute
    step_time_saved: float  # 1 - t_buckets / t_static
    tolerance: float

    @property
    def met(self) -> bool:
        """True when the step time fell by at least the padding removed minus the tolerance."""
        return self.step_time_saved >= self.padding_removed - self.tolerance

    def describe(self) -> str:
        """One line for the report."""
        shortfall = self.padding_removed - self.tolerance - self.step_time_saved
        verdict = "met" if self.met else f"missed by {100 * shortfall:.1f} pts"
        return (
            f"{self.workload} / {self.algorithm}: {self.buckets} vs {self.static}: buckets remove "
            f"{100 * self.padding_removed:.1f}% of the computed positions, step time "
            f"{-100 * self.step_time_saved:+.1f}%; target (saving >= removed - "
            f"{100 * self.tolerance:.0f} pts): {verdict}"
        )


def bucket_checks(
    rows: Sequence[RunResult], *, tolerance: float, workloads: Sequence[str] = ("variable", "long")
) -> list[BucketCheck]:
    """Every buckets-vs-static pair that was measured on the synthetic workloads."""
    index = _index(rows)
    checks = []
    for workload, algorithm, fast, slow in _measured_pairs(index, PAIRS):
        if workload not in workloads:
            continue
        bucket_key, static_key = fast.variant, slow.variant
        if not slow.positions_per_real_token:
            continue
        checks.append(
            BucketCheck(
                workload,
                algorithm,
                bucket_key,
                static_key,
                1.0 - fast.positions_per_real_token / slow.positions_per_real_token,
                # The mean, not the median: buckets make step times multi-modal, and the
                # saving they buy is in the average step (throughput).
                1.0 - fast.compute_ms_mean / slow.compute_ms_mean if slow.compute_ms_mean else 0.0,
                tolerance,
            )
        )
    return checks


def recompile_findings(rows: Sequence[RunResult]) -> list[str]:
    """One line per compiled run that recompiled after warm-up (empty when none did)."""
    return [
        f"{r.workload} / {r.algorithm} / {r.variant}: {r.recompiles_after_warmup} recompile(s) "
        "after warm-up"
        for r in rows
        if r.ok and r.variant.endswith("-compile") and r.recompiles_after_warmup
    ]


# Anchor buckets: (anchor-bucket variant, the same stack without them).
ANCHOR_PAIRS = (
    ("static-anchors", "static"),
    ("buckets-anchors", "buckets"),
    ("static-anchors-compile", "static-compile"),
    ("buckets-anchors-compile", "buckets-compile"),
    # Anchor-grouped order: fewer empty blocks for the same widths (their own floor, below).
    ("static-anchors-grouped", "static"),
    ("buckets-anchors-grouped", "buckets"),
)

# The share of the empty anchor blocks the anchor buckets must remove.
EMPTY_BLOCKS_TARGET = 0.90
# Low supervision: static + anchor buckets within this share of pad-to-longest's step time.
LOW_SUPERVISION_TOLERANCE = 0.10


# Below this many blocks per valid anchor, a gap counts as nothing (rounding of the counts).
NOTHING_TO_REMOVE = 1e-9


def removable_share_removed(static: float, bucketed: float, exact: float) -> float | None:
    """Share of the removable empty anchor blocks that anchor buckets remove, or None if none.

    All three are computed anchor blocks (or blocks per valid anchor) of the same micro-batches:
    `static` at num_anchors, `bucketed` at the anchor bucket widths, `exact` at each
    micro-batch's largest per-sample anchor count (pad-to-longest, the floor no width beats: a
    micro-batch's width must hold its fullest row). Removable = static - exact.
    """
    removable = static - exact
    if removable <= NOTHING_TO_REMOVE:
        return None
    return (static - bucketed) / removable


def empty_share_removed(static: float, bucketed: float) -> float | None:
    """Share of all empty anchor blocks removed (blocks per valid anchor), or None if none."""
    empty = static - 1.0
    if empty <= NOTHING_TO_REMOVE:
        return None
    return (static - bucketed) / empty


@dataclass(frozen=True)
class AnchorCheck:
    """Anchor buckets vs the same stack without them, on one workload and algorithm."""

    workload: str
    algorithm: str
    anchors: str
    plain: str
    plain_blocks_per_valid: float  # computed anchor blocks per valid anchor, without buckets
    anchors_blocks_per_valid: float
    step_time_change: float | None  # t_anchors / t_plain - 1 (mean step time); None: not timed
    # The floor on the plain stack's micro-batches: each at its largest per-sample anchor count.
    exact_blocks_per_valid: float

    @property
    def removable_removed(self) -> float | None:
        """Share of the removable empty blocks (plain - exact) removed; None if none exist."""
        return removable_share_removed(
            self.plain_blocks_per_valid, self.anchors_blocks_per_valid, self.exact_blocks_per_valid
        )

    @property
    def empty_removed(self) -> float:
        """Share of all the plain stack's empty anchor blocks removed (0 when there are none)."""
        return (
            empty_share_removed(self.plain_blocks_per_valid, self.anchors_blocks_per_valid) or 0.0
        )

    @property
    def met(self) -> bool | None:
        """True when >= EMPTY_BLOCKS_TARGET of the removable blocks are gone; None if none."""
        share = self.removable_removed
        return None if share is None else share >= EMPTY_BLOCKS_TARGET

    def describe(self) -> str:
        """One line for the report."""
        share = self.removable_removed
        if share is None:
            verdict = "nothing to remove"
        elif share >= EMPTY_BLOCKS_TARGET:
            verdict = "met"
        else:
            verdict = f"missed by {100 * (EMPTY_BLOCKS_TARGET - share):.1f} pts"
        removable = "none removable" if share is None else f"{100 * share:.1f}% of the removable"
        step = (
            ""
            if self.step_time_change is None
            else f", step time {100 * self.step_time_change:+.1f}%"
        )
        return (
            f"{self.workload} / {self.algorithm}: {self.anchors} vs {self.plain}: computed anchor "
            f"blocks per valid anchor {self.plain_blocks_per_valid:.3f} -> "
            f"{self.anchors_blocks_per_valid:.3f} (exact width "
            f"{self.exact_blocks_per_valid:.3f}): {removable} empty blocks removed, "
            f"{100 * self.empty_removed:.1f}% of all empty blocks{step}; target (>= "
            f"{100 * EMPTY_BLOCKS_TARGET:.0f}% of the removable removed): {verdict}"
        )


def anchor_checks(rows: Sequence[RunResult]) -> list[AnchorCheck]:
    """Every anchor-buckets-vs-plain pair measured, with the anchor-block tally of both."""
    index = _index(rows)
    checks = []
    for workload, algorithm, with_anchors, plain in _measured_pairs(index, ANCHOR_PAIRS):
        anchor_key, plain_key = with_anchors.variant, plain.variant
        if not (with_anchors.anchor_blocks_per_valid and plain.anchor_blocks_per_valid):
            continue
        change = (
            with_anchors.compute_ms_mean / plain.compute_ms_mean - 1.0
            if plain.compute_ms_mean
            else None
        )
        # Both runs see the same micro-batches (the sampler does not depend on the anchor
        # widths), so the plain run's exact-width tally is the floor of both; an anchor-grouped
        # run has other micro-batches and its own floor. A row from before the tally existed
        # has none: fall back to pad-to-longest's row.
        floor_run = with_anchors if BY_KEY[anchor_key].anchor_grouped else plain
        exact = floor_run.exact_anchor_blocks_per_valid or _pad_to_longest_floor(
            index, workload, algorithm
        )
        checks.append(
            AnchorCheck(
                workload,
                algorithm,
                anchor_key,
                plain_key,
                plain.anchor_blocks_per_valid,
                with_anchors.anchor_blocks_per_valid,
                change,
                exact or 1.0,
            )
        )
    return checks


def _pad_to_longest_floor(index: dict, workload: str, algorithm: str) -> float:
    for key in ("fsdp2", "fsdp1"):
        row = index.get((workload, algorithm, key))
        if row is not None and row.anchor_blocks_per_valid:
            return row.anchor_blocks_per_valid
    return 0.0


def low_supervision_checks(
    rows: Sequence[RunResult], *, workload: str = "low-supervision", baseline: str = "fsdp2"
) -> list[str]:
    """Static stacks with anchor buckets against pad-to-longest on the low-supervision workload."""
    index = {(r.workload, r.algorithm, r.variant): r for r in rows if r.ok}
    lines = []
    for algorithm in sorted({r.algorithm for r in rows if r.workload == workload}):
        base = index.get((workload, algorithm, baseline))
        if base is None or not base.compute_ms_mean:
            continue
        for key in (
            "static",
            "static-anchors",
            "static-anchors-compile",
            "buckets-anchors",
            "static-anchors-grouped",
            "buckets-anchors-grouped",
            "fsdp2-grouped",
        ):
            row = index.get((workload, algorithm, key))
            if row is None:
                continue
            change = row.compute_ms_mean / base.compute_ms_mean - 1.0
            target = "target (within 10% of pad-to-longest or faster)"
            if key == "static":
                verdict = "(the stack without anchor buckets, for comparison)"
            elif key == "fsdp2-grouped":
                verdict = "(pad-to-longest in anchor-grouped order, for comparison)"
            elif change <= LOW_SUPERVISION_TOLERANCE:
                verdict = f"{target}: met"
            else:
                over = 100 * (change - LOW_SUPERVISION_TOLERANCE)
                verdict = f"{target}: missed by {over:.1f} pts"
            lines.append(
                f"{workload} / {algorithm}: {key} vs {baseline} (pad to longest): mean step time "
                f"{100 * change:+.1f}%; {verdict}"
            )
    return lines


# Packing: (packed variant, the same stack unpacked).
PACKING_PAIRS = (("packed", "static"), ("packed-compile", "static-compile"))
# The packing targets: at most this many computed positions per real token (ShareGPT), and at
# least this many times the samples per second of unpacked static shapes (`sharegpt` workload).
PACKED_POSITIONS_TARGET = 1.05
PACKED_SPEEDUP_TARGET = 2.0
PACKING_TARGET_WORKLOADS = ("sharegpt",)


@dataclass(frozen=True)
class PackingCheck:
    """Packed rows vs the same static stack unpacked, on one workload and algorithm."""

    workload: str
    algorithm: str
    packed: str
    plain: str
    packed_positions: float  # computed positions per real token
    plain_positions: float
    speedup: float  # samples/s packed over samples/s unpacked (samples = conversations)
    packed_anchors: float  # anchors per conversation (0 = not counted)
    plain_anchors: float

    @property
    def targeted(self) -> bool:
        """True on the workloads the packing targets name (elsewhere the line is a reading)."""
        return self.workload in PACKING_TARGET_WORKLOADS

    def describe(self) -> str:
        """One line for the report."""
        line = (
            f"{self.workload} / {self.algorithm}: {self.packed} vs {self.plain}: computed "
            f"positions per real token {self.plain_positions:.3f} -> {self.packed_positions:.3f}, "
            f"samples/s x{self.speedup:.2f}"
        )
        if self.packed_anchors and self.plain_anchors:
            line += (
                f", anchors per conversation {self.plain_anchors:.1f} -> {self.packed_anchors:.1f}"
            )
        if not self.targeted:
            return line + " (no target on this workload)"
        positions = "met" if self.packed_positions <= PACKED_POSITIONS_TARGET else "missed"
        speed = "met" if self.speedup >= PACKED_SPEEDUP_TARGET else "missed"
        return (
            f"{line}; targets: positions <= {PACKED_POSITIONS_TARGET:.2f}: {positions}, "
            f"samples/s >= {PACKED_SPEEDUP_TARGET:.0f}x: {speed}"
        )


def packing_checks(rows: Sequence[RunResult]) -> list[PackingCheck]:
    """Every packed-vs-unpacked pair measured."""
    index = _index(rows)
    checks = []
    for workload, algorithm, packed, plain in _measured_pairs(index, PACKING_PAIRS):
        if not plain.samples_per_s:
            continue
        packed_key, plain_key = packed.variant, plain.variant
        checks.append(
            PackingCheck(
                workload,
                algorithm,
                packed_key,
                plain_key,
                packed.positions_per_real_token,
                plain.positions_per_real_token,
                packed.samples_per_s / plain.samples_per_s,
                packed.anchors_per_conversation,
                plain.anchors_per_conversation,
            )
        )
    return checks
