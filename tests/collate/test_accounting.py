"""Padding accounting: real tokens, computed positions and per-bucket counts of a pad policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import account_padding, plan_micro_batches, resolve_static_length

BUCKETS = (256, 512, 1024)
lengths_st = st.lists(st.integers(1, 1024), min_size=1, max_size=80)


def test_one_sample_per_micro_batch_costs_each_sample_its_own_bucket() -> None:
    lengths = [3, 256, 257, 600, 1024]
    report = account_padding(lengths, micro_batch_size=1, pad_to=BUCKETS)
    assert report.real_tokens == sum(lengths)
    assert report.computed_positions == 256 + 256 + 512 + 1024 + 1024
    by_length = {b.length: b for b in report.per_bucket}
    assert [by_length[b].micro_batches for b in BUCKETS] == [2, 1, 2]
    assert by_length[512].mean_real_tokens == 257
    assert by_length[512].padding_share == pytest.approx(1 - 257 / 512)


@pytest.mark.parametrize("sampler", ["random", "length_grouped", "bucket_synchronized"])
@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, size=st.integers(1, 4), replicas=st.integers(1, 3))
def test_computed_positions_match_the_sampler_micro_batches(
    sampler: str, lengths: list[int], size: int, replicas: int
) -> None:
    report = account_padding(
        lengths, micro_batch_size=size, pad_to=BUCKETS, sampler=sampler, num_replicas=replicas
    )
    batches = plan_micro_batches(
        lengths, micro_batch_size=size, sampler=sampler, num_replicas=replicas, pad_to=BUCKETS
    )
    expected = sum(
        len(b) * resolve_static_length(max(lengths[i] for i in b), BUCKETS) for b in batches
    )
    assert report.computed_positions == expected
    assert report.real_tokens == sum(lengths)
    assert sum(b.micro_batches for b in report.per_bucket) == report.micro_batches == len(batches)
    assert sum(b.share for b in report.per_bucket) == pytest.approx(1.0)
    assert sum(b.computed_positions for b in report.per_bucket) == report.computed_positions


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, size=st.integers(1, 4))
def test_buckets_sit_between_pad_to_longest_and_the_fixed_length(
    lengths: list[int], size: int
) -> None:
    costs = [
        account_padding(lengths, micro_batch_size=size, pad_to=p).computed_positions
        for p in (None, BUCKETS, BUCKETS[-1])
    ]
    assert costs == sorted(costs)
    assert costs[2] == len(lengths) * BUCKETS[-1]


def test_pad_to_longest_has_no_bucket_table_and_single_samples_have_no_padding() -> None:
    report = account_padding([5, 70, 9], micro_batch_size=1, pad_to=None)
    assert report.per_bucket == ()
    assert report.positions_per_real_token == 1.0


def test_unused_buckets_are_listed_with_zero_micro_batches() -> None:
    report = account_padding([1000, 1001], micro_batch_size=2, pad_to=BUCKETS)
    assert [(b.length, b.micro_batches) for b in report.per_bucket] == [
        (256, 0),
        (512, 0),
        (1024, 1),
    ]


def test_unknown_sampler_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown sampler 'sorted'"):
        account_padding([1], micro_batch_size=1, pad_to=None, sampler="sorted")
