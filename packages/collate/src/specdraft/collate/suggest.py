"""Optimal shape buckets: an exact dynamic program over the 128-token grid.

For the random and length-grouped samplers, which samples share a micro-batch does not depend on
the buckets, so each micro-batch is fixed by (rows, longest sample) and the cost of a bucket tuple
is sum(rows x smallest bucket >= longest). Only the grid cell of the longest sample matters, so
the search is over which K of the M = max_length / 128 grid lengths to use, the last one fixed at
max_length. `bucket_cost` prices a tuple through `ShapePolicy.pad_length`; the recurrence below
is that rule (smallest bucket that fits) solved exactly, so a different pad rule needs its own
program. best[t][c] = the least cost of the cells 1..c with t buckets, the largest at c:

    best[1][c] = 128 c W(1..c)
    best[t][c] = min over p < c of best[t-1][p] + 128 c W(p+1..c)

where W(a..b) is the rows of the micro-batches whose longest sample lies in cells a..b. Only
cells that hold a longest sample can be optimal buckets, so c and p run over those m cells:
O(K m^2), whatever max_length (64 cells at 8192, 8192 at 1M, but m is the corpus's distinct
lengths on the grid).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdraft.config import BUCKET_QUANTUM, ShapePolicy
from specdraft.config.sampler_mode import SamplerMode, check_sampler_mode

from .accounting import plan_micro_batches
from .samplers import MicroBatch

# The samplers whose micro-batches do not depend on the buckets, so the DP is exact for them.
SUGGEST_SAMPLERS: tuple[SamplerMode, ...] = ("random", "length_grouped")


def grid_weights(
    lengths: Sequence[int], micro_batches: Sequence[MicroBatch], max_length: int
) -> list[int]:
    """Rows per 128-token cell: weights[c] = rows of micro-batches whose longest is in cell c."""
    cells = _cells(max_length)
    weights = [0] * (cells + 1)
    for batch in micro_batches:
        if not batch:
            continue
        longest = max(lengths[i] for i in batch)
        if longest > max_length:
            raise ValueError(
                f"a sample of {longest} tokens is longer than max_length = {max_length}; "
                f"truncate lengths to max_length first"
            )
        weights[max(1, -(-longest // BUCKET_QUANTUM))] += len(batch)
    return weights


def bucket_cost(buckets: Sequence[int], weights: Sequence[int]) -> int:
    """Computed positions of grid `weights` (from grid_weights) padded to `buckets`: each cell's
    rows at the length the shape policy pads the cell's top length to."""
    policy = ShapePolicy(pad_to=tuple(buckets))
    cost = 0
    for cell, rows in enumerate(weights):
        if not rows:
            continue
        if cell * BUCKET_QUANTUM > policy.lengths[-1]:
            raise ValueError(f"buckets {tuple(buckets)} do not cover the longest micro-batch")
        cost += rows * policy.pad_length(cell * BUCKET_QUANTUM)
    return cost


def optimal_buckets(weights: Sequence[int], k: int) -> tuple[int, ...]:
    """The k grid lengths (last = the top cell) that minimise bucket_cost for `weights`.

    Only cells that hold a micro-batch's longest sample (and the top cell) can be an optimal
    bucket: a bucket above an empty cell moves down to the fullest-below cell for less or the
    same cost. So the program runs over those m cells, O(k m^2) instead of O(k M^2) over the
    whole grid (at max_length 1M, M = 8192 cells but m is the corpus's distinct 128-token
    lengths). Buckets beyond m change nothing; the lowest unused cells fill them.
    """
    cells = len(weights) - 1
    if not 1 <= k <= cells:
        raise ValueError(
            f"cannot choose {k} distinct buckets among the {cells} multiples of "
            f"{BUCKET_QUANTUM} up to {cells * BUCKET_QUANTUM}; choose k in 1..{cells}"
        )
    prefix = [0] * (cells + 1)
    for c in range(1, cells + 1):
        prefix[c] = prefix[c - 1] + weights[c]
    places = [c for c in range(1, cells) if weights[c]] + [cells]
    m = len(places)
    used = min(k, m)
    inf = float("inf")
    best = [[inf] * m for _ in range(used + 1)]
    parent = [[0] * m for _ in range(used + 1)]
    for j, c in enumerate(places):
        best[1][j] = BUCKET_QUANTUM * c * prefix[c]
    for t in range(2, used + 1):
        for j in range(t - 1, m):
            size = BUCKET_QUANTUM * places[j]
            for i in range(t - 2, j):
                candidate = best[t - 1][i] + size * (prefix[places[j]] - prefix[places[i]])
                if candidate < best[t][j]:
                    best[t][j], parent[t][j] = candidate, i
    chosen, j = [], m - 1
    for t in range(used, 0, -1):
        chosen.append(places[j])
        j = parent[t][j]
    spare = (c for c in range(1, cells + 1) if c not in set(chosen))
    chosen += [next(spare) for _ in range(k - used)]
    return tuple(sorted(c * BUCKET_QUANTUM for c in chosen))


def suggest_buckets(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    max_length: int,
    k: int,
    sampler: SamplerMode = "random",
    seed: int = 0,
    mega_batch_multiplier: int = 50,
) -> tuple[int, ...]:
    """The k multiples of 128 (last = max_length) that minimise computed positions for `sampler`."""
    if check_sampler_mode(sampler) not in SUGGEST_SAMPLERS:
        raise ValueError(
            f"bucket suggestion needs micro-batches that do not depend on the buckets: sampler "
            f"must be one of {', '.join(SUGGEST_SAMPLERS)}, not {sampler!r}"
        )
    micro_batches = plan_micro_batches(
        lengths,
        micro_batch_size=micro_batch_size,
        sampler=sampler,
        seed=seed,
        mega_batch_multiplier=mega_batch_multiplier,
    )
    return optimal_buckets(grid_weights(lengths, micro_batches, max_length), k)


def _cells(max_length: int) -> int:
    if max_length <= 0 or max_length % BUCKET_QUANTUM:
        raise ValueError(
            f"max_length = {max_length} must be a positive multiple of {BUCKET_QUANTUM} to "
            f"suggest buckets: it is the last bucket"
        )
    return max_length // BUCKET_QUANTUM
