"""Bucket suggestion: the exact DP over the 128-token grid against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import account_padding, bucket_cost, optimal_buckets, suggest_buckets


def brute_force_cost(weights: list[int], k: int) -> int:
    cells = len(weights) - 1
    top = cells * 128
    return min(
        bucket_cost((*(c * 128 for c in lower), top), weights)
        for lower in itertools.combinations(range(1, cells), k - 1)
    )


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(0, 9), min_size=1, max_size=9).map(lambda w: [0, *w]),
    data=st.data(),
)
def test_dp_matches_brute_force_on_small_grids(weights: list[int], data: st.DataObject) -> None:
    cells = len(weights) - 1
    k = data.draw(st.integers(1, cells))
    buckets = optimal_buckets(weights, k)
    assert len(buckets) == k
    assert buckets[-1] == cells * 128
    assert list(buckets) == sorted(set(buckets))
    assert all(b % 128 == 0 for b in buckets)
    assert bucket_cost(buckets, weights) == brute_force_cost(weights, k)


@pytest.mark.parametrize("sampler", ["random", "length_grouped"])
@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 1024), min_size=1, max_size=60),
    size=st.integers(1, 3),
    k=st.integers(1, 4),
)
def test_suggestion_is_optimal_for_the_sampler_micro_batches(
    sampler: str, lengths: list[int], size: int, k: int
) -> None:
    suggested = suggest_buckets(
        lengths, micro_batch_size=size, max_length=1024, k=k, sampler=sampler
    )

    def cost(buckets: tuple[int, ...]) -> int:
        return account_padding(
            lengths, micro_batch_size=size, pad_to=buckets, sampler=sampler
        ).computed_positions

    best = min(
        cost((*lower, 1024)) for lower in itertools.combinations(range(128, 1024, 128), k - 1)
    )
    assert cost(suggested) == best


def test_bad_requests_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"choose k in 1\.\.4"):
        suggest_buckets([1], micro_batch_size=1, max_length=512, k=5)
    with pytest.raises(ValueError, match="multiple of 128"):
        suggest_buckets([1], micro_batch_size=1, max_length=500, k=1)
    with pytest.raises(ValueError, match="600 tokens is longer than max_length = 512"):
        suggest_buckets([600], micro_batch_size=1, max_length=512, k=1)
    with pytest.raises(ValueError, match="bucket_synchronized"):
        suggest_buckets([1], micro_batch_size=1, max_length=512, k=1, sampler="bucket_synchronized")
