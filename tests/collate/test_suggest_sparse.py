"""Bucket suggestion runs over the grid cells that hold a micro-batch's longest sample only: the
same least cost as the full-grid program on any weights, and `--suggest 64` at max_length 1M
ends in seconds (it ran for minutes over 8192 cells)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate.suggest import bucket_cost, optimal_buckets, suggest_buckets


def full_grid_cost(weights: list[int], k: int) -> int:
    """The least cost over every k-subset of the grid (last = top cell), by the full program."""
    cells = len(weights) - 1
    prefix = [0]
    for c in range(1, cells + 1):
        prefix.append(prefix[-1] + weights[c])
    best = [[float("inf")] * (cells + 1) for _ in range(k + 1)]
    for c in range(1, cells + 1):
        best[1][c] = 128 * c * prefix[c]
    for t in range(2, k + 1):
        for c in range(t, cells + 1):
            for p in range(t - 1, c):
                best[t][c] = min(best[t][c], best[t - 1][p] + 128 * c * (prefix[c] - prefix[p]))
    return int(best[k][cells])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.just(0), st.integers(0, 9)), min_size=1, max_size=24), st.data())
def test_the_sparse_program_finds_the_full_grid_optimum(cells, data):
    weights = [0, *cells]
    k = data.draw(st.integers(1, len(cells)))
    buckets = optimal_buckets(weights, k)
    assert len(buckets) == k and list(buckets) == sorted(set(buckets))
    assert buckets[-1] == 128 * len(cells)
    assert bucket_cost(buckets, weights) == full_grid_cost(weights, k)


@pytest.mark.timeout(120)
def test_sixty_four_buckets_at_a_million_tokens_are_quick():
    rng = random.Random(0)
    lengths = [min(2**20, int(rng.lognormvariate(8, 1.5))) for _ in range(4000)]
    buckets = suggest_buckets(lengths, micro_batch_size=4, max_length=2**20, k=64)
    assert len(buckets) == 64 and buckets[-1] == 2**20
