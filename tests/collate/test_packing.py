"""Packing: next-fit rows, first-fit-decreasing, and the sampler's packed plans."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.collate import (
    MicroBatchSampler,
    pack_first_fit_decreasing,
    sampler_from_config,
    split_rows,
)
from specdraft.collate.samplers import SamplerStateMismatch
from specdraft.config import ShapePolicy, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"

lengths_and_capacity = st.integers(1, 300).flatmap(
    lambda capacity: st.tuples(st.lists(st.integers(0, capacity), max_size=80), st.just(capacity))
)


# ------------------------------------------------------------------------------- the packers


def test_split_rows_is_next_fit_in_the_given_order():
    assert split_rows([3, 3, 3, 5], 8) == [[0, 1], [2, 3]]
    # A later short document does not go back to an earlier row: next-fit, not first-fit.
    assert split_rows([5, 5, 3], 8) == [[0], [1, 2]]
    assert split_rows([8, 0, 1], 8) == [[0, 1], [2]]
    assert split_rows([], 8) == []


def test_ffd_fills_rows_longest_first():
    assert pack_first_fit_decreasing([3, 3, 3, 5, 2, 6], 8) == [[5, 4], [3, 0], [1, 2]]
    assert pack_first_fit_decreasing([], 8) == []


@pytest.mark.parametrize("pack", [split_rows, pack_first_fit_decreasing])
def test_a_document_longer_than_a_row_is_an_error(pack):
    with pytest.raises(ValueError, match="more than a row holds"):
        pack([3, 9], 8)
    with pytest.raises(ValueError, match="positive"):
        pack([3], 0)


@pytest.mark.parametrize("pack", [split_rows, pack_first_fit_decreasing])
@settings(max_examples=80, deadline=None)
@given(case=lengths_and_capacity)
def test_rows_partition_the_documents_and_fit(pack, case):
    lengths, capacity = case
    rows = pack(lengths, capacity)
    assert sorted(p for row in rows for p in row) == list(range(len(lengths)))
    assert all(row and sum(lengths[p] for p in row) <= capacity for row in rows)


@settings(max_examples=80, deadline=None)
@given(case=lengths_and_capacity)
def test_ffd_is_at_least_as_good_as_next_fit_and_near_the_bound(case):
    lengths, capacity = case
    ffd = pack_first_fit_decreasing(lengths, capacity)
    assert len(ffd) <= len(split_rows(lengths, capacity))
    # Every two FFD rows hold more than a row's worth (else the second would have fitted).
    assert len(ffd) <= max(1, 2 * -(-sum(lengths) // capacity)) or not lengths


@settings(max_examples=80, deadline=None)
@given(case=lengths_and_capacity, data=st.data())
def test_next_fit_over_concatenated_rows_needs_no_more_rows(case, data):
    # The plan lists rows one after another; the collator must never get more rows back.
    lengths, capacity = case
    groups = pack_first_fit_decreasing(lengths, capacity)
    groups = data.draw(st.permutations(groups))
    flat = [lengths[p] for group in groups for p in group]
    assert len(split_rows(flat, capacity)) <= len(groups)


# ------------------------------------------------------------------------------- the sampler

sizes = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(1, 1024), min_size=0, max_size=150),
        "micro_batch_size": st.integers(1, 4),
        "grad_accum_steps": st.integers(1, 4),
        "num_replicas": st.integers(1, 4),
        "mega_batch_multiplier": st.integers(1, 3),
        "capacity": st.sampled_from([1024, 2048]),
        "buckets": st.booleans(),  # shape buckets below the capacity: short rows go last
        "seed": st.integers(0, 2**31),
        "epoch": st.integers(0, 3),
    }
)


def make(case: dict, rank: int = 0, **changes) -> MicroBatchSampler:
    case = {**case, **changes}
    return MicroBatchSampler(
        case["lengths"],
        micro_batch_size=case["micro_batch_size"],
        grad_accum_steps=case["grad_accum_steps"],
        num_replicas=case["num_replicas"],
        rank=rank,
        seed=case["seed"],
        mega_batch_multiplier=case["mega_batch_multiplier"],
        pad_to=ShapePolicy(
            pad_to=(256, 512, case["capacity"]) if case.get("buckets") else case["capacity"],
            packing=True,
        ),
    )


@settings(max_examples=60, deadline=None)
@given(case=sizes)
def test_packed_plan_sees_every_sample_once_with_equal_counts(case):
    plan = make(case).epoch_plan(case["epoch"])
    seen = sorted(i for rank in plan for batch in rank for i in batch)
    assert seen == list(range(len(case["lengths"])))
    counts = {len(rank) for rank in plan}
    assert len(plan) == case["num_replicas"] and len(counts) == 1
    assert counts.pop() % case["grad_accum_steps"] == 0


@settings(max_examples=60, deadline=None)
@given(case=sizes)
def test_every_packed_micro_batch_splits_into_at_most_micro_batch_size_full_rows(case):
    lengths, capacity = case["lengths"], case["capacity"]
    for rank in make(case).epoch_plan(case["epoch"]):
        for batch in rank:
            rows = split_rows([lengths[i] for i in batch], capacity)
            assert len(rows) <= case["micro_batch_size"]
            assert all(sum(lengths[batch[p]] for p in row) <= capacity for row in rows)


@settings(max_examples=40, deadline=None)
@given(case=sizes)
def test_packed_plan_is_identical_on_every_rank_and_deterministic(case):
    plans = [make(case, rank=r).epoch_plan(case["epoch"]) for r in range(case["num_replicas"])]
    assert all(plan == plans[0] for plan in plans)
    assert make(case).epoch_plan(case["epoch"]) == plans[0]
    for r in range(case["num_replicas"]):
        sampler = make(case, rank=r)
        sampler.set_epoch(case["epoch"])
        assert list(sampler) == plans[0][r]


@settings(max_examples=40, deadline=None)
@given(case=sizes)
def test_empty_micro_batches_only_at_the_end(case):
    plan = make(case).epoch_plan(case["epoch"])
    steps = list(zip(*plan, strict=True))
    flat = [batch for step in steps for batch in step]
    first_empty = next((k for k, batch in enumerate(flat) if not batch), len(flat))
    assert all(not batch for batch in flat[first_empty:])


def test_packed_rows_are_full_and_the_order_random():
    lengths = [(97 * i) % 900 + 20 for i in range(600)]
    case = {
        "lengths": lengths,
        "micro_batch_size": 2,
        "grad_accum_steps": 2,
        "num_replicas": 2,
        "mega_batch_multiplier": 4,
        "capacity": 2048,
        "seed": 3,
        "epoch": 0,
    }
    plan = make(case).epoch_plan(0)
    rows = [
        [batch[p] for p in row]
        for rank in plan
        for batch in rank
        for row in split_rows([lengths[i] for i in batch], 2048)
    ]
    fill = sum(lengths) / (len(rows) * 2048)
    assert fill > 0.97, fill
    # Two seeds, and two epochs, give other plans; the same seed and epoch the same one.
    assert make(case, seed=4).epoch_plan(0) != plan
    assert make(case).epoch_plan(1) != plan
    assert make(case).epoch_plan(0) == plan
    # Rows are shuffled: not sorted by their longest document.
    longest = [max(lengths[i] for i in row) for row in rows]
    assert longest != sorted(longest, reverse=True)


def test_documents_longer_than_a_row_count_as_truncated():
    sampler = MicroBatchSampler(
        [5000, 10, 1000],
        micro_batch_size=1,
        grad_accum_steps=1,
        pad_to=ShapePolicy(pad_to=2048, packing=True),
    )
    plan = sampler.epoch_plan(0)
    assert sorted(i for batch in plan[0] for i in batch) == [0, 1, 2]
    assert len(plan[0]) == 2


def test_packing_needs_a_row_capacity():
    with pytest.raises(ValueError, match="row capacity"):
        MicroBatchSampler([1, 2], micro_batch_size=1, grad_accum_steps=1, mode="packed")
    sampler = MicroBatchSampler(
        [1, 2], micro_batch_size=1, grad_accum_steps=1, mode="packed", row_capacity=4
    )
    assert sampler.row_capacity == 4 and len(sampler) == 1


def test_resume_continues_a_packed_plan_and_refuses_a_changed_packing():
    case = {
        "lengths": [(31 * i) % 700 + 5 for i in range(300)],
        "micro_batch_size": 2,
        "grad_accum_steps": 2,
        "num_replicas": 1,
        "mega_batch_multiplier": 2,
        "capacity": 1024,
        "seed": 1,
        "epoch": 0,
    }
    sampler = make(case)
    whole = list(sampler)
    sampler = make(case)
    taken = [batch for _, batch in zip(range(3), sampler, strict=False)]
    state = sampler.state_dict()
    assert state["packing"] is True
    resumed = make(case)
    resumed.load_state_dict(state)
    assert taken + list(resumed) == whole

    unpacked = MicroBatchSampler(
        case["lengths"],
        micro_batch_size=2,
        grad_accum_steps=2,
        seed=1,
        pad_to=1024,
        mega_batch_multiplier=2,
    )
    with pytest.raises(SamplerStateMismatch) as refused:
        unpacked.load_state_dict(state)
    assert refused.value.fields == ["training.packing"]
    # A checkpoint from before packing existed had an unpacked plan: packing now is refused too.
    old = {k: v for k, v in unpacked.state_dict().items() if k != "packing"}
    with pytest.raises(SamplerStateMismatch, match=r"training\.packing"):
        make(case).load_state_dict(old)
    unpacked.load_state_dict(old)


def test_sampler_from_config_packs_when_the_config_says_so():
    config = load_config(EXAMPLE, ("training.packing=true", "training.micro_batch_size=2"))
    shapes = ShapePolicy.from_config(config)
    lengths = [(37 * i) % 2048 + 1 for i in range(300)]
    samplers = [
        sampler_from_config(config, lengths, num_replicas=2, rank=r, shapes=shapes)
        for r in range(2)
    ]
    assert all(s.mode == "packed" and s.row_capacity == config.data.max_length for s in samplers)
    plans = [list(s) for s in samplers]
    assert sorted(i for plan in plans for batch in plan for i in batch) == list(range(300))
    assert max(len(batch) for plan in plans for batch in plan) > 2  # several docs per row
    off = load_config(EXAMPLE, ("training.micro_batch_size=2",))
    plain = sampler_from_config(
        off, lengths, num_replicas=2, rank=0, shapes=ShapePolicy.from_config(off)
    )
    assert plain.mode != "packed" and max(len(batch) for batch in plain) == 2


def test_rows_that_fit_a_smaller_bucket_share_micro_batches():
    from specdraft.collate.packing import packed_micro_batches

    # Windows of 2 rows' worth of tokens: [2048, 300, 2048] then [300]; each ends in a short row.
    lengths = [2048, 300, 2048, 300]
    policy = ShapePolicy.from_parts(
        static_shapes=True, max_length=2048, buckets=[512], packing=True
    )
    assert policy.pad_length(600) == 2048 and policy.pad_length(300) == 512
    common = {"capacity": 2048, "micro_batch_size": 2, "window_rows": 2}
    for seed in range(8):
        batches = packed_micro_batches(
            range(4), lengths, seed=seed, pads_short=lambda n: policy.pad_length(n) < 2048, **common
        )
        assert batches[-1] == [1, 3]  # the two short rows together: this micro-batch pads to 512
